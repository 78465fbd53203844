"""Prompt tokens per task under the official view and the opt-in signatures view, for one model's tokenizer.

The prompt is the opening the policy reads (system message and first request), rendered by the model's chat
template exactly as `seal-lite prompt TASK_ID` prints it. Prints, per category and over all tasks, the mean,
median and largest count under each view and their ratio.

    .venv/bin/python benchmarks/prompt_tokens.py [--model qwen2.5-coder-0.5b] [--split eval|train|all] [--category base]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from transformers import AutoTokenizer

from seal_lite.core.interface import evaluation_interface
from seal_lite.engines.model_sources import resolve_model
from seal_lite.envs.bfcl import CATEGORIES, category_of, load_tasks
from seal_lite.step.rollout import turn_text

DATA = Path(__file__).parent.parent / "data"
VIEWS = ("signatures", "official")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template (a registry name)")
    parser.add_argument("--split", default="all", choices=["eval", "train", "all"])
    parser.add_argument("--category", choices=CATEGORIES, help="only this category")
    parser.add_argument("--first", type=int, help="only the first N tasks of each category, in the split's order")
    args = parser.parse_args()
    splits = ("train", "eval") if args.split == "all" else (args.split,)
    ids = [task_id for split in splits for task_id in (DATA / f"{split}_ids.txt").read_text().split()]
    ids = [i for i in ids if args.category is None or category_of(i) == args.category]
    if args.first:
        ids = [i for c in CATEGORIES for i in [i for i in ids if category_of(i) == c][: args.first]]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model), clean_up_tokenization_spaces=False)
    counts = {view: {} for view in VIEWS}
    for task in load_tasks(ids):
        for view in VIEWS:
            text = turn_text(tokenizer, task, 0, evaluation_interface(view))
            counts[view][task.id] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    print(f"{args.model}, {len(ids)} tasks ({args.split}): opening prompt tokens (mean / median / max)")
    print(f"{'category':14} {'signatures':>22} {'official':>22} {'ratio':>7}")
    for category in (*CATEGORIES, "all"):
        rows = [i for i in ids if category == "all" or category_of(i) == category]
        if not rows:
            continue
        cells = []
        for view in VIEWS:
            values = [counts[view][i] for i in rows]
            cells.append(f"{statistics.mean(values):7.0f} / {statistics.median(values):5.0f} / {max(values):5d}")
        ratio = sum(counts["official"][i] for i in rows) / sum(counts["signatures"][i] for i in rows)
        print(f"{category:14} {cells[0]:>22} {cells[1]:>22} {ratio:6.1f}x")


if __name__ == "__main__":
    main()
