"""Dynamic sampling's extra groups started in the step's own call, against played after it; same run, same machine.

``grpo.dynamic_sampling`` replaces a group whose rewards are all equal by another task's group. seal-lite starts
each extra group in the step's call as soon as a group ends without a signal (``SealStep._early_extras``); before,
the extra groups were drawn when the call was over and played in calls of their own, one round after another
(``AfterTheCall`` below: the same draws, made by ``_fill_with_signal`` alone). Both play cpu-learn.yaml's steps
(its frontier tasks, the base model, the llama.cpp engine, no update) on the same draws and sampling seeds, taking
turns first; each step starts with an empty cache, as after an update. Per step and variant: seconds, groups rolled
out (extras among them), engine calls, rewards. An extra group samples another stream in each variant, so a
step may need more extras in one than in the other: seconds per group rolled out is the figure to compare.

    python benchmarks/dynamic_sampling.py --steps 8 --out benchmarks/results/dynamic_sampling.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from seal_lite.core import timing
from seal_lite.core.recipe import load_recipe
from seal_lite.core.types import NoProgress
from seal_lite.engines.llamacpp import LlamaCppGenerator
from seal_lite.engines.model_sources import gguf_path, resolve_model
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep

ROOT = Path(__file__).resolve().parents[1]


class AfterTheCall(SealStep):
    """Dynamic sampling as it was: no group starts early, so the draws after the call play every extra group."""

    def _early_extras(self, task_ids):
        return lambda group: []


class Groups(NoProgress):
    """Counts the groups a step rolls out."""

    def __init__(self):
        self.groups = self.extras = 0

    def task_done(self, task_id, rewards, extra=False):
        self.groups, self.extras = self.groups + 1, self.extras + extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="steps per variant (each a draw of cpu-learn's tasks)")
    parser.add_argument("--out", type=Path, help="write the per-step figures here (JSON)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    recipe = load_recipe(ROOT / "recipes" / "cpu-learn.yaml")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(recipe.policy.model), clean_up_tokenization_spaces=False)
    tasks = {task.id: task.truncated(recipe.rollout.max_turns) for task in load_tasks(recipe.data.task_ids)}
    engine = LlamaCppGenerator(str(gguf_path(recipe.policy.model)), tokenizer,
                               n_ctx=recipe.rollout.max_context_tokens)

    def sync(step: int) -> None:
        engine.load_adapter(None)  # an empty cache, as after an update
        engine.reseed(recipe.seed, step)

    variants = {"in the call": SealStep, "after the call": AfterTheCall}
    progress = {name: Groups() for name in variants}
    steps = {name: kind(recipe, None, tasks, engine, progress[name], sync_policy=sync)
             for name, kind in variants.items()}
    rows = []
    for number in range(args.steps):
        draw = random.Random(f"draw-{number}").sample(sorted(tasks), recipe.grpo.tasks_per_step)
        order = list(variants) if number % 2 == 0 else list(reversed(variants))  # each goes first half the time
        for name in order:
            before = (progress[name].groups, progress[name].extras)
            timing.take()
            started = time.perf_counter()
            batch = steps[name](draw)
            seconds = time.perf_counter() - started
            phases = timing.take()
            row = {"step": number + 1, "variant": name, "draw": draw, "seconds": round(seconds, 1),
                   "groups": progress[name].groups - before[0], "extras": progress[name].extras - before[1],
                   "calls": engine.calls,  # counted from the step's sync, which reseeds the engine
                   "update_rewards": batch.rewards,
                   "prefill_s": round(phases.get("prefill", 0.0), 1), "decode_s": round(phases.get("decode", 0.0), 1)}
            rows.append(row)
            print(f"step {row['step']} {name:>14}: {row['seconds']:6.1f} s, {row['groups']} groups "
                  f"({row['extras']} extra), {row['calls']} calls", flush=True)
    engine.close()

    summary = {}
    for name in variants:
        mine = [row for row in rows if row["variant"] == name]
        seconds, groups = sum(row["seconds"] for row in mine), sum(row["groups"] for row in mine)
        summary[name] = {"seconds": round(seconds, 1), "groups": groups, "seconds_per_group": round(seconds / groups, 2),
                         "calls": sum(row["calls"] for row in mine)}
        print(f"{name:>14}: {seconds:7.1f} s for {groups} groups ({seconds / groups:.1f} s a group), "
              f"{summary[name]['calls']} engine calls")
    by_step = {}
    for row in rows:
        by_step.setdefault(row["step"], {})[row["variant"]] = row
    same = [pair for pair in by_step.values() if pair["in the call"]["groups"] == pair["after the call"]["groups"]]
    ratios = [pair["after the call"]["seconds"] / pair["in the call"]["seconds"] for pair in same]
    if ratios:
        print(f"steps with as many groups in both ({len(same)} of {len(by_step)}): after/in the call "
              f"{statistics.mean(ratios):.2f}x on average (range {min(ratios):.2f}-{max(ratios):.2f})")
    per_group = summary["after the call"]["seconds_per_group"] / summary["in the call"]["seconds_per_group"]
    print(f"seconds per group rolled out, after/in the call: {per_group:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "per_group_ratio": round(per_group, 2),
                                        "same_groups_ratios": [round(r, 2) for r in ratios], "steps": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
