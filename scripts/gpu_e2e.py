"""The parts of scripts/gpu_e2e.sh: seal-lite as a user runs it, on one GPU without network access (or, with
``--cpu``, the same code on a CPU, which the test suite runs).

    python scripts/gpu_e2e.py --out OUT [--cpu] [--parts run_resume,eval_base,...]    # every part, in order
    python scripts/gpu_e2e.py --out OUT --work DIR --part run_resume [--cpu]          # one part (what the above runs)

Each part runs in a process of its own under its own time limit (Unsloth patches the libraries of the process that
imports it) and writes ``OUT/<part>.json`` as it goes: a part stopped at its limit keeps what it had finished, with
"ok": false and the reason. The parts, most valuable first:

  run_resume        the real ``seal-lite run`` CLI on the GPU recipes' backend, peft-4bit (peft on a CPU): 3 steps of
                    2 real BFCL tasks, killed with SIGKILL once step 1's checkpoint is committed, then the same command
                    again, which must resume after the committed step and finish: each step stored and committed
                    once, one checkpoint directory kept (grpo.keep_checkpoints 1), the LoRA moved on the steps that
                    had a learning signal, no fall-back in the run's log;
                    validation during training on one held-out task under BFCL's view, before the first step and
                    after each: one validation a step, and a best adapter kept
  eval_base         ``seal-lite eval RUN --base --tasks 1``: the trained adapter and the base model, greedy, in one process
  engine_logprobs   on Unsloth (peft on a CPU), rollouts whose engine also reports its log-probs (as vLLM and llama.cpp
                    do), on tasks whose prompts differ in length: the update compares them with the trained model's
                    own, off-policy (grpo.mini_batches 2: TRL's old log-probs, Unsloth's left-packed ones) and
                    on-policy (1: the loss's); the logged gap must be near 0 and the LoRA must move
  paged_fp16        colab-t4's path at toy size, as ``seal-lite run`` takes it: recipes/colab-t4.yaml (peft-4bit,
                    rollout.backend paged) in float16, one SEAL step of 2 real tasks x G = 4 under BFCL's view, with
                    SDPA held to the kernels a T4 has (memory-efficient and math): the engine must play with
                    ``paged|sdpa``, hand its pool back to the card before the update (``release``: PyTorch's reserved
                    memory drops), and the step must take its optimizer steps on a finite gradient (fp16's GradScaler
                    skips a step on inf: lora_change 0) with the engine's log-probs within 0.1 of the trainer's; the
                    update's seconds after the rollouts (the allocator warm) and its peak are recorded

and, by name only (``--parts update_prefix,update_unsloth,rollout_engines``), benchmarks for a GPU with time left
(issues 65, 66):

  update_prefix     one update of a group of G = 8 trajectories at the paper's shapes (a real task's 5k-token opening
                    under the official view, completions of three model and two environment messages) on the peft-4bit
                    backend at Qwen2.5-7B's widths (2 layers; the tiny model in fp32 on a CPU), one pass per
                    trajectory against each group's prompt computed once (grpo.shared_prefix): seconds, peak memory,
                    tokens the decoder read (on a GPU the suffixes' graphs are kept, so each suffix is read once a
                    pass), the ratios, and how far the LoRA gradients of the two ways differ
  update_unsloth    the same update on Unsloth, one trajectory a pass (peft stands in on a CPU): its seconds, peak and
                    tokens read against update_prefix's two ways (run first into the same OUT), and its gradients
                    against the shared prefix's: whether Unsloth's kernels outrun the shared prefix (docs/gpu.md)
  rollout_engines   the same greedy episodes, G = 8 of that task (2 turns, up to 4 messages of 48 tokens) on the same
                    peft-4bit policy at Qwen2.5-7B's widths (2 layers), played by chunked ``generate`` and by
                    ``rollout.backend: paged`` (benchmarks/rollout_engines.py): seconds, tokens read, peaks, ratios

What stands in for what a GPU user has: the policy is a random-init Qwen2 of Qwen2.5-1.5B's widths with 4 layers
(``--cpu``: benchmarks/gpu_memory.py's 2-layer TINY) and the locally built tokenizer; a random model never passes a
task, so, as tests/support/scripted_run.py does for the resume tests, each message is replaced by the task's ground
truth with probability 1/2 (groups then mix rewards 1 and 0, and updates really happen). paged_fp16 keeps the
engine's own samples, whose log-probs it checks, and judges every other episode of each group passed instead; and
the diagnoser is a stand-in: the GPU recipes run a llama.cpp model on the CPU, which the device machine cannot
install, so a stub HTTP server on 127.0.0.1 (``diagnoser.mode url``) answers each failed turn with its rule label
and fixed texts. Every part's JSON names these ("stand_ins").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # tests.support: the scripted generation of the resume tests

PARTS = ["run_resume", "eval_base", "engine_logprobs", "paged_fp16"]
# run by name (--parts), after the parts, on a GPU with time left
BENCHMARKS = ["update_prefix", "update_unsloth", "rollout_engines"]
# seconds each part may take on a GPU (the parts sum to 6 minutes; Unsloth's first step compiles for about a
# minute); on a shared 2-core CPU the tiny models take longer: x4
LIMITS = {"run_resume": 170, "eval_base": 40, "engine_logprobs": 80, "paged_fp16": 60, "update_prefix": 120,
          "update_unsloth": 120, "rollout_engines": 180}
CPU_SCALE = 4
TASKS = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]  # their prompts differ in length
HELD_OUT = ["multi_turn_base_100"]  # run_resume's validation slice
STEPS = 3
# the backend each part's recipe trains on, on a GPU (a CPU: peft stands in): run_resume (and so eval_base) on the
# GPU recipes' own; engine_logprobs checks Unsloth's log-prob layout, and its process imports Unsloth, whose patched
# trainer takes no other backend (``check_trainer``)
BACKENDS = {"run_resume": "peft-4bit", "engine_logprobs": "unsloth"}
ENGINE_TASK = "multi_turn_base_2"  # rollout_engines: a 5k-token opening under the official view
STAND_INS = {"policy": "random-init weights, local tokenizer; half the messages replaced by the ground truth",
             "diagnoser": "a stub OpenAI-compatible server answering with the rule label (diagnoser.mode url)"}
PAGED_STAND_INS = {"policy": "random-init weights, local tokenizer", "diagnoser": STAND_INS["diagnoser"],
                   "verdict": "every other episode of each group judged passed (a random model passes none)"}
T4_POOL_TOKENS = 200_000  # paged_fp16's pool on a GPU: about a T4's (seal-lite recipe recipes/colab-t4.yaml --card t4)
CPU_OVERRIDES = {"policy.device": "auto"}  # paged_fp16 on a CPU: colab-t4 asks for a GPU; its pool is 4 contexts
CPU_STAND_INS = {"loss_scaling": "accelerate makes no GradScaler on a CPU: the one it makes on a GPU is given to it "
                                 "(seal-lite rehearse's scale_fp16_losses)"}


# --- the parts ---------------------------------------------------------------------------------------------------

def run_resume(ctx: Context, result: dict) -> bool:
    """seal-lite run, SIGKILL once step 1's checkpoint is committed, the same command again to the end."""
    from seal_lite.runs.rehearse import kill_after_checkpoint  # seal-lite rehearse kills and resumes the same way

    run_dir = ctx.work / "run"
    with stub_diagnoser() as url:
        command = [*ctx.harness("cli"), "run", str(ctx.recipe_file(url)), "--out", str(run_dir)]
        with open(ctx.work / "first-run.out", "w") as output:  # a file: a full pipe would stall the run
            first = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
            result["killed_after_step"] = killed = kill_after_checkpoint(first, run_dir / "seal.db")
        result["first_output"] = tail((ctx.work / "first-run.out").read_text(errors="replace"))
        ctx.save(result)
        second = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    output = second.stdout + second.stderr
    result["resume_output"] = tail(output)
    result["exit_code"] = second.returncode
    if not (run_dir / "seal.db").exists():
        result["error"] = "the run left no store: first_output and resume_output say why"
        return False
    store = read_store(run_dir / "seal.db")
    log = (run_dir / "run.log").read_text(errors="replace") if (run_dir / "run.log").exists() else ""
    moved = [step for step, metrics in store["metrics"].items()
             if metrics.get("grpo/update_skipped") == 0 and metrics.get("grpo/lora_change", 0) > 0]
    signal_steps = [step for step, metrics in store["metrics"].items() if metrics.get("grpo/update_skipped") == 0]
    result |= {
        "steps_stored": store["steps"], "status": store["status"], "checkpoint_rows": len(store["checkpoints"]),
        "checkpoint_dirs": sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")),
        "steps_with_signal": signal_steps, "steps_lora_moved": moved,
        "diagnoses": store["diagnoses"], "resumed_line": next(iter(re.findall(r"Resuming after step \d+", output)), None),
        "fallback_in_log": [line for line in log.splitlines() if "Could not build" in line or "falls back" in line][:3],
        "validation_steps": store["validation_steps"],
        "best_adapter": (run_dir / "best-adapter" / "adapter_config.json").is_file(),
        "staged_adapters_left": sorted(p.name for p in run_dir.glob(".best-adapter*")),
    }
    return (killed is not None and 1 <= killed < STEPS and second.returncode == 0
            and store["steps"] == list(range(1, STEPS + 1)) and store["status"] == "finished"
            and result["checkpoint_rows"] == STEPS and len(result["checkpoint_dirs"]) == 1
            and bool(signal_steps) and moved == signal_steps and not result["fallback_in_log"]
            and result["resumed_line"] == f"Resuming after step {killed}"
            and result["validation_steps"] == list(range(STEPS + 1)) and result["best_adapter"]
            and not result["staged_adapters_left"])


