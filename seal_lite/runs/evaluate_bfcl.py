"""Held-out evaluation: greedy decoding, the official surface, the official verdict (docs/method.md §2 step 11).

Each task is played once, greedily, under ``evaluation_interface()`` (no training state can reach it): BFCL's
tool block with every doc in full, the strict parser, and no cap on the model messages of a turn (a turn ends
when the model answers without a tool call; the episode's budgets come from the recipe); a recipe in a
Llama-family format (``rollout.parser`` toolace or llama3.1) is played in that format, as the release plays it.
It is scored with bfcl-eval's multi-turn checker. Per category it reports the strict verdict, the paper's metric,
and the turn pass rate: the share of ground-truth turns labelled pass or correct_abstention. The turn pass rate
moves long before a small model solves a whole task.

The one opt-out is ``view="signatures"`` (one line per tool): its results are not BFCL multi-turn scores, and
every label they are shown or stored under says so (``view_label``).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.calls import call_format, evaluation_parser
from seal_lite.core.errors import ConfigError, RunError
from seal_lite.core.interface import NOT_BFCL_VIEW, evaluation_interface
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.core.recipe import Recipe, RolloutConfig, load_recipe
from seal_lite.core.recipe_sections import OFFICIAL_CONTEXT_TOKENS
from seal_lite.core.types import Trajectory
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import CATEGORIES
from seal_lite.envs.registry import find_environment
from seal_lite.envs.task import Environment, Task
from seal_lite.step.rollout import Generator, by_shared_prefix, rollout_groups, task_batches
from seal_lite.step.verifier import diagnose_episode


@dataclass
class TaskResult:
    task_id: str
    category: str
    valid: bool  # the official verdict
    turns_passed: int
    turns: int
    labels: list[str]


def evaluation_rollout(rollout: RolloutConfig, min_context: int = OFFICIAL_CONTEXT_TOKENS) -> RolloutConfig:
    """The recipe's budgets with the official surface's rules: greedy (generators read temperature 0 as argmax),
    strict parsing (in the recipe's format), no per-turn cap, and at least ``min_context`` tokens (the paper's
    context, so BFCL's full tool docs always fit)."""
    return rollout.model_copy(update={
        "temperature": 0.0, "parser": evaluation_parser(rollout.parser), "max_calls_per_turn": None,
        "max_context_tokens": max(rollout.max_context_tokens, min_context),
    })


def view_label(model_label: str, view: str) -> str:
    """How a result is named where it is printed and stored: marked when it is not the BFCL view."""
    return model_label if view == "official" else f"{model_label} [{view} view: {NOT_BFCL_VIEW}]"


def evaluate(tasks: list[Task], generator: Generator, rollout: RolloutConfig, view: str = "official",
             on_result: Callable[[TaskResult], None] = lambda result: None,
             min_context: int = OFFICIAL_CONTEXT_TOKENS) -> list[TaskResult]:
    """Play every task once with greedy decoding under the plain interface; score it like BFCL does. Tasks sharing
    tool classes are played next to each other (they share their prompt's tool block), at most
    ``generation_batch_size`` at once (``task_batches``); ``on_result`` sees each task's result as soon as it is
    played. Results come in task order. ``min_context``: the context the episodes may fill, at least (the engine
    must hold it)."""
    greedy = evaluation_rollout(rollout, min_context)
    interface = evaluation_interface(view, call_format(greedy.parser))
    by_id = {task.id: task for task in tasks}
    results = {}

    def score(group: list[Trajectory]) -> None:
        [trajectory] = group
        task = by_id[trajectory.task_id]
        diagnosis = diagnose_episode(task, trajectory.turns)
        passed = sum(label in SUCCESS_LABELS for label in diagnosis.labels)
        results[task.id] = TaskResult(task.id, task.category, diagnosis.valid, passed, len(diagnosis.labels),
                                      diagnosis.labels)
        on_result(results[task.id])

    for batch in task_batches(by_shared_prefix(tasks), 1, generator, greedy):
        rollout_groups([(task, interface) for task in batch], 1, generator, greedy, on_group=score)
    return [results[task.id] for task in tasks]


def summarize(results: list[TaskResult]) -> dict[str, dict[str, float]]:
    """{category: {tasks, accuracy, turn_pass_rate}}, BFCL's in the paper's column order (another environment's
    as they come), plus "mean": the unweighted mean over the categories present (the paper's overall score)."""
    table = {}
    for category in dict.fromkeys([*CATEGORIES, *(r.category for r in results)]):
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


def table_rows(summaries: dict[str, dict]) -> list[str]:
    """The rows a table of several models' summaries shows: every category any of them has, in their order, then
    the mean."""
    rows = dict.fromkeys(key for summary in summaries.values() for key in summary if key != "mean")
    return [*rows, "mean"] if rows else []


def task_result(row: dict) -> TaskResult:
    """A stored row (the evaluations or validations table) as the result it records."""
    return TaskResult(row["task_id"], row["category"], bool(row["valid"]), row["turns_passed"], row["turns"],
                      row["labels"])


def results_from_rows(rows: list[dict]) -> dict[str, list[TaskResult]]:
    """model label -> its results on BFCL or the run's own environment, from the store's evaluations rows
    (τ²-bench's are skipped)."""
    out: dict[str, list[TaskResult]] = {}
    for row in rows:
        if row.get("benchmark") != "tau2":
            out.setdefault(row["model"], []).append(task_result(row))
    return out


def result_rows(model_label: str, split: str, results: list[TaskResult], benchmark: str = "bfcl") -> list[dict]:
    """Rows of the store's ``evaluations`` table; ``benchmark``: the environment's name."""
    now = time.time()
    return [{"model": model_label, "task_id": r.task_id, "category": r.category, "split": split, "valid": r.valid,
             "turns_passed": r.turns_passed, "turns": r.turns, "labels": r.labels, "benchmark": benchmark,
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


def eval_task_ids(environment: Environment, split: str, per_category: int | None = None) -> list[str]:
    """The ids of ``split`` (eval, train, or comma-separated task ids) of an environment, with ``per_category``
    only the first N of each category in the split's order (a fixed subset)."""
    if split in ("eval", "train"):
        ids = environment.split_ids(split)
    else:
        ids = [task_id.strip() for task_id in split.split(",") if task_id.strip()]
        for task_id in ids:
            try:
                environment.category_of(task_id)
            except KeyError as error:
                raise ConfigError(f"--split: {error.args[0]}; pass eval, train or task ids such as "
                                  "multi_turn_base_1") from None
    if per_category:
        ids = [task_id for category in environment.categories
               for task_id in [i for i in ids if environment.category_of(i) == category][:per_category]]
    return ids


def run_dir_of(target: str) -> Path | None:
    """TARGET as a run directory (it holds a seal.db), else None: a model."""
    return Path(target) if (Path(target) / "seal.db").exists() else None


def trained_adapters(store: Store, run_dir: Path, steps: tuple[int, ...]) -> list[tuple[int, Path]]:
    """(step, adapter directory) for the requested steps' checkpoints, or the run's newest adapter."""
    checkpoints = {row["step"]: run_dir / row["path"] for row in store.checkpoints()}
    if not checkpoints:
        raise RunError(f"{run_dir} has no trained adapter yet: a run saves one when its first step ends")
    if not steps:
        last = max(checkpoints)
        return [(last, run_dir / "adapter" if (run_dir / "adapter").is_dir() else checkpoints[last])]
    kept = {step: path for step, path in checkpoints.items() if path.is_dir()}
    for step in steps:
        if step not in kept:
            raise RunError(f"{run_dir} keeps checkpoints of steps {sorted(kept)}, not {step} "
                           "(grpo.keep_checkpoints sets how many are kept)")
    return [(step, kept[step]) for step in steps]


BEST_ADAPTER = "best-adapter"  # RUN/best-adapter: the best validation checkpoint (seal_lite/runs/validation.py)


def scores_by_step(store: Store) -> dict[int, dict[str, float]]:
    """step -> the validation's mean over its categories: {tasks, accuracy, turn_pass_rate}."""
    results: dict[int, list[TaskResult]] = {}
    for row in store.validations():
        results.setdefault(row["step"], []).append(task_result(row))
    return {step: summarize(found)["mean"] for step, found in sorted(results.items())}


def best_step(store: Store, metric: str) -> tuple[int, float] | None:
    """(step, score) of the best validation by ``metric``; ties keep the earlier step (the release's strict >)."""
    scores = scores_by_step(store)
    if not scores:
        return None
    step = max(scores, key=lambda s: (scores[s][metric], -s))
    return step, scores[step][metric]


def best_adapter(store: Store, run_dir: Path, metric: str) -> tuple[int, Path]:
    """(step, RUN/best-adapter) of a run that validated during training; a RunError saying why there is none."""
    best = best_step(store, metric)
    if best is None or not (run_dir / BEST_ADAPTER / "adapter_config.json").is_file():
        raise RunError(f"{run_dir} has no best validation checkpoint: a run keeps one when its recipe validates "
                       "during training (validation.every) and a validation has ended")
    return best[0], run_dir / BEST_ADAPTER


def run_variants(run_dir: Path, overrides: dict, base: bool, steps: tuple[int, ...], best: bool = False):
    """(store, recipe, [(label, adapter)]) of a run directory: the run's own recipe with ``overrides`` on top, the
    base model with ``base`` (adapter None), the best validation checkpoint with ``best``, and the trained adapters
    of ``steps`` (default, unless ``best``: the newest)."""
    store = Store(run_dir / "seal.db")
    recipe = load_recipe(None, {**json.loads(store.run()["recipe"]), **overrides})
    variants = [("base", None)] if base else []
    if best:
        step, path = best_adapter(store, run_dir, recipe.validation.metric)
        variants.append((f"best (step {step})", path))
    if steps or not best:
        variants += [(f"step {step}", path) for step, path in trained_adapters(store, run_dir, steps)]
    return store, recipe, variants


def model_recipe(target: str, overrides: dict, or_else: str) -> Recipe:
    """The default recipe with TARGET as its policy, TARGET checked as a model before anything loads;
    ``or_else`` names what else TARGET could have been, for the error."""
    from seal_lite.runs.preflight import model_problem

    if problem := model_problem(target):
        raise ConfigError(f"TARGET {target!r} is neither {or_else} nor a usable model: {problem}")
    return load_recipe(None, {**overrides, "policy.model": target})


def evaluate_target(target: str, *, split: str = "eval", tasks: int | None = None, base: bool = False,
                    steps: tuple[int, ...] = (), best: bool = False, overrides: dict | None = None,
                    view: str = "official", progress=None, note: Callable[[str], None] = lambda text: None) -> dict:
    """``seal_lite.evaluate`` on BFCL: every variant of TARGET (a run directory or a model) on ``split``; the
    results are stored in the run's seal.db. {"summary": {label: table}, "tasks": {label: [results]}}."""
    run_dir = run_dir_of(target)
    if run_dir is not None:
        store, recipe, variants = run_variants(run_dir, overrides or {}, base, steps, best)
        if not best and (run_dir / BEST_ADAPTER).is_dir():
            note(f"note: {run_dir} also keeps its best validation checkpoint ({BEST_ADAPTER}); --best scores it")
    elif best:
        raise ConfigError("--best needs a run directory as TARGET: a run that validates during training keeps its "
                          "best checkpoint (recipe section validation)")
    else:
        store, recipe, variants = None, model_recipe(target, overrides or {}, "a run directory"), [("base", None)]
    environment = find_environment(recipe.data.environment)
    try:
        chosen = environment.load_tasks(eval_task_ids(environment, split, tasks))
    except KeyError as error:  # an id of a known category that the environment does not have
        raise ConfigError(f"--split: {error.args[0]}") from None
    chosen = [task.truncated(recipe.rollout.max_turns) for task in chosen]
    if view != "official":
        note(f"note: the {view} view is {NOT_BFCL_VIEW}; these results are not BFCL multi-turn scores")
    summaries, everything = {}, {}
    for label, adapter in variants:
        label = view_label(label, view)
        note(f"evaluating {label} on {len(chosen)} tasks ...")
        results = _evaluate_variant(recipe, adapter, chosen, view, label, progress)
        summaries[label], everything[label] = summarize(results), [vars(result) for result in results]
        if store is not None:
            store.save_evaluations(result_rows(label, split, results, environment.name))
    return {"summary": summaries, "tasks": everything}


def _evaluate_variant(recipe: Recipe, adapter: Path | None, tasks: list[Task], view: str, label: str,
                      progress) -> list[TaskResult]:
    """One variant's results. Its policy and engine are freed before the next variant loads its own: on a GPU, a
    second vLLM engine starts only where the card's memory is free."""
    import gc

    import torch

    with (tempfile.TemporaryDirectory() as work, evaluation_engine(recipe, adapter, Path(work)) as generator,
          progress(label, len(tasks)) if progress else contextlib.nullcontext(lambda result: None) as on_result):
        rollout = recipe.rollout.model_copy(update={"generation_batch_size": recipe.generation_batch()})
        results = evaluate(tasks, generator, rollout, view, on_result=on_result)
    del generator  # the last reference to the policy
    gc.collect()  # and whatever of it sits in reference cycles, before its blocks go back to the card
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # vLLM counts the memory torch keeps cached as taken
    return results
