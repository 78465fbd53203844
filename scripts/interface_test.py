"""Does the evolved training interface (φ_err, φ_cap) change what training sees and what it teaches?

The pre-registered test of docs/results/interface-test.md. Part A: the base model plays each pool task k = 12 times
under each arm of φ_err {off, on} × φ_cap {off, the state-0 block}, sample i of the j-th task seeded 10000 + 100·j + i
in every arm; then the 32 probes 4 times each in the plain arm, keeping each one's first failed first message (for
Part B's J4); and the same 2×2 on recipes/library.yaml's training tasks. Records go to docs/results/interface-test/
as each task ends, so a stopped run goes on at the next task.

    .venv/bin/python scripts/interface_test.py part-a          # about 80 minutes on 2 cores
    .venv/bin/python scripts/interface_test.py library         # about 20 minutes
    .venv/bin/python scripts/interface_test.py --summary-only  # every figure, from the records

Part B (updates, probes) is not written yet; its records will sit beside these.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from cpu_experiment import machine as cpu_machine  # noqa: E402

RECORDS = ROOT / "docs" / "results" / "interface-test"
SETS = ROOT / "data" / "mechanism"
SAMPLES = 12
J4_SAMPLES = 4
RESAMPLES = 100_000  # the bootstrap's and the sign-flip test's, pre-registered
STATE0_BLOCK = ("When a request needs an action, call the tools; do not only describe what you would do.",
                "Call the tools that show the user what they asked for, and report the results.")
ARMS = {"plain": (False, False), "err": (True, False), "cap": (False, True), "both": (True, True)}  # (φ_err, φ_cap)
ARGUMENT_BLIND = ("multi_turn_long_context_43", "multi_turn_long_context_103", "multi_turn_long_context_111",
                  "multi_turn_long_context_142")  # pool tasks that pass with every argument wrong
J4_FAILURES = ("parse_error", "unknown_tool")


@dataclass
class Design:
    """The pre-registered values; tests shrink them."""

    recipe: Path = ROOT / "recipes" / "cpu-learn.yaml"
    library_recipe: Path = ROOT / "recipes" / "library.yaml"
    overrides: dict = field(default_factory=dict)
    records: Path = RECORDS
    sets: Path = SETS
    samples: int = SAMPLES
    j4_samples: int = J4_SAMPLES

    def read_set(self, name: str) -> list[str]:
        from seal_lite.runs.tasks import read_task_file

        return read_task_file(self.sets / f"{name}.txt")


def sample_seed(task_index: int, sample: int) -> int:
    return 10000 + 100 * task_index + sample


def interface_of(arm: str, tool_format: str):
    from seal_lite.core.interface import TrainingInterface

    err, cap = ARMS[arm]
    return TrainingInterface(recovery_feedback=err, guidelines=STATE0_BLOCK if cap else (), tool_format=tool_format)


def learning_signal(passes: int, samples: int, subset: int = 4) -> float:
    """The share of the ``subset``-sample subsets of ``samples`` plays with unequal rewards (a GRPO group of that
    size would learn from them)."""
    equal = math.comb(passes, subset) + math.comb(samples - passes, subset)
    return 1 - equal / math.comb(samples, subset)


def first_message_failed(turns) -> bool:
    """Whether the episode's first model message made a call that failed (rejected, unknown, bad arguments, or an
    error from the tool). A message without a call ends the turn and makes no outcome."""
    steps = turns[0].outcomes_per_step if turns else []
    return bool(steps) and any(outcome.status.value != "ok" for outcome in steps[0])


def play(recipe, tasks: list, arms: Sequence[str], samples: int, out: Path, keep_failed: bool = False) -> None:
    """Each task ``samples`` times under each arm; one record per arm, rewritten after each task (so a stopped run
    goes on at the next task). ``keep_failed``: also keep each play's first message and its outcomes when that
    message failed as J4 needs."""
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy
    from seal_lite.engines.rollout_engine import rollout_engine
    from seal_lite.step.rollout import opening_messages, rollout_groups
    from seal_lite.step.verifier import diagnose_episode

    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    out.mkdir(parents=True, exist_ok=True)
    work = ROOT / "runs" / "interface-test"  # the engine's files (none for the base model's GGUF), out of git
    work.mkdir(parents=True, exist_ok=True)
    with rollout_engine(recipe, policy.model, policy.tokenizer, work, None) as (generator, _):
        for arm in arms:
            path = out / f"{arm}.json"
            record = json.loads(path.read_text()) if path.exists() else {"arm": arm, "tasks": {}}
            interface = interface_of(arm, recipe.interface.tool_format)
            record["system_prompt"] = opening_messages(tasks[0], interface)[0]["content"]
            for index, task in enumerate(tasks):
                if task.id in record["tasks"]:
                    continue
                started, plays = time.perf_counter(), []
                for sample in range(samples):
                    generator.reseed(sample_seed(index, sample))  # llama.cpp's own sampling stream
                    [[trajectory]] = rollout_groups([(task, interface)], 1, generator, recipe.rollout)
                    diagnosis = diagnose_episode(task, trajectory.turns)
                    failed = first_message_failed(trajectory.turns)
                    row = {"sample": sample, "reward": float(diagnosis.valid), "labels": diagnosis.labels,
                           "causes": diagnosis.causes, "first_failed": failed,
                           "model_calls": trajectory.num_model_calls}
                    if keep_failed and failed:
                        first = trajectory.turns[0].outcomes_per_step[0]
                        row["first_message"] = next(m["content"] for m in trajectory.messages
                                                    if m["role"] == "assistant")
                        row["first_statuses"] = [outcome.status.value for outcome in first]
                    plays.append(row)
                record["tasks"][task.id] = {"plays": plays, "seconds": round(time.perf_counter() - started, 1)}
                record |= cpu_and_dtype(policy)
                path.write_text(json.dumps(record, indent=1) + "\n")
                print(f"{arm} {index + 1}/{len(tasks)} {task.id}: {sum(p['reward'] for p in plays):g}/{samples} "
                      f"passed, {record['tasks'][task.id]['seconds']} s", flush=True)


def cpu_and_dtype(policy) -> dict:
    return {"machine": cpu_machine(), "dtype": str(policy.model.dtype).removeprefix("torch.")}


def pool_recipe(design: Design):
    from seal_lite.core.recipe import load_recipe

    return load_recipe(design.recipe, {"diagnoser.mode": "off", "interface.schema_cues": False, **design.overrides})


def part_a(design: Design) -> None:
    from seal_lite.envs.bfcl import load_tasks

    recipe = pool_recipe(design)
    pool = [task.truncated(1) for task in load_tasks(design.read_set("pool"))]
    play(recipe, pool, list(ARMS), design.samples, design.records / "part-a")
    probes = [task.truncated(1) for task in load_tasks(design.read_set("probe"))]
    play(recipe, probes, ["plain"], design.j4_samples, design.records / "j4", keep_failed=True)
    j4_messages(design)


def j4_messages(design: Design) -> dict:
    """Each probe's first failed first message (a parse error or an unknown tool) from its plain plays: J4's
    contexts."""
    record = json.loads((design.records / "j4" / "plain.json").read_text())
    kept = {}
    for task_id, entry in record["tasks"].items():
        failed = [p for p in entry["plays"] if p.get("first_statuses")
                  and any(status in J4_FAILURES for status in p["first_statuses"])]
        if failed:
            kept[task_id] = {"message": failed[0]["first_message"], "statuses": failed[0]["first_statuses"],
                             "sample": failed[0]["sample"]}
    (design.records / "j4-messages.json").write_text(json.dumps({"messages": kept, "count": len(kept)}, indent=1)
                                                      + "\n")
    return kept


def library(design: Design) -> None:
    from seal_lite.core.recipe import load_recipe
    from seal_lite.runs.tasks import select_task_ids, slice_tasks

    recipe = load_recipe(design.library_recipe, {"diagnoser.mode": "off", "interface.schema_cues": False,
                                                 **design.overrides})
    tasks = list(slice_tasks(recipe, select_task_ids(recipe)).values())
    play(recipe, tasks, list(ARMS), design.samples, design.records / "library")


# ---- the analysis, from the records -----------------------------------------------------------------------------

def sign_flip_p(differences: Sequence[float], flips: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided sign-flip test of a mean difference of 0 over paired units."""
    import numpy as np

    values = np.asarray(differences, dtype=float)
    if not len(values) or not values.any():
        return 1.0
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(flips, len(values)))
    observed = abs(values.mean())
    return float((np.abs((signs * values).mean(axis=1)) >= observed - 1e-12).mean())


