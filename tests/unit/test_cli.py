"""The command line as a user meets it: help, recipe errors, progress lines and the run summary.

The shipped recipes are tests/unit/test_recipes.py's; the small real run checked against its store is the README
tour's (tests/real/test_docs.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.errors import SealLiteError
from seal_lite.core.recipe import load_recipe

ROOT = Path(__file__).parents[2]


def test_help_for_group_and_commands():
    runner = CliRunner()
    assert "seal-lite run" in runner.invoke(main, ["--help"]).output
    for command in ("run", "recipe", "verify", "diagnose"):
        result = runner.invoke(main, [command, "--help"])
        assert result.exit_code == 0 and "Examples:" in result.output


def test_invalid_recipe_names_field_reason_and_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  num_generations: 1\n")
    result = CliRunner().invoke(main, ["run", str(bad)])
    assert result.exit_code == 2
    assert "rollout.num_generations = 1: GRPO needs at least 2 samples per task to compare them; set it to 4" in result.output

    bad.write_text("grpo:\n  stepz: 3\npolicy:\n  dtype: float16\n")
    result = CliRunner().invoke(main, ["recipe", str(bad)])
    assert result.exit_code == 2
    assert "grpo.stepz" in result.output and "remove it or check its spelling" in result.output
    assert "policy.dtype" in result.output and "'float16'" in result.output

    bad.write_text("diagnoser:\n  mode: url\n")
    result = CliRunner().invoke(main, ["recipe", str(bad)])
    assert result.exit_code == 2 and "diagnoser.url = None: diagnoser.mode url needs the server's base URL" in result.output

    assert load_recipe(None, {"diagnoser.mode": False}).diagnoser.mode == "off"  # `--set diagnoser.mode=off`
    bad.write_text("diagnoser:\n  mode: off\n")
    assert load_recipe(bad).diagnoser.mode == "off"  # YAML reads a bare off as false

    bad.write_text("grpo: [1, 2\n")
    result = CliRunner().invoke(main, ["run", str(bad)])
    assert result.exit_code == 2 and "not valid YAML" in result.output


def test_progress_without_a_terminal_prints_each_task_group_and_each_step(capsys):
    """Logs and notebooks (Colab's ``!seal-lite run``) see a line per task group as it finishes (a group dynamic
    sampling adds is named so), then per step."""
    from seal_lite.console import RichProgress

    with RichProgress(2) as progress:
        progress.step_started(1, 2)
        progress.task_done("multi_turn_base_3", [0.0, 1.0, 0.0, 0.0])
        progress.task_done("multi_turn_base_7", [0.0] * 4)
        progress.task_done("multi_turn_base_9", [1.0, 0.0, 1.0, 1.0])  # replaces base_7's group
        progress.step_finished(1, {"reward/mean": 0.125, "reward/update_mean": 0.375, "grpo/weight_min": 1.0,
                                   "grpo/weight_max": 1.5, "interface/version": 1, "time/rollout_s": 30.0,
                                   "grpo/advantage_abs_mean": 0.5, "labels/state_mismatch_rate": 1.0})
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:3] == ["step 1/2: task 1/2 multi_turn_base_3, rewards [0, 1, 0, 0]",
                         "step 1/2: task 2/2 multi_turn_base_7, rewards [0, 0, 0, 0]",
                         "step 1/2: extra group 1 (dynamic sampling) multi_turn_base_9, rewards [1, 0, 1, 1]"]
    assert lines[3].startswith("step 1/2: reward 0.12 (update batch 0.38)") and "policy update follows" in out


def test_a_rescreen_has_its_own_bar_and_its_time_is_not_counted_as_rollouts(capsys):
    from seal_lite.console import RichProgress

    with RichProgress(20) as progress:
        progress.step_started(11, 2)
        progress.screen_started(11, 3)
        for task_id, passes in (("multi_turn_base_1", 4), ("multi_turn_base_2", 2), ("multi_turn_base_3", 0)):
            progress.task_screened(task_id, passes, 4)
        progress.step_finished(11, {"reward/mean": 0.5, "grpo/weight_min": 1.0, "grpo/weight_max": 1.0,
                                    "interface/version": 1, "time/rollout_s": 700.0, "time/rescreen_s": 540.0,
                                    "screen/rescreen_kept": 1, "screen/rescreened_tasks": 3,
                                    "screen/frontier_tasks": 2})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["screen: 0 of 1 kept; multi_turn_base_1: 4/4 passed",
                         "screen: 1 of 2 kept; multi_turn_base_2: 2/4 passed",
                         "screen: 1 of 3 kept; multi_turn_base_3: 0/4 passed"]
    assert "rollouts 160 s  re-screen 540 s (1 of 3 on the frontier; drawing from 2)" in lines[3]


def test_the_run_summary_draws_the_reward_curve():
    from seal_lite.console import reward_curve, sparkline

    assert sparkline([0.0, 0.5, 1.0, 1.2]) == "▁▅██"
    assert reward_curve([0.0]) == "▁"  # too few steps for quarters
    assert reward_curve([0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 1.0]) == (
        "▁▃▅▆██▆█  first quarter 0.12, last quarter 0.88")


def test_the_run_summary_says_what_each_step_did_and_what_to_run_next(tmp_path, monkeypatch):
    from rich.console import Console

    from seal_lite import console
    from seal_lite.runs.train import RunSummary

    def shown(summary) -> str:
        monkeypatch.setattr(console, "console", Console(width=200, record=True, file=open(tmp_path / "out", "w")))
        console.print_summary(summary)
        return console.console.export_text()

    summary = RunSummary(db_path=tmp_path / "seal.db", steps=2, reward_mean=0.375, label_counts={"pass": 3},
                         weight_min=1.0, weight_max=1.4, wall_time_s=480.0, loss=[0.0123, None],
                         rewards=[0.25, 0.5], signal=[1.0, 0.5], lora_change=[0.0412, 0.0],
                         interface_changes=["after step 1: guideline added: Call the tools."],
                         explanations=4, name="quickstart", run_dir=tmp_path)
    text = shown(summary)
    assert "0.25, 0.50" in text and "mean 0.375" in text
    assert "100%, 50% of the groups each step drew" in text
    assert "0.0123, -" in text and "0.0412, 0" in text
    assert "v1 -> v2" in text and "after step 1: guideline added: Call the tools." in text
    assert "explained 4 failed turns" in text and f"seal-lite interface diff {tmp_path} 1 2" in text
    assert f"seal-lite report {tmp_path}" in text and "recipes/cpu-learn.yaml" in text
    summary.name, summary.interface_changes = "cpu-learn", []  # the hint to watch a rise is the quickstart's
    unchanged = shown(summary)
    assert "recipes/cpu-learn.yaml" not in unchanged
    assert "unchanged (v1)" in unchanged and "interface diff" not in unchanged


@pytest.mark.parametrize("split", ["bogus_id", "multi_turn_base_9999", "multi_turn_base_0,nope"])
def test_an_unknown_split_id_exits_2_naming_it_without_a_traceback(split):
    """An id that is no BFCL multi-turn id, or one bfcl-eval lacks, is refused before any model loads (it once
    ended in a KeyError traceback)."""
    result = CliRunner().invoke(main, ["eval", "smollm2-135m", "--split", split])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert split.split(",")[-1] in result.output and "--split" in result.output


def test_library_errors_end_as_one_message_and_their_exit_status(tmp_path):
    """SealLiteGroup: a RunError (no store here) exits 1, a ConfigError (a bad --set) exits 2; no traceback."""
    missing = CliRunner().invoke(main, ["diagnose", str(tmp_path)])
    assert missing.exit_code == 1 and isinstance(missing.exception, SystemExit)
    assert missing.output.startswith("Error: ") and "seal.db does not exist" in missing.output
    bad_set = CliRunner().invoke(main, ["recipe", "--set", "grpo.steps"])
    assert bad_set.exit_code == 2 and "write KEY=VALUE" in bad_set.output


def test_the_package_exports_the_facade_lazily():
    """`seal_lite.run` and `seal_lite.report` are the facade's functions, also after every module is imported (no
    submodule shares their names); importing the core loads neither the facade nor torch."""
    import seal_lite
    import seal_lite.html_report
    import seal_lite.runs.run_dir as run_dir
    from seal_lite import api

    assert run_dir.run_status is not None  # `import seal_lite.runs.X as name` works
    assert (seal_lite.run, seal_lite.report, seal_lite.load_recipe) == (api.run, api.report, load_recipe)
    assert seal_lite.SealLiteError is SealLiteError and "evaluate" in dir(seal_lite)
    loaded = subprocess.run([sys.executable, "-c", "import sys, seal_lite.core.calls; print(sorted(m for m in "
                             "sys.modules if m in ('seal_lite.api', 'torch', 'transformers')))"],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