def eval_base(ctx: Context, result: dict) -> bool:
    """seal-lite eval RUN --base --tasks 1: both models in one process, greedy, results stored with the run."""
    run_dir = ctx.work / "run"
    if not (run_dir / "seal.db").exists():
        result["error"] = "no run to evaluate: run_resume did not leave one"
        return False
    done = subprocess.run([sys.executable, "-m", "seal_lite", "eval", str(run_dir), "--base", "--tasks", "1"],
                          capture_output=True, text=True, cwd=ROOT)
    result |= {"exit_code": done.returncode, "output": tail(done.stdout + done.stderr)}
    from seal_lite.engines.store import Store

    stored = Store.open_readonly(run_dir / "seal.db").evaluations() if done.returncode == 0 else []
    result["evaluations"] = counts = dict(Counter(row["model"] for row in stored))
    return done.returncode == 0 and len(counts) == 2 and all(count == 4 for count in counts.values())  # 1 x 4 categories


def engine_logprobs(ctx: Context, result: dict) -> bool:
    """Two runs in this process whose rollouts carry their engine's log-probs (the model's own, scored by a
    forward pass, so the gap the update logs should be near 0): off-policy, then on-policy."""
    ctx.import_backend()
    from seal_lite import api
    from seal_lite.engines.store import Store
    from tests.support.scripted_run import script_generation, sometimes_right

    script_generation(sometimes_right)
    context_lengths = report_own_logprobs()
    ok = True
    with stub_diagnoser() as url:
        for name, mini_batches in (("off_policy", 2), ("on_policy", 1)):
            out = ctx.work / f"engine-{name}"
            recipe = api.checked_recipe(ctx.recipe_file(url), {"grpo.mini_batches": mini_batches, "grpo.steps": 2},
                                        out_dir=out)
            api.run(recipe, out)
            store = Store(out / "seal.db")
            steps = {step["step"]: store.step_metrics(step["step"]) for step in store.steps()}
            gaps = {step: metrics["grpo/engine/logprob_gap_mean"] for step, metrics in steps.items()
                    if "grpo/engine/logprob_gap_mean" in metrics}
            moved = {step: metrics.get("grpo/lora_change", 0.0) for step, metrics in steps.items() if step in gaps}
            result[name] = {"gap_mean": gaps, "gap_max": {step: metrics.get("grpo/engine/logprob_gap_max")
                                                          for step, metrics in steps.items() if step in gaps},
                            "filtered_share": {step: metrics.get("grpo/engine/filtered_share")
                                               for step, metrics in steps.items() if step in gaps},
                            "lora_change": moved, "context_lengths": sorted(set(context_lengths))}
            context_lengths.clear()
            ctx.save(result)
            # 4-bit weights and bf16 kernels differ a little between generation and training; a misaligned row
            # compares other positions' log-probs, which differ by about 1 on these random models
            ok = (ok and bool(gaps) and all(gap < 0.1 for gap in gaps.values()) and all(moved.values())
                  and len(result[name]["context_lengths"]) > 1)
    return ok


