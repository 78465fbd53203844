"""The command line as a user meets it: help, recipe errors, and one small real run checked against its store."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlite_utils
import yaml
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.recipe import Recipe, load_recipe

ROOT = Path(__file__).parent.parent


def test_help_for_group_and_commands():
    runner = CliRunner()
    assert "seal-lite run" in runner.invoke(main, ["--help"]).output
    for command in ("run", "recipe", "verify", "diagnose"):
        result = runner.invoke(main, [command, "--help"])
        assert result.exit_code == 0 and "Examples:" in result.output


def test_quickstart_file_equals_the_embedded_default():
    assert load_recipe(ROOT / "recipes" / "quickstart.yaml") == Recipe()
    written = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    assert written == Recipe().model_dump()  # it restates every default, so users see every knob


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_recipe_validates(path):
    assert load_recipe(path).name == path.stem


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
    """Logs and notebooks (Colab's ``!seal-lite run``) see a line per task group as it finishes, then per step."""
    from seal_lite.console import RichProgress

    with RichProgress(2) as progress:
        progress.step_started(1, 2)
        progress.task_done("multi_turn_base_3", [0.0, 1.0, 0.0, 0.0])
        progress.task_done("multi_turn_base_7", [0.0] * 4)
        progress.step_finished(1, {"reward/mean": 0.125, "grpo/weight_min": 1.0, "grpo/weight_max": 1.5,
                                   "interface/version": 1, "time/rollout_s": 30.0, "grpo/advantage_abs_mean": 0.5,
                                   "labels/state_mismatch_rate": 1.0})
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:2] == ["step 1/2: task 1/2 multi_turn_base_3, rewards [0, 1, 0, 0]",
                         "step 1/2: task 2/2 multi_turn_base_7, rewards [0, 0, 0, 0]"]
    assert lines[2].startswith("step 1/2: reward 0.12") and "policy update follows" in out


def test_small_real_run_prints_what_the_store_holds(tmp_path):
    """SmolLM2-135M from its pip GGUF, real BFCL, a real TRL step; the summary must match seal.db."""
    out = tmp_path / "run"
    settings = ["data.num_tasks=1", "grpo.tasks_per_step=1", "grpo.steps=1", "rollout.num_generations=2",
                "rollout.max_new_tokens=16", "rollout.max_model_calls=2", "rollout.max_turns=1"]
    command = [sys.executable, "-m", "seal_lite", "run", "--out", str(out)]
    for setting in settings:
        command += ["--set", setting]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout

    db = sqlite_utils.Database(out / "seal.db")
    assert set(db.table_names()) >= {"runs", "steps", "tasks", "trajectories", "turns", "interface_versions", "metrics"}
    run = next(db["runs"].rows)
    assert run["status"] == "finished"
    steps = list(db["steps"].rows)
    trajectories = list(db["trajectories"].rows)
    assert len(steps) == 1 and len(trajectories) == 2 and db["turns"].count == 2

    def row(name):
        match = re.search(rf"{re.escape(name)}\s*│\s*(.+?)\s*│", text)
        assert match, f"summary lacks {name!r}:\n{text}"
        return match.group(1)

    assert int(row("steps")) == len(steps)
    assert float(row("mean reward (official verdict)")) == round(sum(t["reward"] for t in trajectories) / 2, 3)
    labels = dict(db.execute("select label, count(*) from turns group by label").fetchall())
    assert row("turn labels") == ", ".join(f"{label} {n}" for label, n in sorted(labels.items(), key=lambda x: -x[1]))
    low, high = (float(x) for x in row("diagnosis weight range").split(" - "))
    assert (low, high) == (round(steps[0]["weight_min"], 2), round(steps[0]["weight_max"], 2))
    assert row("database") == str(out / "seal.db")
    assert steps[0]["loss"] is not None and (out / "adapter" / "adapter_config.json").exists()

    # on a CPU the default rollout engine is llama.cpp with the exported LoRA. SmolLM2 fails every trajectory, so
    # the step has no learning signal: the update is skipped, and with it the engines' log-prob comparison
    assert "rollouts llamacpp" in text
    metrics = dict(db.execute("select name, value from metrics where step = 1").fetchall())
    assert metrics["grpo/advantage_abs_mean"] == 0 and metrics["grpo/update_skipped"] == 1.0
    assert "grpo/engine/logprob_gap_mean" not in metrics
    assert "no learning signal" in text
    assert metrics["time/prefill_s"] > 0 and metrics["time/decode_s"] > 0 and metrics["time/update_s"] > 0

    # the trained policy next to the base model on a held-out task; results are stored with the run
    evaluated = subprocess.run([sys.executable, "-m", "seal_lite", "eval", str(out), "--base", "--split",
                                "multi_turn_base_1"], capture_output=True, text=True, timeout=1800, check=False,
                               env={**os.environ, "COLUMNS": "200"})
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "base" in evaluated.stdout and "step 1" in evaluated.stdout
    stored = {(row["model"], row["task_id"]) for row in db["evaluations"].rows}
    assert stored == {("base", "multi_turn_base_1"), ("step 1", "multi_turn_base_1")}
    missing = subprocess.run([sys.executable, "-m", "seal_lite", "eval", str(out), "--step", "7"],
                             capture_output=True, text=True, timeout=900, check=False)  # a hang guard
    assert missing.returncode == 1 and "keeps checkpoints of steps [1], not 7" in missing.stderr


