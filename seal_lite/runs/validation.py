"""Validation during training (recipe section ``validation``), as the SEAL release's trainer does it.

Every ``validation.every`` steps, after the last step, and before the first with ``before_training``, the current
policy plays the held-out slice once, greedily, under BFCL's own view, scored by the official verdict: what
``seal-lite eval`` does (seal_lite/runs/evaluate_bfcl.py), here on the run's own rollout engine (on BFCL the recipe's
context must hold the official view: 16,384 tokens at least; another environment plays in the recipe's context). The results go to the store's ``validations`` table under the
step. When the score (``validation.metric``, averaged over the slice's categories) beats every earlier one, that
adapter becomes the run's best: RUN/best-adapter, beside the final RUN/adapter; ``seal-lite eval RUN --best`` scores
it.

Validation reads the policy and writes only its table and the best adapter. The training interface, the failure
statistics, rho and the random state of training are untouched (torch's and Python's generators are forked around
it), so a run trains the same with or without it.

Crash safety follows the store's rule that a step counts once its checkpoint is committed. A step's validation rows
are written before its commit, and a resumed run removes them with the step's other rows. A new best adapter is
written to RUN/.best-adapter-step-N first; ``settle_best_adapter`` moves it to RUN/best-adapter after the commit
(and again when a run resumes) only if the store names step N the best, so that directory always holds the adapter
the store says is best.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from collections.abc import Callable
from pathlib import Path

from seal_lite.core.recipe import Recipe
from seal_lite.core.recipe_sections import ValidationConfig
from seal_lite.core.types import Progress
from seal_lite.engines.store import Store
from seal_lite.envs.registry import find_environment
from seal_lite.envs.task import Environment
from seal_lite.runs.evaluate_bfcl import (
    BEST_ADAPTER,
    best_step,
    eval_task_ids,
    evaluate,
    summarize,
)

STAGED_PREFIX = ".best-adapter-step-"  # a new best, written before its step is committed


def validation_task_ids(config: ValidationConfig, environment: Environment) -> list[str]:
    """The held-out slice: the explicit ids, else the split's ids in its categories (default: all of the
    environment's), the first ``tasks_per_category`` of each."""
    if config.task_ids:
        return list(config.task_ids)
    categories = config.categories or environment.categories
    return [task_id for task_id in eval_task_ids(environment, config.split, config.tasks_per_category)
            if environment.category_of(task_id) in categories]


def settle_best_adapter(out_dir: Path, store: Store, metric: str) -> None:
    """Make RUN/best-adapter the adapter of the step the store names best: move that step's staged adapter into
    place, and remove every other staged one (a step a resumed run rolled back, or a best already superseded)."""
    best = best_step(store, metric)
    for staged in sorted(out_dir.glob(f"{STAGED_PREFIX}*")):
        if best is not None and staged.name == f"{STAGED_PREFIX}{best[0]}":
            target, old = out_dir / BEST_ADAPTER, out_dir / f".{BEST_ADAPTER}-old"
            shutil.rmtree(old, ignore_errors=True)
            if target.exists():
                target.rename(old)  # a kill from here on leaves the staged copy, which the next settle moves
            staged.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(staged)


@contextlib.contextmanager
def forked_random_state():
    """Leave Python's and torch's random generators (CPU and every GPU) as they were: validation draws nothing that
    training would have drawn."""
    import torch

    python_state = random.getstate()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(python_state)


class Validator:
    """Plays the held-out slice with the run's rollout engine after the steps the recipe names, stores the results
    and keeps the best adapter. ``sync(step)`` brings the engine up to the trained model (llama.cpp and vLLM);
    ``save_adapter(directory)`` writes the trained LoRA; ``report(step, metrics)`` sends the scores to the run's
    tracker."""

    def __init__(self, recipe: Recipe, store: Store, out_dir: Path, generator, sync: Callable[[int], None],
                 save_adapter: Callable[[str], None], progress: Progress,
                 report: Callable[[int, dict[str, float]], None] = lambda step, metrics: None):
        self.config, self.last_step, self.store, self.out_dir = recipe.validation, recipe.grpo.steps, store, out_dir
        self.generator, self.sync, self.save_adapter, self.progress, self.report = (
            generator, sync, save_adapter, progress, report)
        environment = find_environment(recipe.data.environment)
        self.tasks = [task.truncated(recipe.rollout.max_turns)
                      for task in environment.load_tasks(validation_task_ids(self.config, environment))]
        # `evaluate` plays by the official surface's rules, as `seal-lite eval` does, in the run's engine's context: a
        # BFCL recipe that validates has at least the official one; another environment's tool docs fit its own
        self.rollout = recipe.rollout.model_copy(update={
            "generation_batch_size": recipe.generation_batch()})

    def __call__(self, step: int) -> None:
        """Validate after ``step`` (0: the base policy) if the recipe asks for it, storing the results under the
        step; stage the adapter if it is the best so far (``settle`` moves it into place)."""
        if not self.config.after(step, self.last_step):
            return
        previous = best_step(self.store, self.config.metric)
        self.progress.validation_started(step, len(self.tasks))
        with forked_random_state():
            self.sync(step)
            results = evaluate(self.tasks, self.generator, self.rollout, on_result=self.progress.task_validated,
                               min_context=0)
        self.store.save_validations(step, [
            {"task_id": r.task_id, "category": r.category, "valid": r.valid, "turns_passed": r.turns_passed,
             "turns": r.turns, "labels": r.labels} for r in results])
        score = summarize(results)["mean"]
        if previous is None or score[self.config.metric] > previous[1]:
            self.save_adapter(str(self.out_dir / f"{STAGED_PREFIX}{step}"))
        best = best_step(self.store, self.config.metric)
        self.progress.validated(step, score, best)
        self.report(step, {f"validation/{name}": score[name] for name in ("accuracy", "turn_pass_rate")})

    def settle(self) -> None:
        settle_best_adapter(self.out_dir, self.store, self.config.metric)