def bootstrap_interval(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over units."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
    means = values[draws].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def per_task(record: dict) -> dict[str, dict]:
    """Each task's pass rate, learning signal and recovery (passes among plays whose first message failed; None
    when none did) under one arm."""
    out = {}
    for task_id, entry in record["tasks"].items():
        plays = entry["plays"]
        passes = sum(p["reward"] for p in plays)
        failed = [p for p in plays if p["first_failed"]]
        out[task_id] = {"pass_rate": passes / len(plays), "signal": learning_signal(int(passes), len(plays)),
                        "recovery": sum(p["reward"] for p in failed) / len(failed) if failed else None}
    return out


def main_effects(arms: dict[str, dict[str, dict]], measure: str, leave_out: Sequence[str] = ()) -> dict:
    """The main effects of φ_err and φ_cap and their interaction on ``measure``, over the tasks every arm has (and
    a value for): mean over tasks of (on − off) averaged over the other factor, with its bootstrap interval and
    sign-flip p."""
    tasks = [t for t in arms["plain"] if t not in leave_out
             and all(t in arms[a] and arms[a][t][measure] is not None for a in ARMS)]
    if not tasks:
        return {"tasks": 0}
    value = {a: [arms[a][t][measure] for t in tasks] for a in ARMS}
    contrasts = {
        "phi_err": [(e + b - p - c) / 2 for p, e, c, b in zip(*(value[a] for a in ARMS))],
        "phi_cap": [(c + b - p - e) / 2 for p, e, c, b in zip(*(value[a] for a in ARMS))],
        "interaction": [(b - c) - (e - p) for p, e, c, b in zip(*(value[a] for a in ARMS))],
    }
    out = {"tasks": len(tasks), "means": {a: sum(v) / len(v) for a, v in value.items()}}
    for name, differences in contrasts.items():
        out[name] = {"mean": sum(differences) / len(differences), "interval": bootstrap_interval(differences),
                     "p": sign_flip_p(differences)}
    return out


def read_arms(folder: Path) -> dict[str, dict] | None:
    if not all((folder / f"{arm}.json").exists() for arm in ARMS):
        return None
    return {arm: json.loads((folder / f"{arm}.json").read_text()) for arm in ARMS}


def summary(design: Design) -> None:
    """Every figure of Part A and the library play, from the records; no primary figure before every planned
    record exists (a partial run prints its progress only)."""
    pool = design.read_set("pool")
    for name, folder, planned, leave_out in (("Part A (pool)", design.records / "part-a", pool, ARGUMENT_BLIND),
                                             ("library", design.records / "library", None, ())):
        records = read_arms(folder)
        if records is None:
            present = sorted(p.stem for p in folder.glob("*.json")) if folder.exists() else []
            print(f"{name}: not recorded yet (arms present: {', '.join(present) or 'none'})")
            continue
        done = {arm: len(r["tasks"]) for arm, r in records.items()}
        expected = len(planned) if planned else max(done.values())
        if any(count < expected for count in done.values()):
            print(f"{name}: in progress, tasks recorded per arm {done} of {expected}; no figure before the end")
            continue
        arms = {arm: per_task(r) for arm, r in records.items()}
        seconds = sum(e["seconds"] for r in records.values() for e in r["tasks"].values())
        plays = sum(len(e["plays"]) for r in records.values() for e in r["tasks"].values())
        print(f"{name}: {expected} tasks x {design.samples} plays x 4 arms, {seconds / plays:.2f} s a play "
              f"({records['plain']['machine']}, {records['plain']['dtype']})")
        for measure in ("pass_rate", "signal", "recovery"):
            for label, leave in (("all tasks", ()), ("without the argument-blind tasks", leave_out)):
                if label != "all tasks" and not leave:
                    continue
                effects = main_effects(arms, measure, leave)
                if not effects["tasks"]:
                    continue
                means = ", ".join(f"{a} {v:.3f}" for a, v in effects["means"].items())
                print(f"  {measure}, {label} ({effects['tasks']} tasks): {means}")
                for contrast in ("phi_err", "phi_cap", "interaction"):
                    e = effects[contrast]
                    print(f"    {contrast}: {e['mean']:+.3f} [{e['interval'][0]:+.3f}, {e['interval'][1]:+.3f}], "
                          f"sign-flip p {e['p']:.3f}")
        labels = {arm: Counter(label for e in r["tasks"].values() for p in e["plays"] for label in p["labels"])
                  for arm, r in records.items()}
        print("  labels: " + "; ".join(f"{arm} {dict(count)}" for arm, count in labels.items()))
    j4 = design.records / "j4-messages.json"
    if j4.exists():
        print(f"J4: {json.loads(j4.read_text())['count']} of {len(design.read_set('probe'))} probes kept a failed "
              "first message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=["part-a", "library"], help="the part to run")
    parser.add_argument("--summary-only", action="store_true", help="print the recorded figures, run nothing")
    args = parser.parse_args()
    design = Design()
    if args.part and not args.summary_only:
        {"part-a": part_a, "library": library}[args.part](design)
    summary(design)


if __name__ == "__main__":
    main()