def paged_fp16(ctx: Context, result: dict) -> bool:
    """One SEAL step of recipes/colab-t4.yaml at toy size through ``api.run``: peft-4bit in float16, rollouts on the
    paged engine, SDPA held to a T4's kernels. Checks, from what the step did and from the store, the policy and
    attention the engine played with, its pool handed back before the update, every optimizer step taken on a finite
    gradient, and the engine's log-probs against the trainer's (TRL's old log-probs: colab-t4 takes 4 mini-batches)."""
    import math

    import torch

    from seal_lite import api
    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.store import Store
    from seal_lite.training.grpo import updates_per_step

    step = watch_step(cuda=not ctx.cpu)
    judge_every_other_episode_passed()
    toy = {"policy.model": ctx.model_dir(), "policy.dtype": "float16",  # colab-t4's auto: float16 on a T4
           "name": "gpu-e2e-paged-fp16", "data.task_ids": TASKS[:2], "grpo.tasks_per_step": 2, "grpo.steps": 1,
           "rollout.num_generations": 4, "rollout.max_turns": 1, "rollout.max_model_calls": 2,
           "rollout.max_new_tokens": 16, "diagnoser.mode": "url", "diagnoser.max_per_step": 2,
           "diagnoser.timeout_s": 10}
    toy |= CPU_OVERRIDES if ctx.cpu else {"rollout.cache_tokens": T4_POOL_TOKENS}
    result["stand_ins"] = PAGED_STAND_INS | (CPU_STAND_INS if ctx.cpu else {})
    ctx.save(result)
    out = ctx.work / "paged-fp16"
    with stub_diagnoser() as url, t4_attention(cuda=not ctx.cpu):
        recipe = load_recipe(ROOT / "recipes" / "colab-t4.yaml", toy | {"diagnoser.url": url})
        api.run(recipe, out)
    metrics = Store.open_readonly(out / "seal.db").step_metrics(1)
    scaler = step["trainer"].accelerator.scaler  # fp16's GradScaler
    scaling = scaler and scaler.state_dict()
    optimizer_steps = updates_per_step(recipe)
    result |= {
        "policy_in_play": step["policy"], "attention_in_play": sorted(step["attention"]),
        "releases": step["releases"], "update_s": metrics.get("time/update_s"),
        "update_peak_gb": None if ctx.cpu else gigabytes(torch.cuda.max_memory_allocated()),  # since the release
        "update_skipped": metrics.get("grpo/update_skipped"), "lora_change": metrics.get("grpo/lora_change"),
        "grad_norm": metrics.get("grpo/grad_norm"), "engine_gap_mean": metrics.get("grpo/engine/logprob_gap_mean"),
        "engine_gap_max": metrics.get("grpo/engine/logprob_gap_max"), "optimizer_steps": optimizer_steps,
        # a step the scaler skipped (inf or NaN gradients) halves the scale and restarts the count of steps in a row
        "grad_scaler": scaling and {"scale": scaling["scale"], "steps_in_a_row": scaling["_growth_tracker"]},
    }
    result["checks"] = checks = {
        "played_fp16_nf4": result["policy_in_play"] == {"dtype": "float16", "nf4": True},
        "played_paged_sdpa": result["attention_in_play"] == ["paged|sdpa"],
        # a CPU has no card to hand memory back to: that the release ran is what it can show
        "pool_released": bool(step["releases"]) and all(
            ctx.cpu or release["reserved_after_gb"] < release["reserved_before_gb"] for release in step["releases"]),
        "update_taken": result["update_skipped"] == 0 and (result["lora_change"] or 0) > 0,
        "finite_gradient": result["grad_norm"] is not None and math.isfinite(result["grad_norm"]),
        "no_step_skipped": bool(scaling) and scaling["_growth_tracker"] == optimizer_steps,
        "engine_gap_below_0.1": result["engine_gap_mean"] is not None and result["engine_gap_mean"] < 0.1,
    }
    return all(checks.values())


