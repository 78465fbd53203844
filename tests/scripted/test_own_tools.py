"""The SEAL loop on a user's own tools (docs/your-tools.md): a whole run on the shipped library environment, the
commands a user reads its results with, and the docs page's own example built from the page as printed.

The runs use the tiny random policy, half of whose first messages are replaced by the task's expected calls, so
groups differ and every step updates; the library, its checker and the store are the real ones."""

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from seal_lite import console
from seal_lite.api import run
from seal_lite.cli import main
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.store import Store
from seal_lite.envs.library import environment as library
from seal_lite.envs.registry import find_environment, replay_calls
from seal_lite.step.verifier import diagnose_episode
from tests.helpers import answer_with_ground_truth

ROOT = Path(__file__).parents[2]
TASKS = ["library_3", "library_6"]  # a fine to pay, then a loan; a return, then a loan of the returned book


@pytest.fixture(scope="module")
def library_run(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("library") / "run"
    monkeypatch = pytest.MonkeyPatch()
    answer_with_ground_truth(monkeypatch, library.load_tasks(TASKS), lambda row: row % 2 == 0)
    recipe = load_recipe(ROOT / "recipes" / "library.yaml", {
        "policy.model": tiny_model_dir, "policy.dtype": "float32", "rollout.backend": "transformers",
        "data.task_ids": TASKS, "rollout.max_turns": 1, "rollout.max_new_tokens": 8, "rollout.max_model_calls": 1,
        "rollout.num_generations": 2, "grpo.steps": 2, "grpo.learning_rate": 1e-2, "grpo.dynamic_sampling": None,
        "interface.guideline_min_count": 1, "diagnoser.mode": "off"})
    try:
        summary = run(recipe, out)
    finally:
        monkeypatch.undo()
    return out, summary


def test_a_run_on_the_library_updates_the_policy_and_evolves_the_interface(library_run):
    out, summary = library_run
    store = Store(out / "seal.db")
    trajectories = store.trajectories()
    assert {row["task_id"] for row in trajectories} <= set(TASKS) and len(trajectories) == 8  # 2 steps x 2 x G=2
    assert summary.steps == 2 and summary.rewards == [0.5, 0.5]  # the scripted half passes the library's checker
    assert all(change > 0 for change in summary.lora_change)  # both steps moved the LoRA
    assert summary.interface_changes  # the failures' labels became a guideline
    assert json.loads(store.run()["recipe"])["data"]["environment"] == "library"


def test_diagnose_shows_the_library_turns_labels_and_causes(library_run, monkeypatch):
    out, _ = library_run
    monkeypatch.setattr(console.console, "width", 250)
    failed = CliRunner().invoke(main, ["diagnose", str(out), "--failed", "--json"])
    assert failed.exit_code == 0, failed.output
    rows = [json.loads(line) for line in failed.output.splitlines()]
    assert rows and all(row["reward"] == 0.0 and row["labels"] != ["pass"] for row in rows)
    shown = CliRunner().invoke(main, ["diagnose", str(out), "--trajectory", rows[0]["id"]])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"(empty_turn_model_response|state_mismatch)", shown.output)
    assert re.search(r"(missing_tool_call|invalid_tool_call|state_mismatch|argument_mismatch)", shown.output)


def test_prompt_report_and_eval_read_the_runs_environment(library_run):
    out, _ = library_run
    runner = CliRunner()
    prompt = runner.invoke(main, ["prompt", "library_3", "--run", str(out)])
    assert prompt.exit_code == 0, prompt.output
    assert '"name": "pay_fine"' in prompt.output and "Member M-102 would like to pay off" in prompt.output
    report = runner.invoke(main, ["report", str(out)])
    assert report.exit_code == 0 and (out / "report" / "report.html").is_file()
    evaluated = runner.invoke(main, ["eval", str(out), "--split", "library_22,library_24"])
    assert evaluated.exit_code == 0, evaluated.output
    rows = list(Store(out / "seal.db").evaluations())
    assert sorted(row["task_id"] for row in rows) == ["library_22", "library_24"]
    assert {row["category"] for row in rows} == {"base"} and {row["benchmark"] for row in rows} == {"library"}


def test_a_bad_environment_is_refused_before_anything_is_written(tmp_path):
    result = CliRunner().invoke(main, ["run", "--set", "data.environment=no_such_module:environment",
                                       "--out", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "data.environment" in result.output and "no module 'no_such_module'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def docs_blocks(language: str) -> list[str]:
    text = (ROOT / "docs" / "your-tools.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def test_the_docs_pages_example_builds_and_its_recipe_checks(tmp_path, monkeypatch):
    """The page's file and recipe, as printed: `seal-lite recipe` accepts them, every task's expected calls pass
    its own checker, and the example stays under the page's promise of 100 lines."""
    example = next(block for block in docs_blocks("python") if "ToolEnvironment(" in block)
    assert len(example.splitlines()) < 100
    (tmp_path / "todo.py").write_text(example)
    recipe_text = next(block for block in docs_blocks("yaml") if "data:" in block)
    (tmp_path / "todo.yaml").write_text(recipe_text)
    monkeypatch.chdir(tmp_path)
    checked = CliRunner().invoke(main, ["recipe", "todo.yaml"])
    assert checked.exit_code == 0, checked.output
    assert yaml.safe_load(recipe_text)["data"]["environment"] == "todo.py:environment"
    todo = find_environment("todo.py:environment")
    for task in todo.load_tasks(todo.split_ids("train") + todo.split_ids("eval")):
        played = replay_calls(task, [[turn] if turn else [] for turn in task.ground_truth])
        assert diagnose_episode(task, played).valid, task.id
    declined = [task.id for task in todo.load_tasks(todo.split_ids("train")) if [] in task.ground_truth]
    assert declined  # the page shows a turn to decline
