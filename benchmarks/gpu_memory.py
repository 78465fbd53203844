"""GPU memory of a SEAL step for Qwen2.5 1.5B / 3B / 7B shapes on 8k and 16k-token trajectories.

Two parts:

* an **estimate**, computed from the model shapes (always printed; it needs no GPU). It is arithmetic, not a
  measurement: weights, LoRA + AdamW state, checkpointed activations, one layer's recompute, the log-prob
  chunk and the KV cache of the batched rollouts;
* a **measurement** (``--measure``, needs CUDA): random-init models of the real shapes, loaded through
  seal-lite's own policy loader (Unsloth 4-bit QLoRA where installed), one real GRPO update through
  seal-lite's trainer on synthetic multi-turn trajectories of the given length (model segments interleaved
  with environment segments, env_mask as in a rollout), and a batched generation that fills the KV cache.
  It prints peak memory and seconds per update. ``--measure --tiny`` runs the same code on a 2-layer model on
  the CPU: a smoke test of the script, not a figure.

    python benchmarks/gpu_memory.py                       # the estimate table
    python benchmarks/gpu_memory.py --measure             # on a GPU machine
    python benchmarks/gpu_memory.py --measure --tiny      # CPU smoke test
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass

GB = 1024**3


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def block_params(self) -> int:
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * self.hidden * 2 + self.hidden * kv * 2
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def lora_params(self, rank: int) -> int:
        kv = self.kv_heads * self.head_dim
        pairs = [(self.hidden, self.hidden)] * 2 + [(self.hidden, kv)] * 2 + [(self.hidden, self.intermediate)] * 3
        return self.layers * rank * sum(a + b for a, b in pairs)


# Qwen2.5-*-Instruct configurations (config.json of each model)
SHAPES = {
    "1.5b": Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, True),
    "3b": Shape("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151936, True),
    "7b": Shape("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, False),
}


def estimate(shape: Shape, tokens: int, rollouts: int, rank: int = 16, chunk: int = 1024) -> dict[str, float]:
    """GB per component for one GRPO micro-batch of one ``tokens``-long trajectory (4-bit QLoRA, bf16 compute,
    gradient checkpointing) and a batched rollout of ``rollouts`` trajectories of that length.

    The training step and the rollouts do not overlap in time; the peak is the larger of the two plus the
    memory both hold (weights, LoRA state, the CUDA context).
    """
    shared = {
        "weights (4-bit blocks + bf16 embeddings)": (shape.block_params() * 0.5 * 1.06 + shape.embedding_params() * 2) / GB,
        "LoRA params + grads + AdamW (fp32)": shape.lora_params(rank) * 16 / GB,
        "CUDA context + allocator slack": 0.8,
    }
    train = {
        "checkpointed layer inputs (bf16)": tokens * shape.hidden * 2 * shape.layers / GB,
        "one layer recomputed (MLP dominates)": tokens * (3 * shape.intermediate + 4 * shape.hidden) * 2 / GB,
        # log-probs in chunks of `chunk` tokens: fp32 logits and their gradient for one chunk
        "log-prob chunk (fp32 logits + grad)": chunk * shape.vocab * 4 * 2 / GB,
    }
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    generate = {"KV cache of the batched rollouts (bf16)": rollouts * tokens * kv_per_token / GB}
    peak = sum(shared.values()) + max(sum(train.values()), sum(generate.values()))
    # transformers + bitsandbytes (no Unsloth): TRL 1.14.2 takes the whole completion's bf16 logits from the
    # forward pass and keeps a log-softmax of the same size for the backward pass, instead of the chunk
    full_logits = tokens * shape.vocab * 2 * 2 / GB - train["log-prob chunk (fp32 logits + grad)"]
    fallback = sum(shared.values()) + max(sum(train.values()) + full_logits, sum(generate.values()))
    return shared | train | generate | {"peak": peak, "peak without Unsloth (full logits)": fallback}


def print_estimates(rollouts: int) -> None:
    print(f"ESTIMATE (arithmetic from the shapes, not a measurement): 4-bit QLoRA r=16, bf16, gradient "
          f"checkpointing, log-probs in 1k-token chunks, {rollouts} rollouts generated together\n")
    rows = [(shape, tokens, estimate(shape, tokens, rollouts)) for shape in SHAPES.values() for tokens in (8192, 16384)]
    print(f"{'component (GB)':44s}" + "".join(f"{s.name[8:]:>7s}@{t // 1024}k" for s, t, _ in rows))
    for name in rows[0][2]:
        print(f"{name:44s}" + "".join(f"{e[name]:11.2f}" for _, _, e in rows))


def synthetic_batch(tokens: int, rollouts: int, vocab: int, seed: int = 0):
    """Multi-turn trajectories: a 3k-token prompt (tool docs), then 150-token model messages alternating with
    450-token environment messages (tool results, next user turn) up to ``tokens``; advantages +1/-1."""
    import torch

    from seal_lite.loop import RolloutBatch

    generator = torch.Generator().manual_seed(seed)
    prompt = min(3072, tokens // 4)
    masks = []
    for _ in range(rollouts):
        mask = []
        while len(mask) < tokens - prompt:
            mask += [1] * 150 + [0] * 450
        mask = mask[: tokens - prompt]
        while mask and mask[-1] == 0:  # a completion ends with the model's last token
            mask.pop()
        masks.append(mask)
    ids = [torch.randint(0, vocab, (prompt + len(m),), generator=generator).tolist() for m in masks]
    return RolloutBatch(
        prompt_ids=[row[:prompt] for row in ids],
        completion_ids=[row[prompt:] for row in ids],
        env_mask=masks,
        rewards=[float(i % 2) for i in range(rollouts)],
        advantages=[1.0 if i % 2 else -1.0 for i in range(rollouts)],
    )


def measure(shape: Shape, tokens: int, rollouts: int, tiny: bool) -> dict[str, float]:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from seal_lite.models import resolve_model
    from seal_lite.recipe import load_recipe
    from seal_lite.training.policy import load_policy

    cuda = torch.cuda.is_available()
    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate,
        tie_word_embeddings=shape.tied, max_position_embeddings=32768,
    )
    with tempfile.TemporaryDirectory() as directory:
        Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
        # any tokenizer works: ids are synthetic; SmolLM2's ships with the project
        AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).save_pretrained(directory)
        recipe = load_recipe(None, {
            "policy.model": directory, "policy.lora_r": 16, "policy.lora_alpha": 32,
            "rollout.num_generations": rollouts, "rollout.max_context_tokens": tokens, "grpo.tasks_per_step": 1,
            "grpo.steps": 2, "grpo.mini_batches": rollouts, "diagnoser.mode": "off", "data.task_ids": ["task"],
        })
        policy = load_policy(directory, recipe)
        from seal_lite.training.grpo import build_trainer

        batch = synthetic_batch(tokens, rollouts, min(shape.vocab, len(policy.tokenizer)))
        trainer = build_trainer(policy, recipe, ["task"], lambda prompts: batch, directory + "/trl")
        trainer.args.save_strategy = "no"
        timings = []
        trainer.add_callback(_timer(timings))
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        train_peak = torch.cuda.max_memory_allocated() / GB if cuda else float("nan")
        # the rollout side: prefill + 32 new tokens for all trajectories at once fills the KV cache
        model = trainer.model
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        prompt = torch.tensor([row[: tokens - 32] for row in (p + c for p, c in
                               zip(batch.prompt_ids, batch.completion_ids))], device=model.device)
        started = time.time()
        with torch.no_grad():
            model.generate(input_ids=prompt, max_new_tokens=32, min_new_tokens=32, do_sample=True,
                           pad_token_id=policy.tokenizer.pad_token_id)
        generate_s = time.time() - started
        generate_peak = torch.cuda.max_memory_allocated() / GB if cuda else float("nan")
    return {"backend": policy.backend, "train_peak_gb": train_peak, "generate_peak_gb": generate_peak,
            "update_s": timings[-1] if timings else float("nan"), "generate_s": generate_s}


def _timer(timings: list[float]):
    """A callback appending the seconds of each optimizer step (the last is steady: the first compiles)."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            timings.append(time.time() - self.started)

    return Timer()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=8, help="trajectories generated together (G x tasks)")
    parser.add_argument("--measure", action="store_true", help="also measure (CUDA; or --tiny on the CPU)")
    parser.add_argument("--tiny", action="store_true", help="measure a 2-layer model instead (a smoke test)")
    parser.add_argument("--shapes", default="1.5b,3b,7b")
    parser.add_argument("--tokens", default="8192,16384")
    args = parser.parse_args()
    print_estimates(args.rollouts)
    if not args.measure:
        return
    print("\nMEASURED: shape, tokens, backend, train peak GB, generate peak GB, s/update, s/generate")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        if args.tiny:
            shape = Shape(f"tiny-{name}", 64, 2, 4, 2, 128, 4096, shape.tied)
        for tokens in (int(t) for t in args.tokens.split(",")):
            figures = measure(shape, tokens if not args.tiny else 1024, min(args.rollouts, 2) if args.tiny
                              else args.rollouts, args.tiny)
            print(f"{shape.name:14s} {tokens:6d} {figures['backend']:9s} {figures['train_peak_gb']:7.2f} "
                  f"{figures['generate_peak_gb']:7.2f} {figures['update_s']:8.1f} {figures['generate_s']:8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