def update_prefix(ctx: Context, result: dict) -> bool:
    """The update one pass per trajectory, then with each group's prompt computed once, on the same batch in this
    process: the seconds and peak memory of each, and the relative difference of their LoRA gradients."""
    import torch

    gradients = {}
    for way, shared in (("per_trajectory", False), ("shared_prefix", True)):
        gradients[way] = {}
        result[way] = time_update(ctx, way, "peft-4bit", shared, gradients[way])
        ctx.save(result)
    torch.save(gradients["shared_prefix"], ctx.work / "update-prefix-gradients.pt")  # for update_unsloth
    relative, norm = gradient_gap(gradients["per_trajectory"], gradients["shared_prefix"])
    tolerance = 1e-3 if result["shared_prefix"]["dtype"] == "torch.float32" else 0.3  # as gpu_check's parity
    result |= {"speedup": round(result["per_trajectory"]["seconds"] / result["shared_prefix"]["seconds"], 2),
               "read_ratio": round(result["per_trajectory"]["read_tokens"] / result["shared_prefix"]["read_tokens"], 2),
               "relative_gradient_difference": float(f"{relative:.3g}"), "gradient_norm": float(f"{norm:.3g}"),
               "tolerance": tolerance}
    return result["shared_prefix"]["shared_prefix"] and norm > 0 and relative <= tolerance


