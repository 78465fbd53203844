"""The frontier screen (data.screen, `seal-lite screen`): pass rates from real rollouts, stored and reused."""

import pytest

from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.tasks import ScreenError, frontier_task_ids
from seal_lite.step.algorithm import SealStep
from seal_lite.step.rollout import by_shared_prefix
from seal_lite.step.screen import frontier, screen_tasks
from tests.helpers import HalfRightOnSome

POOL = ["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3"]


def test_screen_keeps_the_tasks_solved_sometimes_and_stores_them_once(tmp_path, smol_tokenizer):
    tasks = [task.truncated(1) for task in load_tasks(POOL)]
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.parser, recipe.data.screen = "lenient", 4
    generator = HalfRightOnSome(smol_tokenizer, tasks, ["multi_turn_base_3"])
    store = Store(tmp_path / "seal.db")
    seen = []
    rates = screen_tasks(tasks, generator, recipe, store, lambda *args: seen.append(args))

    # the rates are the official verdicts of the real rollouts: half of multi_turn_base_3's group gets it right
    assert rates == {"multi_turn_base_0": 0.0, "multi_turn_base_2": 0.0, "multi_turn_base_3": 0.5}
    assert frontier(rates) == ["multi_turn_base_3"]
    passes = {"multi_turn_base_0": 0, "multi_turn_base_2": 0, "multi_turn_base_3": 2}
    # each task reported once, as soon as its group ended; played in batches of a training step's sequences
    # (2 tasks x 4 samples), tasks sharing tool classes together
    assert sorted(seen) == sorted((task_id, count, 4) for task_id, count in passes.items())
    assert generator.played == [task.id for task in by_shared_prefix(tasks)]
    assert {row["task_id"]: row["passes"] for row in store.screen().values()} == passes

    # a second screen (a resumed run) plays nothing again
    again = HalfRightOnSome(smol_tokenizer, tasks, [])
    assert screen_tasks(tasks, again, recipe, store) == rates and again.played == []

    recipe.grpo.tasks_per_step = 2  # one frontier task cannot fill a step of two: the error says what to change
    with pytest.raises(ScreenError, match=r"kept 1 of 3 tasks \(0 always solved, 2 never\).*grpo.tasks_per_step"):
        frontier_task_ids(recipe, rates)


def test_a_rescreen_moves_the_frontier_as_the_policy_learns(tmp_path, smol_tokenizer):
    """data.rescreen_every: before step 2 the whole slice is screened again with the current policy; a task it
    has mastered leaves the frontier, one it has started to solve joins, and TRL's draw is swapped to match."""
    tasks = {task.id: task.truncated(1) for task in load_tasks([*POOL, "multi_turn_base_5"])}
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.num_generations, recipe.rollout.parser = 4, "lenient"
    recipe.grpo.tasks_per_step = 2
    recipe.data.screen, recipe.data.rescreen_every = 4, 1
    store = Store(tmp_path / "seal.db")
    first = ["multi_turn_base_0", "multi_turn_base_2"]  # the frontier of the screen before training
    generator = HalfRightOnSome(smol_tokenizer, list(tasks.values()), first)
    step = SealStep(recipe, store, tasks, generator, frontier=first)
    step(first)
    assert generator.played == first and store.screen(1) == {}  # no re-screen before the first step

    # the policy has learned: base_0 is mastered, base_5 is now solved sometimes, base_3 still never
    generator.mastered, generator.learnable, generator.played = {"multi_turn_base_0"}, {"multi_turn_base_2",
                                                                                       "multi_turn_base_5"}, []
    step(first)  # TRL still draws from the first frontier
    screened = store.screen(2)
    assert {task_id: row["passes"] for task_id, row in screened.items()} == {
        "multi_turn_base_0": 4, "multi_turn_base_2": 2, "multi_turn_base_3": 0, "multi_turn_base_5": 2}
    assert step.frontier == ["multi_turn_base_2", "multi_turn_base_5"] and step.state()["frontier"] == step.frontier
    # the four screened groups, then the step's: base_0's draw was swapped for base_5
    assert generator.played[4:] == ["multi_turn_base_5", "multi_turn_base_2"]
    assert {row["task_id"] for row in store.trajectories() if row["step"] == 2} == {"multi_turn_base_2",
                                                                                  "multi_turn_base_5"}
    metrics = {name: dict(store.metrics(name))[2] for name in
               ("screen/frontier_tasks", "screen/rescreen_kept", "screen/rescreened_tasks")}
    assert metrics == {"screen/frontier_tasks": 2, "screen/rescreen_kept": 2, "screen/rescreened_tasks": 4}

    # every task mastered: a frontier too small for a step leaves the last one in place
    generator.mastered, generator.learnable = set(tasks), set()
    step(["multi_turn_base_2", "multi_turn_base_5"])
    assert step.frontier == ["multi_turn_base_2", "multi_turn_base_5"]
    assert dict(store.metrics("screen/rescreen_kept"))[3] == 0

    # a killed step's re-screen is played again on resume, like the rest of the step
    store.rollback_after(2)
    assert store.screen(3) == {} and set(store.screen(2)) == set(tasks)


def test_rescreen_every_needs_the_screens_sample_count():
    from seal_lite.core.recipe import load_recipe

    with pytest.raises(ValueError, match=r"data.rescreen_every.*set data.screen too"):
        load_recipe(None, {"data": {"rescreen_every": 5}})
    assert load_recipe(None, {"data": {"rescreen_every": 5, "screen": 4}}).data.rescreen_every == 5
