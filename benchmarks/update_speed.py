"""The policy update with each group's prompt computed once (grpo.shared_prefix) against one pass per trajectory.

The same batch is updated both ways in one run: one SEAL step of one task with G trajectories through seal-lite's
own trainer (TRL's loss, the reference pass for the KL term, gradient checkpointing as the CPU recipe has it),
once with ``grpo.shared_prefix: false`` (TRL's forward pass per trajectory, one trajectory per micro-batch) and
once with it on (the default: one group per micro-batch, its prompt computed once). Each way runs in a fresh
process, so its peak resident memory (RSS, the model included) is its own; by default blocks of 64 KiB and more are
mmap'ed (``MALLOC_MMAP_THRESHOLD_``), so RSS follows the memory the update holds, not what glibc's heap keeps
cached after freeing it.

The batch is a real task's opening under the official view (BFCL's JSON tool docs: ~5,000 tokens for Qwen's
tokenizer on multi_turn_base_2, about the mean over all 800 entries), followed by G completions of a few hundred
tokens each: three model messages with two environment messages (tool results, the next user turn) between
them, env_mask as in a rollout, token ids drawn at random (the cost does not depend on them), rewards 1 0 0 0 ...
and diagnosis weights that differ, so the advantages are not uniform. Gradient clipping is off so the raw LoRA
gradients are compared.

Prints, per G, the seconds of the update (trainer.train() for the step: TRL's reference pass, the loss's forward
and backward passes, the optimizer step), wall and CPU (the process's own: on a machine that other processes
keep busy, wall time measures them too; the speedup is the ratio of CPU seconds, and the wall ratio is printed
beside it), the peak RSS of each way, and the largest LoRA gradient difference (absolute, and relative to the
largest gradient entry); then one line per G and, last, the smallest speedup and the largest difference over
the G values:

    speedup N.Nx, max grad diff X

    .venv/bin/python benchmarks/update_speed.py                      # Qwen2.5-Coder-0.5B if installed, G = 4, 8
    .venv/bin/python benchmarks/update_speed.py --model smollm2-135m --generations 4 --prompt-tokens 1000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = "multi_turn_base_2"
MODEL_SEGMENTS = (90, 60, 40)  # tokens of the three model messages (each trajectory adds its own offset)
ENV_SEGMENTS = (150, 110)  # tokens of the two environment messages between them


def default_model() -> str:
    """Qwen2.5-Coder-0.5B when its pip packages are installed, else SmolLM2-135M."""
    from seal_lite.engines.model_sources import ModelSourceError, gguf_path

    try:
        gguf_path("qwen2.5-coder-0.5b")
        return "qwen2.5-coder-0.5b"
    except (ModelSourceError, FileNotFoundError):
        return "smollm2-135m"


def rollout_batch(tokenizer, group: int, prompt_tokens: int | None, seed: int = 0):
    """One task's official-view opening and ``group`` multi-turn completions (see the module docstring)."""
    import torch

    from seal_lite.core.advantages import group_advantages
    from seal_lite.core.interface import evaluation_interface
    from seal_lite.core.types import RolloutBatch
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.rollout import turn_text

    task = load_tasks([TASK])[0]
    prompt = tokenizer(turn_text(tokenizer, task, 0, evaluation_interface("official")),
                       add_special_tokens=False)["input_ids"]
    prompt = prompt[:prompt_tokens] if prompt_tokens else prompt
    generator = torch.Generator().manual_seed(seed)
    vocabulary = min(len(tokenizer), tokenizer.vocab_size)  # ordinary tokens only
    completions, masks = [], []
    for row in range(group):
        mask = []
        for index, model_tokens in enumerate(MODEL_SEGMENTS):
            mask += [1] * (model_tokens + 7 * row)
            if index < len(ENV_SEGMENTS):
                mask += [0] * (ENV_SEGMENTS[index] + 11 * row)
        completions.append(torch.randint(0, vocabulary, (len(mask),), generator=generator).tolist())
        masks.append(mask)
    rewards = [1.0 if row % 4 == 0 else 0.0 for row in range(group)]
    weights = [1.0 + 0.1 * (row % 3) for row in range(group)]
    advantages = [a * w for a, w in zip(group_advantages(rewards), weights)]
    return RolloutBatch([list(prompt)] * group, completions, masks, rewards, advantages)