def update_unsloth(ctx: Context, result: dict) -> bool:
    """The same update on Unsloth (one trajectory a pass, its own kernels; on a CPU, where Unsloth cannot run, peft
    stands in): its seconds and peak against update_prefix's two ways when that part ran first into the same OUT,
    and its LoRA gradients against the shared prefix's. The one figure that says which backend's update is faster."""
    import torch

    ctx.import_backend()
    gradients = {}
    result["unsloth"] = time_update(ctx, "unsloth", "unsloth", False, gradients)
    ctx.save(result)
    earlier = ctx.out / "update_prefix.json"
    ways = json.loads(earlier.read_text()) if earlier.exists() else {}
    for way in ("per_trajectory", "shared_prefix"):
        if "seconds" in ways.get(way, {}):
            result[f"unsloth_over_{way}"] = round(result["unsloth"]["seconds"] / ways[way]["seconds"], 2)
    saved = ctx.work / "update-prefix-gradients.pt"
    if saved.exists():
        shared = torch.load(saved, weights_only=True)
        common = {name: gradients[name] for name in gradients if name in shared}
        result["gradients_compared"] = f"{len(common)} of {len(gradients)}"
        if common:
            result["relative_gradient_difference"] = float(f"{gradient_gap(common, shared)[0]:.3g}")
    return result["unsloth"]["seconds"] > 0 and gradient_norm(gradients) > 0


def time_update(ctx: Context, way: str, backend: str, shared: bool, gradients: dict) -> dict:
    """One update of G = 8 paper-shaped trajectories (a real task's 5k-token opening under the official view) at
    Qwen2.5-7B's widths, 2 layers (the tiny model on a CPU), on ``backend``, with or without the shared prefix:
    its seconds, peak and the tokens the decoder read; the LoRA gradients before the optimizer steps go into
    ``gradients``. On a CPU peft stands in for ``backend`` (``Context.policy_overrides``)."""
    import gc

    import torch
    from transformers import TrainerCallback
    from update_speed import TASK, rollout_batch

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.policy import load_policy
    from seal_lite.training.grpo import build_trainer

    model_dir = ctx.model_dir("7b")
    recipe = load_recipe(None, ctx.policy_overrides(model_dir, backend) | {
        "policy.gradient_checkpointing": True,
        "data.task_ids": [TASK], "rollout.num_generations": 8, "rollout.max_context_tokens": 16384,
        "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.shared_prefix": shared, "grpo.max_grad_norm": 1e9})
    policy = load_policy(model_dir, recipe)
    batch = rollout_batch(policy.tokenizer, 8, None)

    class Gradients(TrainerCallback):  # after the micro-batches' gradients add up, before the optimizer steps
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            gradients.update({n: p.grad.detach().float().cpu() for n, p in model.named_parameters()
                              if "lora_" in n and p.grad is not None})

    trainer = build_trainer(policy, recipe, [TASK], lambda prompts, batch=batch: batch, str(ctx.work / f"trl-{way}"),
                            callbacks=[Gradients()])
    trainer.args.save_strategy = "no"
    with torch.no_grad():  # a non-zero adapter, as update_speed.py has it: the KL term counts
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 1e-3)
    read = [0]  # tokens the decoder embeds, every pass and recompute included
    counter = trainer.model.get_input_embeddings().register_forward_pre_hook(
        lambda module, args: read.__setitem__(0, read[0] + args[0].numel()))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    trainer.train()
    if cuda:
        torch.cuda.synchronize()
    counter.remove()
    row = {"seconds": round(time.perf_counter() - started, 2), "backend": policy.backend,
           "shared_prefix": trainer.shared_prefix, "read_tokens": read[0],
           "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
           "prompt_tokens": len(batch.prompt_ids[0]), "completion_tokens": sum(map(len, batch.completion_ids)),
           "dtype": str(policy.dtype)}
    del trainer, policy
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def gradient_norm(gradients: dict) -> float:
    """The LoRA gradients' norm, taken as one vector (0 when none was captured)."""
    return sum(float(g.pow(2).sum()) for g in gradients.values()) ** 0.5


def gradient_gap(reference: dict, other: dict) -> tuple[float, float]:
    """(|other - reference| / |reference|, |reference|) over ``reference``'s parameters, as one vector each."""
    norm = gradient_norm(reference)
    difference = gradient_norm({n: other[n] - reference[n] for n in reference})
    return (difference / norm if norm else float("nan")), norm


