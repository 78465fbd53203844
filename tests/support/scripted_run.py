"""Scripted policies for tests and benchmarks that run a real ``seal-lite run`` process with a tiny random model.

A random policy never passes a BFCL task, so every GRPO advantage would be 0 and the update a no-op. The harnesses
of tests/real/test_resume.py, tests/real/test_distributed.py and benchmarks/kill_resume.py therefore route each
message the transformers engine generates through a script that may answer with the task's ground truth instead:
groups then mix rewards 1 and 0, and the LoRA weights and optimizer moments really change. Their recipes name
``rollout.backend: transformers`` (on a CPU, auto would pick the paged engine for their tiny model).

The patch replaces module globals of seal_lite (``algorithm.rollout_groups``, ``screen.rollout_groups``,
``evaluate_bfcl.rollout_groups``, ``TransformersGenerator.generate``): a rename there breaks these harnesses, which is
why this is test scaffolding and not part of the package. The harness process imports it after putting the
repository root on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable


def ground_truth_ids(tokenizer, task) -> list[int]:
    """The task's first-turn ground truth as a model would write it, with the end-of-sequence token."""
    text = "[" + ", ".join(task.ground_truth[0]) + "]"
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def script_generation(answer: Callable, sample: bool = True) -> None:
    """Patch ``TransformersGenerator.generate``: each message becomes ``answer(tokenizer, task, index, sampled)``
    (token ids), where ``task`` is the task whose first user message is in the context, ``index`` counts that task's
    messages in the batch, and ``sampled`` is what the model generated (None with ``sample=False``: the model is not
    run, so a batch's answers do not depend on what else is in the batch)."""
    from seal_lite.engines import transformers_generate
    from seal_lite.runs import evaluate_bfcl
    from seal_lite.step import algorithm, screen
    rollout_groups, generate, playing = algorithm.rollout_groups, transformers_generate.TransformersGenerator.generate, {}

    def recording_rollout_groups(pairs, *args, **kwargs):  # a step's, a screen's or a validation's
        playing["tasks"] = [task for task, _ in pairs]
        return rollout_groups(pairs, *args, **kwargs)

    def scripted(self, batch, max_new_tokens, temperature):
        sampled = generate(self, batch, max_new_tokens, temperature) if sample else [None] * len(batch)
        answers, seen = [], {}
        for context, ids in zip(batch, sampled):
            task = next(t for t in playing["tasks"] if t.user_message(0) in self.tokenizer.decode(context))
            index = seen[task.id] = seen.get(task.id, -1) + 1
            answers.append(answer(self.tokenizer, task, index, ids))
        return answers

    algorithm.rollout_groups, transformers_generate.TransformersGenerator.generate = recording_rollout_groups, scripted
    screen.rollout_groups = evaluate_bfcl.rollout_groups = recording_rollout_groups  # validation plays through eval


def sometimes_right(tokenizer, task, index, sampled) -> list[int]:
    """The ground truth with probability 1/2, drawn from torch's RNG after the model generated (so an exact replay
    after a resume needs the restored RNG), else the model's own message."""
    import torch

    return ground_truth_ids(tokenizer, task) if torch.rand(()) < 0.5 else sampled
