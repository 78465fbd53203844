"""Held-out evaluation: greedy decoding, the plain interface, the official verdict (SEAL_METHOD.md §2 step 11).

Each task is played once, greedily, under ``evaluation_interface()`` (no training state can reach it) and
scored with bfcl-eval's multi-turn checker. Per category it reports the strict verdict, the paper's metric,
and the turn pass rate: the share of ground-truth turns labelled pass or correct_abstention. The turn pass rate
moves long before a small model solves a whole task.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from seal_lite.agent import Generator, rollout_group
from seal_lite.diagnosis.labels import SUCCESS_LABELS
from seal_lite.diagnosis.verifier import diagnose_episode
from seal_lite.envs.bfcl import CATEGORIES, Task
from seal_lite.interface import evaluation_interface
from seal_lite.recipe import Recipe, RolloutConfig

TABLE_ROWS = (*CATEGORIES, "mean")  # the paper's layout: one row per category, then their mean


@dataclass
class TaskResult:
    task_id: str
    category: str
    valid: bool  # the official verdict
    turns_passed: int
    turns: int
    labels: list[str]


def evaluate(tasks: list[Task], generator: Generator, rollout: RolloutConfig, tool_format: str) -> list[TaskResult]:
    """Play every task once with greedy decoding under the plain interface; score it like BFCL does."""
    greedy = rollout.model_copy(update={"temperature": 0.0})  # generators read 0 as argmax
    interface = evaluation_interface(tool_format)
    results = []
    for task in tasks:
        [trajectory] = rollout_group(task, 1, generator, greedy, interface)
        diagnosis = diagnose_episode(task, trajectory.turns)
        passed = sum(label in SUCCESS_LABELS for label in diagnosis.labels)
        results.append(TaskResult(task.id, task.category, diagnosis.valid, passed, len(diagnosis.labels),
                                   diagnosis.labels))
    return results


def summarize(results: list[TaskResult]) -> dict[str, dict[str, float]]:
    """{category: {tasks, accuracy, turn_pass_rate}} in the paper's column order, plus "mean": the unweighted
    mean over the categories present (the paper's overall score)."""
    table = {}
    for category in CATEGORIES:
        rows = [r for r in results if r.category == category]
        if rows:
            table[category] = {
                "tasks": len(rows),
                "accuracy": sum(r.valid for r in rows) / len(rows),
                "turn_pass_rate": sum(r.turns_passed for r in rows) / sum(r.turns for r in rows),
            }
    if table:
        table["mean"] = {
            "tasks": sum(row["tasks"] for row in table.values()),
            "accuracy": sum(row["accuracy"] for row in table.values()) / len(table),
            "turn_pass_rate": sum(row["turn_pass_rate"] for row in table.values()) / len(table),
        }
    return table


def result_rows(model_label: str, split: str, results: list[TaskResult]) -> list[dict]:
    """Rows of the store's ``evaluations`` table."""
    now = time.time()
    return [{"model": model_label, "task_id": r.task_id, "category": r.category, "split": split, "valid": r.valid,
             "turns_passed": r.turns_passed, "turns": r.turns, "labels": r.labels, "created_at": now}
            for r in results]


@contextlib.contextmanager
def evaluation_engine(recipe: Recipe, adapter: Path | None, work_dir: Path):
    """A generator for the recipe's policy model, with the LoRA adapter saved in ``adapter`` (a run's
    ``adapter/`` or checkpoint directory) or without one (the base model). The engine is the run's own
    (seal_lite.loop.rollout_engine): llama.cpp on a CPU for a GGUF model, else transformers."""
    from seal_lite.loop import rollout_engine
    from seal_lite.models import resolve_model
    from seal_lite.training.policy import load_policy

    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    model = policy.model
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with rollout_engine(recipe, model, policy.tokenizer, work_dir) as (generator, sync):
        if adapter is not None:
            sync(0)  # llama.cpp: export the adapter and load it (transformers already runs the PeftModel)
        yield generator
