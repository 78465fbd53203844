"""GPU memory of a SEAL step for Qwen2.5 1.5B / 3B / 7B shapes on 8k and 16k-token trajectories.

Two parts:

* an **estimate**, computed from the model shapes (always printed; it needs no GPU). It is arithmetic, not a
  measurement: weights, LoRA + AdamW state, checkpointed activations, one layer's recompute, the log-prob
  chunk and the KV cache of the batched rollouts;
* a **measurement** (``--measure``, needs CUDA): random-init models of the real shapes (initialised on the GPU,
  with a tokenizer built locally: no hub, no download), loaded through seal-lite's own policy loader (Unsloth
  4-bit QLoRA where installed, else ``--backend``), GRPO updates through seal-lite's trainer with the recipes'
  micro-batching (4 mini-batches; a micro-batch is the part of one group in a mini-batch, its prompt computed
  once by the shared-prefix pass, or one trajectory on Unsloth) on synthetic multi-turn trajectories of the given
  length (one task's G trajectories: a shared prompt, then model segments interleaved with environment segments,
  env_mask as in a rollout), and a batched generation that fills the KV cache. ``--cap-gb`` limits the process to a target
  card's memory (15 for a T4, 24), so a row that does not fit fails as it would there; caches are emptied
  between rows. It prints peak memory and seconds per update (``--json``: one JSON line per row).
  ``--measure --tiny`` runs the same code on a 2-layer model on the CPU: a smoke test, not a figure.

    python benchmarks/gpu_memory.py                       # the estimate table
    python benchmarks/gpu_memory.py --measure --shapes 3b --tokens 16384 --cap-gb 15 --json   # on a GPU
    python benchmarks/gpu_memory.py --measure --tiny      # CPU smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time

from seal_lite.core.memory import KNOWN_SHAPES, Shape
from seal_lite.runs.toy_model import random_model_dir

GB = 1024**3


# Qwen2.5-*-Instruct configurations (config.json of each model)
SHAPES = {
    "1.5b": Shape(28, 1536, 8960, 12, 2, 128, 151936, True),
    "3b": KNOWN_SHAPES["Qwen/Qwen2.5-3B-Instruct"],
    "7b": KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"],
}
TINY = Shape(2, 64, 128, 4, 2, 16, 8192, True)  # --tiny: a 2-layer model, a smoke test


def estimate(shape: Shape, tokens: int, rollouts: int, rank: int = 16, chunk: int = 1024) -> dict[str, float]:
    """GB per component for one GRPO micro-batch of one ``tokens``-long trajectory (4-bit QLoRA, bf16 compute,
    gradient checkpointing) and a batched rollout of ``rollouts`` trajectories of that length.

    The training step and the rollouts do not overlap in time; the peak is the larger of the two plus the
    memory both hold (weights, LoRA state, the CUDA context).
    """
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)
    shared = {
        "weights (4-bit blocks + bf16 embeddings)": (shape.linear_params() * 0.5 * 1.06 + embeddings * 2) / GB,
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
    rows = [(name, tokens, estimate(shape, tokens, rollouts)) for name, shape in SHAPES.items() for tokens in (8192, 16384)]
    print(f"{'component (GB)':44s}" + "".join(f"{name:>7s}@{t // 1024}k" for name, t, _ in rows))
    for name in rows[0][2]:
        print(f"{name:44s}" + "".join(f"{e[name]:11.2f}" for _, _, e in rows))


def synthetic_batch(tokens: int, rollouts: int, vocab: int, seed: int = 0):
    """Multi-turn trajectories of one task: a shared 3k-token prompt (tool docs), then 150-token model messages
    alternating with 450-token environment messages (tool results, next user turn) up to ``tokens``; advantages
    +1/-1."""
    import torch

    from seal_lite.core.types import RolloutBatch

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
    shared = torch.randint(0, vocab, (prompt,), generator=generator).tolist()  # one task: one prompt
    return RolloutBatch(
        prompt_ids=[list(shared) for _ in masks],
        completion_ids=[torch.randint(0, vocab, (len(m),), generator=generator).tolist() for m in masks],
        env_mask=masks,
        rewards=[float(i % 2) for i in range(rollouts)],
        advantages=[1.0 if i % 2 else -1.0 for i in range(rollouts)],
    )


def measure(shape: Shape, tokens: int, rollouts: int, backend: str = "auto", micro: int | None = None) -> dict:
    """Peak memory and seconds of GRPO updates and of a batched generation for one shape and length."""
    import torch

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.policy import load_policy

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as directory:
        random_model_dir(shape, directory)
        recipe = load_recipe(None, {
            "policy.model": directory, "policy.backend": backend, "policy.lora_r": 16, "policy.lora_alpha": 32,
            "policy.gradient_checkpointing": True,
            "rollout.num_generations": rollouts, "rollout.max_context_tokens": tokens, "grpo.tasks_per_step": 1,
            "grpo.steps": 2, "grpo.mini_batches": math.gcd(4, rollouts), "grpo.micro_batch_size": micro,
            "diagnoser.mode": "off", "data.task_ids": ["task"],
        })
        policy = load_policy(directory, recipe)
        from seal_lite.training.grpo import build_trainer  # after the policy: Unsloth patches trl on import

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
        _empty_caches()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        prompt = torch.tensor([row[: tokens - 32] for row in (p + c for p, c in
                               zip(batch.prompt_ids, batch.completion_ids))], device=model.device)
        started = time.time()
        with torch.no_grad(), policy.generation_mode(model):
            model.generate(input_ids=prompt, max_new_tokens=32, min_new_tokens=32, do_sample=True,
                           pad_token_id=policy.tokenizer.pad_token_id)
        generate_s = time.time() - started
        generate_peak = torch.cuda.max_memory_allocated() / GB if cuda else float("nan")
        figures = {"tokens": tokens, "rollouts": rollouts, "backend": policy.backend,
                   "micro_batch": trainer.args.per_device_train_batch_size, "updates": len(timings), "train_peak_gb": train_peak,
                   "generate_peak_gb": generate_peak, "update_s": timings[-1] if timings else float("nan"),
                   "generate_s": generate_s}
        del trainer, model, policy
    _empty_caches()
    return figures


def _empty_caches() -> None:
    """Free what a row left behind, so the next row's peak is its own."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cap_memory(gb: float) -> None:
    """Let this process allocate at most ``gb`` of GPU memory (a T4's 15 GB, a 24 GB card's) on a larger GPU."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gb * GB / total), 0)


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
    parser.add_argument("--backend", default="auto", choices=["auto", "unsloth", "peft-4bit", "peft"])
    parser.add_argument("--micro-batch", type=int, default=None, help="trajectories per forward/backward pass "
                        "(default: the recipes' one)")
    parser.add_argument("--cap-gb", type=float, default=None, help="GPU memory this process may use, e.g. 15 (T4)")
    parser.add_argument("--json", action="store_true", help="one JSON line per measured row, no tables")
    args = parser.parse_args()
    if not args.json:
        print_estimates(args.rollouts)
    if not args.measure:
        return
    if args.cap_gb:
        cap_memory(args.cap_gb)
    if not args.json:
        print("\nMEASURED: shape, tokens, backend, train peak GB, generate peak GB, s/update, s/generate")
    failed = False
    for name in args.shapes.split(","):
        shape = TINY if args.tiny else SHAPES[name]
        name = f"tiny-{name}" if args.tiny else f"Qwen2.5-{name.upper()}"
        for tokens in (int(t) for t in args.tokens.split(",")):
            tokens, rollouts = (1024, min(args.rollouts, 2)) if args.tiny else (tokens, args.rollouts)
            row = {"check": "gpu_memory", "shape": name, "tokens": tokens, "cap_gb": args.cap_gb}
            started = time.time()
            try:
                row |= measure(shape, tokens, rollouts, args.backend, args.micro_batch) | {"ok": True}
                row["estimate_peak_gb"] = None if args.tiny else round(estimate(shape, tokens, rollouts)["peak"], 2)
            except Exception as error:  # a row that does not fit the cap is a result, not the end of the run
                row |= {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
                failed = True
                _empty_caches()
            row["seconds"] = round(time.time() - started, 1)
            if args.json:  # strict JSON: no NaN (the CPU has no GPU peak)
                print(json.dumps({key: None if isinstance(value, float) and math.isnan(value) else value
                                  for key, value in row.items()}), flush=True)
            elif row["ok"]:
                print(f"{name:14s} {tokens:6d} {row['backend']:9s} {row['train_peak_gb']:7.2f} "
                      f"{row['generate_peak_gb']:7.2f} {row['update_s']:8.1f} {row['generate_s']:8.1f}", flush=True)
            else:
                print(f"{name:14s} {tokens:6d} FAILED {row['error']}", flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