def rollout_engines(ctx: Context, result: dict) -> bool:
    """The same greedy episodes played by chunked ``generate`` and by the paged engine (benchmarks/
    rollout_engines.py), G = 8 of a real task under the official view on a 4-bit + LoRA policy: the ratio of their
    seconds, of the tokens each read, and their memory peaks."""
    import torch
    from peft import get_peft_model
    from rollout_engines import compare

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.policy import load_policy
    from seal_lite.engines.rollout_engine import paged_cache_tokens
    from seal_lite.envs.bfcl import load_tasks

    model_dir = ctx.model_dir("7b")
    recipe = load_recipe(None, ctx.policy_overrides(model_dir, "peft-4bit") | {
        "data.task_ids": [ENGINE_TASK],
        "grpo.tasks_per_step": 1, "rollout.num_generations": 8, "rollout.max_turns": 2, "rollout.max_model_calls": 4,
        "rollout.max_new_tokens": 48, "rollout.max_context_tokens": 16384, "rollout.backend": "paged"})
    policy = load_policy(model_dir, recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    tasks = [task.truncated(recipe.rollout.max_turns) for task in load_tasks([ENGINE_TASK])]
    cache_tokens = paged_cache_tokens(recipe, model)
    result |= {"stand_ins": {"policy": "random-init weights, local tokenizer (greedy: both engines play the same)"},
               "policy": f"{recipe.policy.backend}, {policy.dtype}", "cache_tokens": cache_tokens,
               "attention": model.get_base_model().config._attn_implementation,
               "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    ctx.save(result)
    result |= compare(model, policy.tokenizer, tasks, recipe.rollout, 8, cache_tokens)
    return result["paged"]["generated"] > 0 and result["read_ratio"] > 1


# --- what the parts share ----------------------------------------------------------------------------------------

class Context:
    def __init__(self, out: Path, work: Path, part: str, cpu: bool):
        self.out, self.work, self.part, self.cpu = out, work, part, cpu

    def save(self, result: dict) -> None:
        """Write the part's file now, so that a part stopped at its limit keeps what it had."""
        (self.out / f"{self.part}.json").write_text(json.dumps({"part": self.part, **result}) + "\n")

    def import_backend(self) -> None:
        if not self.cpu:
            import unsloth  # noqa: F401  (first: it patches transformers, peft and trl)

    def model_dir(self, width: str = "1.5b") -> str:
        """A random-init Qwen2 with the local tokenizer, built once per work folder: on a GPU of Qwen2.5's ``width``
        with 4 layers (1.5b) or 2 (7b), on a CPU the tiny one."""
        import gpu_memory

        directory = self.work / f"model-qwen2-{width}"
        if not (directory / "config.json").exists():
            layers = {"1.5b": 4, "7b": 2}[width]
            shape = gpu_memory.TINY if self.cpu else dataclasses.replace(gpu_memory.SHAPES[width], layers=layers)
            gpu_memory.random_model_dir(shape, str(directory))
        return str(directory)

    def policy_overrides(self, model_dir: str, backend: str) -> dict:
        """The policy on ``backend`` on a GPU; on a CPU peft in fp32 stands in for every backend."""
        if self.cpu:
            return {"policy.model": model_dir, "policy.backend": "peft", "policy.dtype": "float32"}
        return {"policy.model": model_dir, "policy.backend": backend, "policy.device": "gpu"}

    def recipe_file(self, diagnoser_url: str) -> Path:
        """The part's recipe: the smallest that trains, plays real BFCL tasks and checkpoints every step, on the
        part's backend (``BACKENDS``)."""
        import yaml

        from seal_lite.core.recipe import load_recipe

        overrides = self.policy_overrides(self.model_dir(), BACKENDS[self.part]) | {
            "name": "gpu-e2e", "seed": 3, "policy.lora_r": 16, "policy.lora_alpha": 32,
            "data.task_ids": TASKS, "grpo.tasks_per_step": 2, "grpo.mini_batches": 2, "grpo.steps": STEPS,
            "grpo.learning_rate": 1e-2, "grpo.keep_checkpoints": 1, "rollout.num_generations": 4,
            "rollout.max_turns": 1, "rollout.max_model_calls": 1, "rollout.max_new_tokens": 16,
            "rollout.parser": "lenient", "rollout.backend": "transformers", "rollout.max_context_tokens": 16384,
            "validation.every": 1, "validation.before_training": True, "validation.task_ids": HELD_OUT,
            "interface.tool_format": "signatures", "diagnoser.mode": "url", "diagnoser.url": diagnoser_url,
            "diagnoser.max_per_step": 2, "diagnoser.timeout_s": 10,
        }
        path = self.work / f"recipe-{self.part}.yaml"
        path.write_text(yaml.safe_dump(load_recipe(None, overrides).model_dump(mode="json")))
        return path

    def harness(self, mode: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--harness", mode, "--"]


def harness_main(arguments: list[str]) -> None:
    """``seal-lite ARGUMENTS`` with the scripted generation (a random model still gets mixed rewards)."""
    from tests.support.scripted_run import script_generation, sometimes_right

    script_generation(sometimes_right)
    from seal_lite.cli import main

    main(arguments, prog_name="seal-lite")


def report_own_logprobs() -> list[int]:
    """Make transformers generate report log-probs as vLLM and llama.cpp do: each returned token's log-probability
    under the model at the sampling temperature, scored by one forward pass per row (the ground-truth messages the
    script puts in were not sampled, so the generation's own scores would not cover them). Returns the list the
    lengths of the contexts it scores go to."""
    import torch

    from seal_lite.engines.transformers_generate import TransformersGenerator

    generate, lengths = TransformersGenerator.generate, []

    def generate_with_logprobs(self, batch, max_new_tokens, temperature):
        messages = generate(self, batch, max_new_tokens, temperature)
        lengths.extend(map(len, batch))
        self.sampled_logprobs = []
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"  # Unsloth's forward may skip the logits otherwise
        try:
            with torch.no_grad(), self.mode(self.model):
                for context, message in zip(batch, messages, strict=True):
                    ids = torch.tensor([context + message], device=self.model.device)
                    logits = self.model(input_ids=ids).logits[0, len(context) - 1 : -1].float() / (temperature or 1.0)
                    scores = logits.log_softmax(-1).gather(-1, ids[0, len(context):, None])[:, 0]
                    self.sampled_logprobs.append(scores.tolist())
        finally:
            os.environ.pop("UNSLOTH_RETURN_LOGITS")
        return messages

    TransformersGenerator.generate = generate_with_logprobs
    TransformersGenerator.sampled_logprobs = []  # the rollout asks before the first call whether there are any
    return lengths


@contextlib.contextmanager
def stub_diagnoser():
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that diagnoses each failed turn with the checker's own
    label (read from the prompt) and fixed texts: a schema-valid answer, in place of the llama.cpp model."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            label = re.search(r"Checker: (\S+)", body["messages"][-1]["content"])
            answer = {"label": label.group(1) if label else "wrong_call", "cause": None, "culprit_call_index": None,
                      "explanation": "stub diagnoser: the checker's label", "recovery_hint": "Check the call."}
            payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def watch_step(cuda: bool) -> dict:
    """Record what a SEAL step does in this process: the trainer ("trainer"); the dtype and 4-bit layers of the
    policy the paged engine plays ("policy") and the attention each forward of its plays ran with ("attention"); and
    around each ``release`` the memory PyTorch reserves and the memory free on the card, which the update's
    ``hold_budget`` sees (on a CPU only that it ran: "releases"). After a release the card's peak counter restarts,
    so that it measures the update."""
    import torch

    from seal_lite.engines.paged_rollouts import PagedGenerator
    from seal_lite.runs.rehearse import scale_fp16_losses
    from seal_lite.training.grpo import SealGRPOTrainer

    seen = {"attention": set(), "releases": []}
    init, play, release = SealGRPOTrainer.__init__, PagedGenerator._play, PagedGenerator.release

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        scale_fp16_losses(self)  # on a CPU, the GradScaler accelerate makes on a GPU (and makes none of here)
        seen["trainer"] = self

    def watched_play(self, *args, **kwargs):
        model = self.model.get_base_model()
        seen["policy"] = {"dtype": str(model.dtype).removeprefix("torch."),
                          "nf4": getattr(model, "is_loaded_in_4bit", False)}
        hook = model.register_forward_pre_hook(
            lambda module, arguments: seen["attention"].add(module.config._attn_implementation))
        try:
            return play(self, *args, **kwargs)
        finally:
            hook.remove()

    def watched_release(self):
        before = torch.cuda.memory_reserved() if cuda else None
        release(self)
        if cuda:
            seen["releases"].append({"reserved_before_gb": gigabytes(before),
                                     "reserved_after_gb": gigabytes(torch.cuda.memory_reserved()),
                                     "free_after_gb": gigabytes(torch.cuda.mem_get_info()[0])})
            torch.cuda.reset_peak_memory_stats()
        else:
            seen["releases"].append({"ran": True})

    SealGRPOTrainer.__init__, PagedGenerator._play, PagedGenerator.release = watched_init, watched_play, watched_release
    return seen


def judge_every_other_episode_passed() -> None:
    """Stand in for the official verdict in this process: within each group every other episode is judged passed
    (its turn labels stay the checker's), so rewards mix and the update trains on what the engine sampled. A random
    model passes nothing, and the scripted ground truth of the other parts would carry log-probs that the engine
    never sampled."""
    from seal_lite.step import algorithm

    diagnose, episodes = algorithm.diagnose_episode, itertools.count()

    def judged(task, records):
        return dataclasses.replace(diagnose(task, records), valid=next(episodes) % 2 == 0)

    algorithm.diagnose_episode = judged


@contextlib.contextmanager
def t4_attention(cuda: bool):
    """On a GPU, SDPA held to the kernels a T4 (sm75) has: memory-efficient and math, no flash or cuDNN attention.
    A CPU has no other kernels to rule out."""
    if not cuda:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def gigabytes(size: int) -> float:
    return round(size / 2**30, 3)


def read_store(db_path: Path) -> dict:
    """What run_resume checks in the run's store, read through seal-lite's own ``Store``."""
    from seal_lite.engines.store import Store

    store = Store.open_readonly(db_path)
    steps = [row["step"] for row in store.steps()]
    return {"steps": steps, "status": store.run()["status"], "checkpoints": store.checkpoints(),
            "metrics": {step: store.step_metrics(step) for step in steps},
            "diagnoses": store.db["diagnoses"].count_where("status = 'ok'"),
            "validation_steps": sorted({row["step"] for row in store.validations()})}


def tail(text: str, size: int = 1500) -> str:
    return text[-size:]


# --- running the parts -------------------------------------------------------------------------------------------

def run_part(part: str, out: Path, work: Path, cpu: bool) -> None:
    ctx = Context(out, work, part, cpu)
    result = {"cpu": cpu, "stand_ins": STAND_INS, "ok": None}
    ctx.save(result)
    started = time.time()
    try:
        result["ok"] = bool(globals()[part](ctx, result))
    except Exception as error:  # the part's file says what happened, and the next part still runs
        result |= {"ok": False, "error": f"{type(error).__name__}: {str(error)[-1500:]}"}
    result["seconds"] = round(time.time() - started, 1)
    ctx.save(result)


def run_all(parts: list[str], out: Path, cpu: bool) -> bool:
    """Each part in a process of its own, under its limit; a part's file ends with "ok" true or false."""
    out.mkdir(parents=True, exist_ok=True)
    passed = True
    with tempfile.TemporaryDirectory(prefix="gpu-e2e-") as work:
        for part in parts:
            limit = LIMITS[part] * (CPU_SCALE if cpu else 1)
            command = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--out", str(out),
                       "--work", work, *(["--cpu"] if cpu else [])]
            with open(Path(work) / f"{part}.log", "w") as log:
                try:
                    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                          timeout=limit).returncode
                    stopped = None if code == 0 else f"the part's process ended with exit code {code}"
                except subprocess.TimeoutExpired:
                    stopped = f"over its {limit} s limit"
            path = out / f"{part}.json"
            result = json.loads(path.read_text()) if path.exists() else {"part": part}
            if stopped or result.get("ok") is None:
                result |= {"ok": False, "error": result.get("error") or stopped or "the part did not finish",
                           "log": tail((Path(work) / f"{part}.log").read_text(errors="replace"))}
                path.write_text(json.dumps(result) + "\n")
            print(json.dumps(result), flush=True)
            passed = passed and result["ok"]
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for one JSON file per part")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, in order (default: {','.join(PARTS)}; also: {','.join(BENCHMARKS)})")
    parser.add_argument("--cpu", action="store_true",
                        help="the tiny model on the CPU, peft standing in for the GPU backends but in paged_fp16 "
                             "(the test suite's)")
    parser.add_argument("--part", choices=PARTS + BENCHMARKS, help=argparse.SUPPRESS)  # one part, in this process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--harness", choices=["cli"], help=argparse.SUPPRESS)  # seal-lite, scripted
    parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.harness:
        harness_main(args.arguments)
    elif args.part:
        run_part(args.part, args.out, args.work, args.cpu)
    else:
        if args.out is None:
            parser.error("--out is required")
        sys.exit(0 if run_all(args.parts.split(","), args.out, args.cpu) else 1)


if __name__ == "__main__":
    main()
