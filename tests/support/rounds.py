"""A llama.cpp engine played in rounds, as before continuous batching: every message of a round waits for the
round's longest. The test of continuous play and benchmarks/llamacpp_batching.py compare against it."""


class Rounds:
    """``engine`` without ``generate_continuously``: the driver (seal_lite/step/rollout.py) then plays rounds."""

    def __init__(self, engine):
        self.engine, self.tokenizer = engine, engine.tokenizer

    def generate(self, *args):
        out = self.engine.generate(*args)
        self.sampled_logprobs = self.engine.sampled_logprobs
        return out

    def __getattr__(self, name):  # reseed, load_adapter, close
        if name == "generate_continuously":
            raise AttributeError(name)
        return getattr(self.engine, name)
