"""Issue 41's experiment, pre-registered in docs/results.md: SEAL against vanilla GRPO on tasks where SEAL's labels
act (two-turn miss_param tasks whose first turn must be declined, beside base tasks), seeds paired, power stated.

This file fixes the design before anything runs: the arms, the candidate training tasks, the 48 held-out tasks
(``--design`` writes them to data/heldout/seal-vs-vanilla.txt and prints the power table of the pre-registration).

    .venv/bin/python scripts/seal_vs_vanilla.py --design
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipes/cpu-learn.yaml"
# every arm: the recipe with the first two user turns, 12 steps, rule labels
COMMON = ["rollout.max_turns=2", "grpo.steps=12", "diagnoser.mode=off"]
OFF = {"interface.schema_cues": "false", "interface.recovery_feedback": "false", "interface.capability_hints": "false",
       "grpo.diagnosis_weighting": "false", "grpo.closed_loop": "false"}
ARMS = {  # arm -> the values of the five method fields (the paper's SEAL: phi_schema, weighting, closed-loop rho)
    "vanilla": OFF,
    "seal": {**OFF, "interface.schema_cues": "true", "grpo.diagnosis_weighting": "true", "grpo.closed_loop": "true"},
    "reweight": {**OFF, "grpo.diagnosis_weighting": "true", "grpo.closed_loop": "true"},  # only if budget allows
}
SEEDS = range(8)  # paired: a seed draws the same tasks in the same order in every arm
HELD_OUT_FILE = ROOT / "data" / "heldout" / "seal-vs-vanilla.txt"
HELD_OUT_PER_KIND = 24
SAMPLES = 4  # held-out samples per task at temperature 1, beside the greedy one


def declines_first(task) -> bool:
    """A miss_param task whose first turn lacks a parameter: its ground truth there is no call."""
    return task.category == "miss_param" and len(task.turns) >= 2 and task.ground_truth[0] == []


def candidates(split: str) -> dict[str, list[str]]:
    """The tasks of ``split`` of each kind: {"miss_param": those that decline first, "base": every base task}."""
    from seal_lite.envs.bfcl import load_tasks, split_ids

    tasks = load_tasks([task_id for task_id in split_ids(split)
                        if task_id.startswith(("multi_turn_miss_param_", "multi_turn_base_"))])
    return {"miss_param": [task.id for task in tasks if declines_first(task)],
            "base": [task.id for task in tasks if task.category == "base"]}


def stratified(task_ids: list[str], count: int) -> list[str]:
    """``count`` tasks spread over their sets of API classes: one task of each set in turn (sets in order of
    their first task, tasks in split order) until ``count`` are taken."""
    from seal_lite.envs.bfcl import load_tasks

    groups: dict[tuple, list[str]] = {}
    for task in load_tasks(task_ids):
        groups.setdefault(tuple(sorted(task.involved_classes)), []).append(task.id)
    chosen = []
    for layer in itertools.zip_longest(*groups.values()):
        chosen += [task_id for task_id in layer if task_id is not None]
    return chosen[:count]


def held_out_ids() -> list[str]:
    """The 48 held-out tasks: 24 that decline first and 24 base tasks of the eval split, stratified by classes."""
    kinds = candidates("eval")
    return [*stratified(kinds["miss_param"], HELD_OUT_PER_KIND), *stratified(kinds["base"], HELD_OUT_PER_KIND)]


def sign_flip_power(effect: float, pair_sd: float, pairs: int, alpha: float = 0.05, sims: int = 4000,
                    seed: int = 0) -> float:
    """Power of the primary test, an exact two-sided sign-flip test over ``pairs`` seed differences, when each
    difference is normal with mean ``effect`` and standard deviation ``pair_sd`` (simulated)."""
    import numpy as np

    draw = np.random.default_rng(seed)
    differences = draw.normal(effect, pair_sd, size=(sims, pairs))
    signs = np.array(list(itertools.product((1, -1), repeat=pairs)))
    observed = np.abs(differences.sum(axis=1))
    p = (np.abs(signs @ differences.T) >= observed - 1e-12).mean(axis=0)
    return float((p < alpha).mean())


def detectable(pair_sd: float, pairs: int, power: float = 0.8) -> int | None:
    """The smallest effect, in whole points, the primary test detects with ``power`` (None: none up to 60)."""
    return next((effect for effect in range(1, 61) if sign_flip_power(effect, pair_sd, pairs) >= power), None)


def power_table(seed_sds=(6.0, 8.0, 11.7), correlations=(0.0, 0.4), pairs=(5, 6, 8)) -> list[dict]:
    """The detectable effect for each spread of one seed's score, correlation of paired seeds and number of pairs."""
    rows = []
    for seed_sd, correlation in itertools.product(seed_sds, correlations):
        pair_sd = seed_sd * (2 * (1 - correlation)) ** 0.5
        rows.append({"seed_sd": seed_sd, "correlation": correlation, "pair_sd": pair_sd,
                     "detectable": {n: detectable(pair_sd, n) for n in pairs}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", action="store_true", help="write the held-out tasks and print the power table")
    args = parser.parse_args()
    if args.design:
        ids = held_out_ids()
        HELD_OUT_FILE.parent.mkdir(parents=True, exist_ok=True)
        HELD_OUT_FILE.write_text("# issue 41's held-out tasks: scripts/seal_vs_vanilla.py --design\n"
                                 + "\n".join(ids) + "\n")
        kinds = candidates("train")
        print(f"held out: {len(ids)} tasks -> {HELD_OUT_FILE.relative_to(ROOT)}")
        print(f"training candidates: {len(kinds['miss_param'])} miss_param that decline first, "
              f"{len(kinds['base'])} base")
        print("\n| one seed's score SD, points | correlation of paired seeds | SD of a pair's difference | "
              "detectable at 80% power: 5 pairs | 6 pairs | 8 pairs |")
        print("|---|---|---|---|---|---|")
        for row in power_table():
            cells = " | ".join(str(row["detectable"][n] or "never") for n in (5, 6, 8))
            print(f"| {row['seed_sd']:g} | {row['correlation']:g} | {row['pair_sd']:.1f} | {cells} |")


if __name__ == "__main__":
    main()
