"""Throughput of seal-lite's environment side against the bare official checker, on the same trajectories.

For every BFCL multi-turn entry (or the first --limit), the ground-truth calls are played as a model would:
parsed, dispatched in the live environment, scored with the official verdict and labelled turn by turn.
The baseline is bfcl-eval's multi_turn_checker alone on the same call strings. Prints turns/s and the ratio.

    .venv/bin/python benchmarks/env_replay.py [--limit N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from seal_lite.diagnosis.labels import label_turn
from seal_lite.envs.bfcl import Environment, TurnRecord, load_tasks, official_verdict, turn_evidence

DATA = Path(__file__).parent.parent / "data"


def seal_lite_pass(tasks) -> None:
    for task in tasks:
        env = Environment(task)
        turns = []
        for index, calls in enumerate(task.ground_truth):
            record = TurnRecord(task.user_message(index))
            if calls:
                record.outcomes_per_step.append(env.run("[" + ", ".join(calls) + "]", index))
            turns.append(record)
        official_verdict(task, [t.executed_steps() for t in turns])
        [label_turn(e) for e in turn_evidence(task, turns)]


def checker_only(tasks) -> None:
    for task in tasks:
        official_verdict(task, [[calls] if calls else [] for calls in task.ground_truth])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=800)
    args = parser.parse_args()
    ids = (DATA / "train_ids.txt").read_text().split() + (DATA / "eval_ids.txt").read_text().split()
    tasks = load_tasks(ids[: args.limit])
    turns = sum(len(t.ground_truth) for t in tasks)
    timings = {}
    for name, work in (("official checker only", checker_only), ("seal-lite env + verdict + labels", seal_lite_pass)):
        start = time.perf_counter()
        work(tasks)
        timings[name] = time.perf_counter() - start
    for name, seconds in timings.items():
        print(f"{name:34s} {seconds:6.2f} s  {turns / seconds:8.0f} turns/s")
    base, ours = timings.values()
    print(f"seal-lite / checker time ratio: {ours / base:.2f}x on {len(tasks)} entries, {turns} turns")


if __name__ == "__main__":
    main()
