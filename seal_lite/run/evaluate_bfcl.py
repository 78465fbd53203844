"""Held-out evaluation: greedy decoding, the official surface, the official verdict (docs/method.md §2 step 11).

Each task is played once, greedily, under ``evaluation_interface()`` (no training state can reach it): BFCL's
tool block with every doc in full, the strict parser, and no cap on the model messages of a turn (a turn ends
when the model answers without a tool call; the episode's budgets come from the recipe). It is scored with
bfcl-eval's multi-turn checker. Per category it reports the strict verdict, the paper's metric, and the turn
pass rate: the share of ground-truth turns labelled pass or correct_abstention. The turn pass rate moves long
before a small model solves a whole task.

The one opt-out is ``view="signatures"`` (one line per tool): its results are not BFCL multi-turn scores, and
every label they are shown or stored under says so (``view_label``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.interface import NOT_BFCL_VIEW, evaluation_interface
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.core.recipe import Recipe, RolloutConfig
from seal_lite.envs.bfcl import CATEGORIES, Task
from seal_lite.step.rollout import Generator, rollout_groups
from seal_lite.step.verifier import diagnose_episode

TABLE_ROWS = (*CATEGORIES, "mean")  # the paper's layout: one row per category, then their mean


@dataclass
class TaskResult:
    task_id: str
    category: str
    valid: bool  # the official verdict
    turns_passed: int
    turns: int
    labels: list[str]


OFFICIAL_CONTEXT_TOKENS = 16384  # the paper's model context: the official tool block alone is 3-6k tokens


def evaluation_rollout(rollout: RolloutConfig) -> RolloutConfig:
    """The recipe's budgets with the official surface's rules: greedy (generators read temperature 0 as argmax),
    strict parsing, no per-turn cap, and at least the paper's context, so the full tool docs always fit."""
    return rollout.model_copy(update={
        "temperature": 0.0, "parser": "strict", "max_calls_per_turn": None,
        "max_context_tokens": max(rollout.max_context_tokens, OFFICIAL_CONTEXT_TOKENS),
    })


def view_label(model_label: str, view: str) -> str:
    """How a result is named where it is printed and stored: marked when it is not the BFCL view."""
    return model_label if view == "official" else f"{model_label} [{view} view: {NOT_BFCL_VIEW}]"


def evaluate(tasks: list[Task], generator: Generator, rollout: RolloutConfig, view: str = "official",
             on_result: Callable[[TaskResult], None] = lambda result: None) -> list[TaskResult]:
    """Play every task once with greedy decoding under the plain interface; score it like BFCL does.
    ``on_result`` sees each task's result as soon as its batch is done (one task at a time on llama.cpp)."""
    greedy = evaluation_rollout(rollout)
    interface = evaluation_interface(view)
    batch = (greedy.generation_batch_size or len(tasks)) if getattr(generator, "batches_tasks", False) else 1
    results = []
    for start in range(0, len(tasks), batch):
        chunk = tasks[start : start + batch]
        groups = rollout_groups([(task, interface) for task in chunk], 1, generator, greedy)
        for task, [trajectory] in zip(chunk, groups, strict=True):
            diagnosis = diagnose_episode(task, trajectory.turns)
            passed = sum(label in SUCCESS_LABELS for label in diagnosis.labels)
            results.append(TaskResult(task.id, task.category, diagnosis.valid, passed, len(diagnosis.labels),
                                      diagnosis.labels))
            on_result(results[-1])
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
             "turns_passed": r.turns_passed, "turns": r.turns, "labels": r.labels, "benchmark": "bfcl",
             "reward": float(r.valid), "created_at": now}
            for r in results]


@contextlib.contextmanager
def evaluation_engine(recipe: Recipe, adapter: Path | None, work_dir: Path):
    """A generator for the recipe's policy model, with the LoRA adapter saved in ``adapter`` (a run's
    ``adapter/`` or checkpoint directory) or without one (the base model). The engine is the run's own
    (seal_lite.engines.rollout_engine.rollout_engine): llama.cpp on a CPU for a GGUF model, else transformers."""
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy, with_adapter
    from seal_lite.engines.rollout_engine import rollout_engine

    recipe = recipe.model_copy(update={"rollout": evaluation_rollout(recipe.rollout)})
    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    model = policy.model if adapter is None else with_adapter(policy.model, adapter)
    with rollout_engine(recipe, model, policy.tokenizer, work_dir, policy.generation_mode) as (generator, sync):
        if adapter is not None:
            sync(0)  # llama.cpp: export the adapter and load it (transformers already runs the PeftModel)
        yield generator
