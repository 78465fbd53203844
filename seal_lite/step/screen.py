"""The frontier screen (``data.screen``): keep the training tasks the policy solves sometimes, but not always.

GRPO learns only from groups whose rewards differ. A task the policy always fails, or always solves, gives every
trajectory of its group the same reward and an advantage of 0, so it costs rollouts and teaches nothing. The
screen plays k samples of each task of the slice, as training would (same interface, budgets and temperature),
and keeps the tasks whose pass rate is strictly between 0 and 1. At most a training step's worth of sequences
play at once, tasks sharing tool classes next to each other; each task's result is stored as soon as its samples
are played, so an interrupted screen goes on where it stopped. Not part of the paper: a lever for small budgets.

As the policy learns, its frontier moves: ``data.rescreen_every`` screens the slice again during training, with
the current policy under the current training interface (seal_lite/step/algorithm.py), and the steps that follow draw from
the new frontier.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from seal_lite.core.calls import call_format
from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import Recipe
from seal_lite.core.types import Trajectory
from seal_lite.engines.store import Store
from seal_lite.envs.task import Task
from seal_lite.step.rollout import Generator, by_shared_prefix, rollout_groups, task_batches
from seal_lite.step.verifier import diagnose_episode


def screen_tasks(tasks: list[Task], generator: Generator, recipe: Recipe, store: Store,
                 on_task: Callable[[str, int, int], None] = lambda task_id, passes, samples: None, step: int = 0,
                 interface_for: Callable[[Task], TrainingInterface] | None = None) -> dict[str, float]:
    """Pass rate per task over ``recipe.data.screen`` samples; tasks already screened (in the store, for this
    ``step``: 0 before training, else the re-screen before that step) are not played again. ``interface_for``
    gives each task's interface; by default the recipe's training interface as the first step sees it."""
    samples = recipe.data.screen
    config = recipe.interface
    first = TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format,
                              call_format(recipe.rollout.parser))
    interface_for = interface_for or (lambda task: first)
    done = store.screen(step)
    todo = by_shared_prefix([task for task in tasks if task.id not in done or done[task.id]["samples"] != samples])
    by_id = {task.id: task for task in todo}
    last = time.perf_counter()

    def record(group: list[Trajectory]) -> None:
        nonlocal last
        task = by_id[group[0].task_id]
        passes = sum(diagnose_episode(task, trajectory.turns).valid for trajectory in group)
        # tasks play side by side: a task's seconds are those since the previous task's group ended
        now = time.perf_counter()
        seconds, last = now - last, now
        store.save_screen({"task_id": task.id, "samples": samples, "passes": passes, "seconds": seconds}, step)
        on_task(task.id, passes, samples)

    rollout = recipe.rollout.model_copy(update={"generation_batch_size": recipe.generation_batch()})
    for batch in task_batches(todo, samples, generator, rollout):  # as many sequences at once as a training step
        rollout_groups([(task, interface_for(task)) for task in batch], samples, generator, rollout, on_group=record)
    rates = pass_rates(store.screen(step))
    return {task.id: rates[task.id] for task in tasks}


def pass_rates(rows: dict[str, dict]) -> dict[str, float]:
    """task id -> passes / samples, from the store's screen rows (``Store.screen``)."""
    return {task_id: row["passes"] / row["samples"] for task_id, row in rows.items()}


def frontier(pass_rates: dict[str, float]) -> list[str]:
    """The tasks with a learning signal to give: solved sometimes, but not always (in the order given)."""
    return [task_id for task_id, rate in pass_rates.items() if 0.0 < rate < 1.0]
