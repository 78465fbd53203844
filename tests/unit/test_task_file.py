"""Task files (data.task_file): what `seal-lite screen --write-frontier` writes, a recipe names and a run draws."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.recipe import Recipe, RecipeError
from seal_lite.core.recipe_sections import DataConfig
from seal_lite.runs import preflight
from seal_lite.runs.tasks import read_task_file, select_task_ids, task_file_path, write_frontier_file

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "frontier" / "qwen2.5-coder-0.5b.txt"


def test_the_default_task_file_applies_only_where_no_other_selection_is_made():
    assert DataConfig().task_file == "data/frontier/qwen2.5-coder-0.5b.txt"
    for selection in ({"split": "eval"}, {"num_tasks": 8}, {"categories": ["miss_func"]},
                      {"task_ids": ["multi_turn_base_0"]}):
        assert DataConfig(**selection).task_file is None, selection  # a GPU recipe's num_tasks: 400 means the split
    assert DataConfig(task_file="mine.txt", num_tasks=48).task_file == "mine.txt"  # named: kept (48: a re-screen's)
    # a stored recipe (every field written) loads as it was
    assert DataConfig.model_validate(DataConfig(num_tasks=8).model_dump()).task_file is None


def test_a_frontier_file_round_trips_with_its_provenance(tmp_path):
    recipe = Recipe(seed=7)
    rates = {"multi_turn_base_3": 0.25, "multi_turn_base_1": 0.0, "multi_turn_base_9": 1.0, "multi_turn_base_5": 0.75}
    path = tmp_path / "deep" / "frontier.txt"
    kept = write_frontier_file(path, rates, 4, recipe, "seal-lite screen r.yaml --write-frontier frontier.txt")

    assert kept == ["multi_turn_base_3", "multi_turn_base_5"]  # solved sometimes, not always, in screen order
    assert read_task_file(path) == kept
    text = path.read_text()
    assert "Written by: seal-lite screen r.yaml --write-frontier frontier.txt" in text
    assert "Seed 7," in text and f"Frontier of {recipe.policy.model}" in text and "(2 of 4 screened" in text
    assert "multi_turn_base_5  # 3/4" in text.splitlines()


def test_a_recipe_naming_a_task_file_draws_its_ids(tmp_path, monkeypatch):
    (tmp_path / "tasks.txt").write_text("# a comment\nmulti_turn_base_4  # 1/4\n\nmulti_turn_base_2\n")
    monkeypatch.chdir(tmp_path)  # relative to the current directory first
    recipe = Recipe(data={"task_file": "tasks.txt"})
    preflight.check(recipe)
    assert select_task_ids(recipe) == ["multi_turn_base_4", "multi_turn_base_2"]
    # ... else beside seal-lite's data/ folder: the shipped files are found from anywhere
    assert task_file_path("data/frontier/qwen2.5-coder-0.5b.txt") == SHIPPED
    assert task_file_path(str(tmp_path / "tasks.txt")) == tmp_path / "tasks.txt"


def test_the_shipped_frontier_is_what_the_default_recipe_trains_on():
    lines = SHIPPED.read_text().splitlines()
    assert lines[0].startswith("# Frontier of qwen2.5-coder-0.5b")
    assert any(line.startswith("# Written by: seal-lite screen ") for line in lines)
    ids = read_task_file(SHIPPED)
    assert len(ids) >= Recipe().grpo.tasks_per_step and select_task_ids(Recipe()) == ids
    preflight.check(Recipe())


@pytest.mark.parametrize(("content", "expected"), [
    (None, "no such file"),
    ("# nothing kept\n", "names no task"),
    ("multi_turn_base_0\nmulti_turn_bogus_1\n", "multi_turn_bogus_1"),
    ("multi_turn_base_0\n", "grpo.tasks_per_step"),  # one id cannot fill a step of two
])
def test_a_bad_task_file_is_refused_naming_the_field_and_the_fix(tmp_path, content, expected):
    path = tmp_path / "tasks.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RecipeError, match=expected) as error:
        preflight.check(Recipe(data={"task_file": str(path)}))
    assert "data.task_file" in str(error.value) or "grpo.tasks_per_step" in str(error.value)


def test_the_command_line_refuses_a_missing_task_file_without_a_traceback(tmp_path):
    result = CliRunner().invoke(main, ["recipe", "--set", f"data.task_file={tmp_path / 'none.txt'}"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "data.task_file" in result.output and "--write-frontier" in result.output

