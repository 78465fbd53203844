"""The frontier screen (data.screen, `seal-lite screen`): pass rates from real rollouts, stored and reused."""

import pytest
from click.testing import CliRunner
from conftest import HalfRightOnSome

from seal_lite.cli import main
from seal_lite.envs.bfcl import load_tasks
from seal_lite.recipe import Recipe
from seal_lite.runner import ScreenError, frontier_task_ids
from seal_lite.screen import frontier, screen_tasks
from seal_lite.store import Store

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
    assert seen == [("multi_turn_base_0", 0, 4), ("multi_turn_base_2", 0, 4), ("multi_turn_base_3", 2, 4)]
    assert {row["task_id"]: row["passes"] for row in store.screen().values()} == {
        "multi_turn_base_0": 0, "multi_turn_base_2": 0, "multi_turn_base_3": 2}

    # a second screen (a resumed run) plays nothing again
    again = HalfRightOnSome(smol_tokenizer, tasks, [])
    assert screen_tasks(tasks, again, recipe, store) == rates and again.played == []

    recipe.grpo.tasks_per_step = 2  # one frontier task cannot fill a step of two: the error says what to change
    with pytest.raises(ScreenError, match=r"kept 1 of 3 tasks \(0 always solved, 2 never\).*grpo.tasks_per_step"):
        frontier_task_ids(recipe, rates)


@pytest.mark.slow
def test_screen_command_with_the_real_model(tmp_path):
    """SmolLM2 in llama.cpp on one real task: the command stores the screen and says what it kept."""
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "screen", "--out", str(out), "--samples", "2", "--set", "data.task_ids=[multi_turn_base_0]",
        "--set", "rollout.max_turns=1", "--set", "rollout.max_model_calls=1", "--set", "rollout.max_new_tokens=16",
        "--set", "grpo.tasks_per_step=1", "--set", "interface.tool_format=signatures"])  # short prompts: faster
    assert result.exit_code == 0, result.output
    rows = Store(out / "seal.db").screen()
    assert list(rows) == ["multi_turn_base_0"] and rows["multi_turn_base_0"]["samples"] == 2
    assert "multi_turn_base_0" in result.output and "tasks on the frontier" in result.output
