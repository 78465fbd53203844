"""The tasks a run trains on: the recipe's slice of its environment (BFCL's by default), and the frontier screen that
narrows it.

``select_task_ids`` draws the slice (explicit ids, a task file, or a seeded shuffle of the split); ``screen_slice``
plays every task of it with the base policy (``data.screen`` samples each) and ``frontier_task_ids`` keeps the
tasks solved sometimes but not always (docs/training.md); ``write_frontier_file`` keeps them for recipes to name.
"""

from __future__ import annotations

import datetime
import random
from pathlib import Path

from seal_lite.core.errors import RunError
from seal_lite.core.recipe import Recipe
from seal_lite.core.types import NoProgress, Progress
from seal_lite.engines.rollout_engine import rollout_engine
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import data_folder
from seal_lite.envs.registry import find_environment
from seal_lite.envs.task import Task


def select_task_ids(recipe: Recipe) -> list[str]:
    """The run's task slice: explicit ids, the ids of ``data.task_file``, or the first ``num_tasks`` of the split
    after a seeded shuffle."""
    if recipe.data.task_ids:
        return list(recipe.data.task_ids)
    if recipe.data.task_file:
        return read_task_file(task_file_path(recipe.data.task_file))
    ids = find_environment(recipe.data.environment).split_ids(recipe.data.split, recipe.data.categories)
    random.Random(recipe.seed).shuffle(ids)
    return ids[: recipe.data.num_tasks]


def task_file_path(name: str) -> Path:
    """Where ``data.task_file`` is: the path itself if it exists, else beside seal-lite's data/ folder (so the
    shipped data/frontier/... files are found from any directory). Not checked for existence."""
    path = Path(name).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return data_folder().parent / path


def read_task_file(path: Path) -> list[str]:
    """The ids of a task file: one per line, in order; ``#`` starts a comment, blank lines are skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def write_frontier_file(path: Path, pass_rates: dict[str, float], samples: int, recipe: Recipe, command: str) -> list[str]:
    """Write the screen's frontier as a task file a recipe can name (``data.task_file``): a header saying which
    command, seed and model produced it, then the kept ids with their passes. Returns the ids written."""
    from seal_lite.step.screen import frontier

    kept = frontier(pass_rates)
    header = [f"Frontier of {recipe.policy.model}: the tasks it solved in some, not all, of {samples} samples",
              f"({len(kept)} of {len(pass_rates)} screened; {datetime.date.today().isoformat()}).",
              f"Written by: {command}",
              f"Seed {recipe.seed}, temperature {recipe.rollout.temperature}, "
              f"tool format {recipe.interface.tool_format}, max_turns {recipe.rollout.max_turns}."]
    lines = [f"# {line}" for line in header]
    lines += [f"{task_id}  # {round(pass_rates[task_id] * samples)}/{samples}" for task_id in kept]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return kept


def slice_tasks(recipe: Recipe, task_ids: list[str]) -> dict[str, Task]:
    """The run's tasks by id, cut to ``rollout.max_turns``."""
    tasks = find_environment(recipe.data.environment).load_tasks(task_ids)
    return {task.id: task.truncated(recipe.rollout.max_turns) for task in tasks}





class ScreenError(RunError):
    """The frontier screen left fewer tasks than a step needs."""


def screen_slice(recipe: Recipe, store: Store, tasks: dict[str, Task], policy, out_dir: Path,
                 progress: Progress = NoProgress()) -> dict[str, float]:
    """Pass rate per task of the run's slice under the base policy (``data.screen`` samples each); tasks already
    in the store's screen table are not played again."""
    from transformers import set_seed

    from seal_lite.step.screen import screen_tasks

    set_seed(recipe.seed)  # transformers samples with torch's RNG: the same recipe screens the same way
    with rollout_engine(recipe, policy.model, policy.tokenizer, out_dir, policy.generation_mode) as (generator, _):
        return screen_tasks(list(tasks.values()), generator, recipe, store, progress.task_screened)


def without_uninformative(tasks: dict[str, Task], progress: Progress = NoProgress()) -> dict[str, Task]:
    """The slice without the tasks one of whose turns any accepted call passes (seal_lite/step/uninformative.py):
    a screen keeps them out of every frontier, and does not play them."""
    from seal_lite.step.uninformative import any_call_turns

    flagged = [task_id for task_id, task in tasks.items() if any_call_turns(task)]
    if flagged:
        progress.tasks_excluded(flagged, "any accepted call passes one of their turns (seal_lite/step/uninformative.py)")
    return {task_id: task for task_id, task in tasks.items() if task_id not in flagged}


def frontier_task_ids(recipe: Recipe, pass_rates: dict[str, float]) -> list[str]:
    """The screened tasks training draws from; a ScreenError, with the fix, if they cannot fill a step."""
    from seal_lite.step.screen import frontier

    kept = frontier(pass_rates)
    if len(kept) < recipe.grpo.tasks_per_step:
        solved = sum(rate == 1.0 for rate in pass_rates.values())
        raise ScreenError(
            f"the screen kept {len(kept)} of {len(pass_rates)} tasks ({solved} always solved, "
            f"{len(pass_rates) - len(kept) - solved} never), fewer than grpo.tasks_per_step "
            f"({recipe.grpo.tasks_per_step}); raise data.num_tasks or data.screen, or lower grpo.tasks_per_step")
    return kept