def worker(model: str, group: int, shared: bool, prompt_tokens: int | None, threads: int | None, out: Path) -> None:
    """One way, in this process: load, update once, write the seconds, the peak RSS and the LoRA gradients."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from transformers import TrainerCallback

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy

    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "smoke.yaml", {  # as measured
        "policy.model": model, "policy.gradient_checkpointing": True, "data.task_ids": [TASK],
        "rollout.num_generations": group, "rollout.max_context_tokens": 8192, "grpo.tasks_per_step": 1,
        "grpo.steps": 1, "grpo.shared_prefix": shared, "grpo.max_grad_norm": 1e9, "diagnoser.mode": "off",
    })
    policy = load_policy(resolve_model(model), recipe)
    from seal_lite.training.grpo import build_trainer

    batch = rollout_batch(policy.tokenizer, group, prompt_tokens)
    grads = {}

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n})

    with tempfile.TemporaryDirectory() as directory:
        trainer = build_trainer(policy, recipe, [TASK], lambda prompts: batch, directory, callbacks=[Gradients()])
        trainer.args.save_strategy = "no"
        with torch.no_grad():  # a non-zero adapter: the policy differs from the reference, the KL term counts
            for name, parameter in trainer.model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 1e-3, generator=torch.Generator().manual_seed(1))
        loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        started, cpu_started = time.time(), time.process_time()
        trainer.train()
        seconds, cpu_seconds = time.time() - started, time.process_time() - cpu_started
    torch.save(grads, out / "grads.pt")
    figures = {"seconds": seconds, "cpu_seconds": cpu_seconds, "threads": torch.get_num_threads(), "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
               "loaded_rss_gb": loaded, "micro_batch": trainer.args.per_device_train_batch_size,
               "prompt_tokens": len(batch.prompt_ids[0]),
               "completion_tokens": [len(c) for c in batch.completion_ids], "dtype": str(policy.dtype)}
    (out / "figures.json").write_text(json.dumps(figures))


def run_way(model: str, group: int, shared: bool, prompt_tokens: int | None, threads: int | None,
            default_malloc: bool, directory: Path) -> dict:
    """``worker`` in a fresh process (its own peak memory); returns its figures and gradients."""
    import torch

    out = directory / f"g{group}-{'shared' if shared else 'per-trajectory'}"
    out.mkdir()
    command = [sys.executable, __file__, "--worker", "--model", model, "--generations", str(group),
               "--out", str(out)] + (["--shared"] if shared else [])
    command += ["--prompt-tokens", str(prompt_tokens)] if prompt_tokens else []
    command += ["--threads", str(threads)] if threads else []
    # large blocks straight from mmap, so that RSS follows the tensors alive rather than what glibc's heap keeps
    # cached after freeing them (which depends on the order of allocations more than on what the update holds)
    environment = os.environ if default_malloc else os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
    subprocess.run(command, check=True, env=environment)
    figures = json.loads((out / "figures.json").read_text())
    figures["grads"] = torch.load(out / "grads.pt")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a registry name (default: Qwen2.5-Coder-0.5B if installed)")
    parser.add_argument("--generations", default="4,8", help="G values, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="cut the prompt to this many tokens "
                        "(a quick check; default: the whole official-view opening)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core); "
                        "1 is faster on a CPU that other processes keep busy")
    parser.add_argument("--default-malloc", action="store_true", help="measure RSS with glibc's default heap "
                        "(freed blocks stay resident); default: blocks of 64 KiB and more are mmap'ed and returned")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = args.model or default_model()
    groups = [int(g) for g in args.generations.split(",")]
    if args.worker:
        return worker(model, groups[0], args.shared, args.prompt_tokens, args.threads, args.out)
    summary = []
    with tempfile.TemporaryDirectory() as directory:
        for group in groups:
            ways = [run_way(model, group, shared, args.prompt_tokens, args.threads, args.default_malloc,
                            Path(directory)) for shared in (False, True)]
            per_trajectory, shared = ways
            names = per_trajectory["grads"]
            diff = max(float((shared["grads"][n] - names[n]).abs().max()) for n in names)
            scale = max(float(g.abs().max()) for g in names.values())
            speedup = per_trajectory["cpu_seconds"] / shared["cpu_seconds"]
            print(f"{model} ({per_trajectory['dtype']}), G={group}: prompt {per_trajectory['prompt_tokens']} tokens, "
                  f"completions {per_trajectory['completion_tokens']} tokens")
            for name, way in (("per trajectory", per_trajectory), ("shared prefix", shared)):
                print(f"  {name:15s} {way['seconds']:8.1f} s wall, {way['cpu_seconds']:8.1f} s CPU "
                      f"({way['threads']} threads)   peak RSS {way['peak_rss_gb']:5.2f} GB (after loading "
                      f"{way['loaded_rss_gb']:5.2f} GB), micro-batch {way['micro_batch']}")
            print(f"  wall-time ratio {per_trajectory['seconds'] / shared['seconds']:.2f}x, CPU-time ratio "
                  f"{speedup:.2f}x")
            print(f"  largest LoRA gradient difference {diff:.3g} ({diff / scale:.2g} of the largest entry, "
                  f"{scale:.3g}); {len(names)} LoRA tensors")
            print(f"G={group}: speedup {speedup:.1f}x, max grad diff {diff:.2g}", flush=True)
            summary.append((speedup, diff))
    print(f"speedup {min(s for s, _ in summary):.1f}x, max grad diff {max(d for _, d in summary):.2g}")


if __name__ == "__main__":
    main()