def test_the_paper_recipe_says_what_the_paper_did():
    """SEAL_METHOD.md §2 and §8; what still differs is docs/deviations.md's (LoRA, its learning rate, 4-bit)."""
    paper = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    rollout, grpo = paper.rollout, paper.grpo
    assert (rollout.num_generations, rollout.temperature, rollout.max_model_calls, rollout.max_response_tokens,
            rollout.max_context_tokens, rollout.max_calls_per_turn, rollout.max_turns) == (8, 1.0, 20, 4096, 16384,
                                                                                          None, None)
    assert (rollout.parser, paper.interface.tool_format) == ("strict", "official")
    assert (grpo.steps, grpo.tasks_per_step, grpo.mini_batches, grpo.num_iterations) == (72, 32, 4, 1)
    assert (grpo.loss_type, grpo.epsilon, grpo.dual_clip, grpo.beta, grpo.max_grad_norm, grpo.weight_decay) == \
        ("grpo", 0.2, 10.0, 0.001, 1.0, 0.01)
    assert (paper.data.num_tasks, paper.interface.schema_cues, paper.interface.recovery_feedback,
            paper.interface.capability_hints, paper.diagnoser.mode) == (400, True, False, False, "off")
    rows = (ROOT / "docs" / "deviations.md").read_text()
    for deviation in ("LoRA adapter", "2e-5", "4-bit NF4"):
        assert deviation in rows


def test_each_ablation_is_the_paper_recipe_minus_its_part():
    from seal_lite.runner import recipe_differences

    paper = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml").model_dump()
    ablated = {
        "ablation-vanilla-grpo": ["grpo.closed_loop", "grpo.diagnosis_weighting", "interface.schema_cues"],
        "ablation-no-interface": ["interface.schema_cues"],
        "ablation-no-reweighting": ["grpo.diagnosis_weighting"],
        "ablation-no-closed-loop": ["grpo.closed_loop"],
    }
    for name, parts in ablated.items():
        recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml").model_dump()
        assert sorted(recipe_differences(paper, recipe)) == sorted(["name", *parts]), name


def test_the_cpu_experiment_compares_seal_with_every_seal_part_off():
    """scripts/cpu_experiment.py's arms: SEAL is recipes/cpu-qwen0.5b.yaml, vanilla GRPO is that recipe with
    exactly the parts recipes/ablation-vanilla-grpo.yaml turns off (and φ_err, φ_cap, which the paper lacks)."""
    import importlib.util

    from seal_lite.cli import _parse_overrides
    from seal_lite.runner import recipe_differences

    spec = importlib.util.spec_from_file_location("cpu_experiment", ROOT / "scripts" / "cpu_experiment.py")
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    common = _parse_overrides(tuple(experiment.COMMON))
    seal = load_recipe(ROOT / experiment.RECIPE, {**common, **_parse_overrides(tuple(experiment.METHODS["SEAL"]))})
    vanilla = load_recipe(ROOT / experiment.RECIPE,
                          {**common, **_parse_overrides(tuple(experiment.METHODS["vanilla GRPO"]))})
    assert sorted(recipe_differences(seal.model_dump(), vanilla.model_dump())) == [
        "grpo.closed_loop", "grpo.diagnosis_weighting", "interface.capability_hints", "interface.recovery_feedback",
        "interface.schema_cues"]
    assert seal.interface.schema_cues and seal.grpo.diagnosis_weighting and seal.grpo.closed_loop
    paper_vanilla = load_recipe(ROOT / "recipes" / "ablation-vanilla-grpo.yaml")
    # both arms train under the opt-in signatures format (a cost choice, not a SEAL part)
    assert seal.interface.tool_format == vanilla.interface.tool_format == "signatures"
    assert (vanilla.interface.model_copy(update={"tool_format": "official"}), vanilla.grpo.diagnosis_weighting,
            vanilla.grpo.closed_loop) == (paper_vanilla.interface, paper_vanilla.grpo.diagnosis_weighting,
                                          paper_vanilla.grpo.closed_loop)
    # the base model is evaluated under the same rollout budget as the runs' own evaluations
    base_rollout = load_recipe(None, _parse_overrides(tuple(f"rollout.{k}" for k in experiment.ROLLOUT)
                                                      + ("rollout.max_turns=2",))).rollout
    assert base_rollout.model_dump(exclude={"backend", "num_generations", "temperature", "max_logprob_gap"}) == \
        seal.rollout.model_dump(exclude={"backend", "num_generations", "temperature", "max_logprob_gap"})
