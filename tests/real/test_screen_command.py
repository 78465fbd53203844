"""`seal-lite screen` with the real model: SmolLM2 in llama.cpp screens one real BFCL task, stores the screen and
says what it kept, and writes the frontier file a recipe names (the screen's logic with scripted rollouts is
tests/scripted/test_screen.py's)."""

from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.engines.store import Store
from seal_lite.runs.tasks import read_task_file
from seal_lite.step.screen import frontier, pass_rates


def test_screen_command_with_the_real_model(tmp_path):
    """SmolLM2 in llama.cpp on one real task: the command stores the screen, says what it kept and writes it."""
    out, frontier_file = tmp_path / "run", tmp_path / "frontier.txt"
    result = CliRunner().invoke(main, [
        "screen", "--out", str(out), "--samples", "2", "--write-frontier", str(frontier_file),
        "--set", "policy.model=smollm2-135m", "--set", "data.task_ids=[multi_turn_base_0]",
        "--set", "rollout.max_turns=1", "--set", "rollout.max_model_calls=1", "--set", "rollout.max_new_tokens=16",
        "--set", "grpo.tasks_per_step=1", "--set", "interface.tool_format=signatures"])  # short prompts: faster
    assert result.exit_code == 0, result.output
    rows = Store(out / "seal.db").screen()
    assert list(rows) == ["multi_turn_base_0"] and rows["multi_turn_base_0"]["samples"] == 2
    assert "multi_turn_base_0" in result.output and "tasks on the frontier" in result.output
    assert read_task_file(frontier_file) == frontier(pass_rates(rows))
    assert "# Written by: seal-lite screen --out" in frontier_file.read_text()
    assert f"data.task_file={frontier_file}" in result.output
