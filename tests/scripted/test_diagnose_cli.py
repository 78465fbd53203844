"""`seal-lite diagnose` over a real store written by one SEAL step (real BFCL, scripted policy)."""

import json

from click.testing import CliRunner

from seal_lite import console
from seal_lite.cli import main
from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from tests.helpers import ScriptedGenerator, tool_call_text


def test_diagnose_lists_trajectories_and_shows_one_turn_by_turn(tmp_path, smol_tokenizer, monkeypatch):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(2)
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn = 2, 1
    right = [tool_call_text(calls) for calls in task.ground_truth]
    wrong = [tool_call_text(["cd(folder='document')", "mkdir(dir_name='tmp')"]), "I could not find it."]
    store = Store(tmp_path / "seal.db")
    step = SealStep(recipe, store, {task.id: task}, ScriptedGenerator(smol_tokenizer, [right, wrong]))
    batch = step([task.id])
    assert batch.rewards == [1.0, 0.0]

    monkeypatch.setattr(console.console, "width", 250)
    runner = CliRunner()
    listing = runner.invoke(main, ["diagnose", str(tmp_path)])
    assert listing.exit_code == 0, listing.output
    assert "s1-multi_turn_base_0-g0" in listing.output and "pass pass" in listing.output
    assert "state_mismatch empty_turn_model_response" in listing.output
    failed = runner.invoke(main, ["diagnose", str(tmp_path), "--failed", "--json"])
    assert [json.loads(line) for line in failed.output.splitlines()] == [{
        "id": "s1-multi_turn_base_0-g1", "step": 1, "task_id": "multi_turn_base_0", "reward": 0.0,
        "weight": store.trajectory("s1-multi_turn_base_0-g1")["weight"], "num_model_calls": 2, "stop_reason": "done",
        "labels": ["state_mismatch", "empty_turn_model_response"],
    }]

    shown = runner.invoke(main, ["diagnose", str(tmp_path), "--trajectory", "s1-multi_turn_base_0-g1"])
    assert shown.exit_code == 0, shown.output
    for expected in ("reward 0", "state_mismatch", "GorillaFileSystem state differs", "empty_turn_model_response",
                     "missing_tool_call", "(no call)"):
        assert expected in shown.output, expected
    # the same turns as JSON: what the store holds
    rows = runner.invoke(main, ["diagnose", str(tmp_path), "--trajectory", "s1-multi_turn_base_0-g1", "--json"])
    first, second = (json.loads(line) for line in rows.output.splitlines())
    assert first["model_calls"] == ["cd(folder='document')", "mkdir(dir_name='tmp')"]
    assert first["evidence"]["statuses"] == ["ok", "ok"] and (first["label"], first["cause"]) == ("state_mismatch", "state_mismatch")
    assert second["model_calls"] == [] and (second["label"], second["cause"]) == ("empty_turn_model_response", "missing_tool_call")
    assert second["gt_calls"] == task.ground_truth[1]


def test_diagnose_errors_name_the_fix(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["diagnose", str(tmp_path)])
    assert missing.exit_code == 1 and "pass a run directory made by `seal-lite run`" in missing.output
    Store(tmp_path / "seal.db")
    unknown = runner.invoke(main, ["diagnose", str(tmp_path), "--trajectory", "nope"])
    assert unknown.exit_code == 1 and "no trajectory 'nope'" in unknown.output and "seal-lite diagnose" in unknown.output
