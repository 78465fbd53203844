"""Throughput of seal-lite's environment side against the bare official checker, on the same trajectories.

The trajectories are the ground truth of every BFCL multi-turn entry (or the first --limit) and the mutation
corpus built from it (tests/support/mutations.py). seal-lite's path is what a rollout costs after generation:
every call string parsed, dispatched in a live environment, scored with the official verdict, checked for
irrelevance and labelled turn by turn. The baseline is bfcl-eval's multi_turn_checker alone on the same call
strings; it stops at a trajectory's first failing turn, where the diagnosis goes on through every turn. Prints
turns/s for both and the ratio, then seal-lite's path spread over worker processes (`seal-lite verify`).

    .venv/bin/python benchmarks/env_throughput.py [--limit 800] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the mutation corpus is test scaffolding: tests/support

from seal_lite.envs.bfcl import load_tasks, official_verdict
from seal_lite.envs.registry import replay_calls
from seal_lite.runs.verify import verify_lines
from seal_lite.step.verifier import diagnose_episode
from tests.support.mutations import corpus

DATA = Path(__file__).parent.parent / "data"


def as_steps(turns):
    return [[calls] if calls else [] for calls in turns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=800, help="entries to use (default: all 800)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for the parallel pass")
    args = parser.parse_args()
    ids = (DATA / "train_ids.txt").read_text().split() + (DATA / "eval_ids.txt").read_text().split()
    tasks = {task.id: task for task in load_tasks(ids[: args.limit])}
    episodes = [(task_id, task.ground_truth) for task_id, task in tasks.items()]
    episodes += [(mutant.task_id, mutant.turns) for mutant in corpus(list(tasks.values()))]
    turns = sum(len(tasks[task_id].ground_truth) for task_id, _ in episodes)
    print(f"{len(episodes)} trajectories ({len(tasks)} ground truth + mutants), {turns} user turns")

    start = time.perf_counter()
    for task_id, calls in episodes:
        official_verdict(tasks[task_id], as_steps(calls))
    checker_s = time.perf_counter() - start

    start = time.perf_counter()
    valid = 0
    for task_id, calls in episodes:
        valid += diagnose_episode(tasks[task_id], replay_calls(tasks[task_id], as_steps(calls))).valid
    seal_s = time.perf_counter() - start

    lines = [json.dumps({"id": task_id, "turns": calls}) for task_id, calls in episodes]
    start = time.perf_counter()
    records = list(verify_lines(lines, workers=args.workers))
    parallel_s = time.perf_counter() - start
    assert sum(bool(r["valid"]) for r in records) == valid, "parallel and serial verdicts differ"

    print(f"{'official checker only':44s} {checker_s:6.2f} s {turns / checker_s:8.0f} turns/s")
    print(f"{'seal-lite replay + verdict + diagnosis':44s} {seal_s:6.2f} s {turns / seal_s:8.0f} turns/s")
    print(f"{f'seal-lite verify, {args.workers} worker processes':44s} {parallel_s:6.2f} s {turns / parallel_s:8.0f} turns/s")
    print(f"seal-lite / checker time ratio: {seal_s / checker_s:.2f}x; "
          f"{args.workers} workers vs serial: {seal_s / parallel_s:.2f}x faster; {valid} of {len(episodes)} valid")


if __name__ == "__main__":
    main()
