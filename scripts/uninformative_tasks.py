"""How many BFCL multi-turn tasks have turns whose verdict cannot tell the skill from a guess
(seal_lite/step/uninformative.py), per category and split, on the first turn and on any turn.

    .venv/bin/python scripts/uninformative_tasks.py            # the counts (about 40 s on 2 cores)
    .venv/bin/python scripts/uninformative_tasks.py --list     # and the tasks a screen leaves out

Every figure is computed from bfcl-eval's data and its checker; no model runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seal_lite.envs.bfcl import CATEGORIES, category_of, load_tasks, split_ids
from seal_lite.step.uninformative import any_call_turns, argument_blind_turns

TESTS = {"any call passes (left out of screens)": any_call_turns,
         "wrong arguments pass (reported only)": argument_blind_turns}


def counts() -> dict[str, dict[str, list[str]]]:
    """{test: {"first turn" | "any turn": [task ids]}} over both SEAL splits (800 tasks)."""
    tasks = load_tasks(split_ids("train") + split_ids("eval"))
    found = {}
    for name, test in TESTS.items():
        turns = {task.id: test(task) for task in tasks}
        found[name] = {"first turn": [task_id for task_id, hit in turns.items() if 0 in hit],
                       "any turn": [task_id for task_id, hit in turns.items() if hit]}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="also list the tasks a screen leaves out")
    args = parser.parse_args()
    found = counts()
    splits = {split: set(split_ids(split)) for split in ("train", "eval")}
    print(f"| test | turn | {' | '.join(CATEGORIES)} | train | eval | all 800 |")
    print("|---|---|" + "---|" * (len(CATEGORIES) + 3))
    for name, by_turn in found.items():
        for turn, ids in by_turn.items():
            per_category = [sum(category_of(task_id) == category for task_id in ids) for category in CATEGORIES]
            per_split = [len(splits[split] & set(ids)) for split in ("train", "eval")]
            print(f"| {name} | {turn} | {' | '.join(map(str, per_category))} | {' | '.join(map(str, per_split))} "
                  f"| {len(ids)} |")
    if args.list:
        excluded = found[next(iter(TESTS))]["any turn"]
        print("\nleft out of screens (any turn):", " ".join(sorted(excluded)))


if __name__ == "__main__":
    main()
