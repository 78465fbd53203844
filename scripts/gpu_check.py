"""The checks of scripts/gpu_check.sh, one per call, each printing one JSON line (``"ok"`` says whether it passed).

    python scripts/gpu_check.py doctor [--tiny]                       seal-lite doctor, self-test in NF4
    python scripts/gpu_check.py steps --backend unsloth [--tiny]      two SEAL steps, Qwen2.5-1.5B shape
    python scripts/gpu_check.py steps --backend peft-4bit [--tiny]

Models are random-init of the real shape with a locally built tokenizer (benchmarks/gpu_memory.py): the GPU
machine reaches no hub. ``--tiny`` runs the same code on a 2-layer model of that shape, on the CPU if there is
no GPU: the smoke test the test suite runs. Each check runs in its own process because Unsloth patches
transformers, peft and trl on import, which would change the peft-4bit check after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_memory  # noqa: E402  (benchmarks/ is not a package: found through sys.path above)

TASKS = ["multi_turn_base_0", "multi_turn_base_1"]


def shape(tiny: bool) -> gpu_memory.Shape:
    real = gpu_memory.SHAPES["1.5b"]
    return gpu_memory.Shape("tiny-1.5b", 64, 2, 4, 2, 128, 8192, real.tied) if tiny else real


def doctor(tiny: bool) -> dict:
    """The doctor report, its masking self-test and GRPO step run on NF4 Linear4bit layers (peft-4bit)."""
    from seal_lite.doctor import report

    with tempfile.TemporaryDirectory() as directory:
        model_dir = gpu_memory.random_model_dir(shape(tiny), directory)
        result = report(model_dir, backend="peft-4bit")
    missing = [row["name"] for row in result["backends"]["packages"] if row["role"] == "required" and not row["ok"]]
    test = result["self_test"]
    return {"ok": test["passed"], "gpus": result["hardware"]["gpus"],
            "training_backend": result["backends"]["training_backend"],
            "versions": {row["name"]: row["version"] for row in result["backends"]["packages"]},
            "required_missing": missing,  # llama_cpp serves only the diagnoser, which these checks leave off
            "self_test": {key: test[key] for key in ("message", "backend", "dtype", "linear4bit_layers",
                                                     "trainable_dtypes", "lora_changed", "lora_entries",
                                                     "model_tokens", "env_tokens", "max_env_grad", "seconds")}}


def steps(backend: str, tiny: bool, count: int = 2) -> dict:
    """``count`` real SEAL steps (rollouts on real BFCL tasks, verification, labels, weighting, GRPO update) of
    a Qwen2.5-1.5B-shaped random policy. A random model fails every task, so every advantage would be 0 and the
    update skipped: the advantages are replaced by +1/-1 within each group (forced learning signal)."""
    import torch

    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.recipe import load_recipe
    from seal_lite.store import Store
    from seal_lite.training.policy import count_linear4bit, load_policy

    with tempfile.TemporaryDirectory() as directory:
        model_dir = gpu_memory.random_model_dir(shape(tiny), str(Path(directory) / "model"))
        recipe = load_recipe(None, {
            "name": "gpu-check", "policy.model": model_dir, "policy.backend": backend, "policy.lora_r": 16,
            "policy.lora_alpha": 32, "policy.gradient_checkpointing": True, "data.task_ids": TASKS,
            "grpo.tasks_per_step": 2, "grpo.steps": count, "grpo.mini_batches": 2, "rollout.num_generations": 2,
            "rollout.backend": "transformers", "rollout.max_turns": 1, "rollout.max_model_calls": 2,
            "rollout.max_new_tokens": 8 if tiny else 64, "rollout.max_context_tokens": 8192,
            "diagnoser.mode": "off",
        })
        started = time.time()
        policy = load_policy(model_dir, recipe)
        from seal_lite.generation import TransformersGenerator
        from seal_lite.loop import SealStep
        from seal_lite.training.grpo import build_trainer  # after the policy: Unsloth patches trl on import

        tasks = {task.id: task.truncated(1) for task in load_tasks(TASKS)}
        step = SealStep(recipe, Store(Path(directory) / "seal.db"), tasks, None)

        def forced_signal(prompts):
            batch = step(prompts)
            group = recipe.rollout.num_generations
            signs = [1.0 if index % group % 2 == 0 else -1.0 for index in range(len(batch.advantages))]
            return dataclasses.replace(batch, advantages=signs)

        trainer = build_trainer(policy, recipe, list(tasks), forced_signal, str(Path(directory) / "trl"))
        trainer.args.save_strategy = "no"
        step.generator = TransformersGenerator(trainer.model, policy.tokenizer, policy.generation_mode)
        timings = []
        trainer.add_callback(gpu_memory._timer(timings))
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
        load_s = time.time() - started
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        after = dict(trainer.model.named_parameters())
        moved = sum(int((after[name].detach() != p).sum()) for name, p in before.items())
        figures = {
            "ok": step.step == count and moved > 0 and policy.backend == backend,
            "backend": policy.backend, "reason": policy.reason, "seal_steps": step.step,
            "optimizer_steps": trainer.state.global_step, "lora_changed": moved,
            "lora_entries": sum(p.numel() for p in before.values()),
            "trainable_dtypes": sorted({str(after[name].dtype).removeprefix("torch.") for name in before}),
            "linear4bit_layers": count_linear4bit(trainer.model),
            "pad_is_stop": policy.tokenizer.pad_token_id in step.generator.stop_ids,
            # seconds per optimizer step; the first of each SEAL step includes that step's rollouts
            "load_s": round(load_s, 1), "optimizer_step_s": [round(t, 2) for t in timings],
            "peak_gb": round(torch.cuda.max_memory_allocated() / gpu_memory.GB, 2)
            if torch.cuda.is_available() else None,
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["doctor", "steps"])
    parser.add_argument("--backend", default="peft-4bit", choices=["unsloth", "peft-4bit", "peft"])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the shape (a smoke test)")
    args = parser.parse_args()
    name = args.check if args.check == "doctor" else f"steps-{args.backend}"
    started = time.time()
    try:
        row = doctor(args.tiny) if args.check == "doctor" else steps(args.backend, args.tiny)
    except Exception as error:  # one JSON line whatever happens: the next check still runs
        row = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:500]}"}
    print(json.dumps({"check": name, "tiny": args.tiny} | row | {"seconds": round(time.time() - started, 1)}),
          flush=True)
    sys.exit(0 if row["ok"] else 1)


if __name__ == "__main__":
    main()
