"""Broken recipes, as a new user writes them: refused before anything is written.

Each recipe of the corpus goes through `seal-lite run` and `seal-lite recipe`, and each time three things hold:
the exit status is 2; there is one line per problem, each naming its field and saying what to do instead; and no
run directory (nor anything else) appears. Checks are cheap: no model is loaded (the corpus runs in seconds).
"""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.engines import vllm_rollouts
from seal_lite.engines.model_sources import REGISTRY, PipGGUF
from seal_lite.runs import preflight

ABSENT = "seal-lite-test-absent-package"  # a pip distribution that no index holds


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


# (id, recipe as a dict (paths may use {tmp}), the fields its problems name, one line each, in order)
CORPUS = [
    ("unknown-model", {"policy": {"model": "no-such-model"}}, ["policy.model"]),
    ("registry-model-not-installed", {"policy": {"model": "absent-model"}}, ["policy.model"]),
    ("model-dir-missing", {"policy": {"model": "./models/nowhere"}}, ["policy.model"]),
    ("model-path-typo", {"policy": {"model": "assets/model-dri"}}, ["policy.model"]),  # not a hub id: assets/ is here
    ("gguf-missing", {"policy": {"model": "{tmp}/nowhere/model.gguf"}}, ["policy.model"]),
    ("gguf-not-a-gguf", {"policy": {"model": "{tmp}/assets/fake.gguf"}}, ["policy.model"]),
    ("model-dir-without-config", {"policy": {"model": "{tmp}/assets/empty-dir"}}, ["policy.model"]),
    ("model-is-a-text-file", {"policy": {"model": "{tmp}/assets/notes.txt"}}, ["policy.model"]),
    ("hub-id-malformed", {"policy": {"model": "my org/model--v1"}}, ["policy.model"]),
    ("hub-id-offline-not-cached", {"policy": {"model": "seal-lite-tests/not-cached"}}, ["policy.model"]),
    ("unsloth-not-here", {"policy": {"backend": "unsloth"}}, ["policy.backend"]),
    ("peft-4bit-without-bitsandbytes", {"policy": {"backend": "peft-4bit"}}, ["policy.backend"]),
    ("task-id-missing", {"data": {"task_ids": ["multi_turn_base_0", "multi_turn_base_9999"]}}, ["data.task_ids"]),
    ("task-id-malformed", {"data": {"task_ids": ["simple_1"]}}, ["grpo.tasks_per_step", "data.task_ids"]),
    ("task-ids-empty", {"data": {"task_ids": []}}, ["data.task_ids"]),
    ("category-unknown", {"data": {"categories": ["base", "simple"]}}, ["data.categories.1"]),
    ("num-tasks-beyond-the-split", {"data": {"categories": ["base"], "num_tasks": 150}}, ["data.num_tasks"]),
    ("step-wider-than-task-ids", {"data": {"task_ids": ["multi_turn_base_0"]}, "grpo": {"tasks_per_step": 2}},
     ["grpo.tasks_per_step"]),
    ("diagnoser-gguf-missing", {"diagnoser": {"model": "{tmp}/nowhere/diagnoser.gguf"}}, ["diagnoser.model"]),
    ("diagnoser-registry-not-installed", {"diagnoser": {"model": "absent-model"}}, ["diagnoser.model"]),
    ("diagnoser-model-not-gguf", {"diagnoser": {"mode": "server", "model": "{tmp}/assets/empty-dir"}},
     ["diagnoser.model"]),
    ("diagnoser-url-malformed", {"diagnoser": {"mode": "url", "url": "localhost:8000"}}, ["diagnoser.url"]),
    ("llamacpp-rollouts-of-a-directory", {"policy": {"model": "{tmp}/assets/model-dir"},
                                          "rollout": {"backend": "llamacpp"}}, ["rollout.backend"]),
    ("seed-negative", {"seed": -1}, ["seed"]),
    ("name-escapes-runs", {"name": "../elsewhere"}, ["name"]),
    ("output-dir-is-a-file", {"output_dir": "{tmp}/assets/notes.txt"}, ["output_dir"]),
    ("num-generations-one", {"rollout": {"num_generations": 1}}, ["rollout.num_generations"]),
    ("misspelled-field", {"grpo": {"stepz": 3}}, ["grpo.stepz"]),
    ("vllm-not-installed", {"rollout": {"backend": "vllm"}}, ["rollout.backend"]),
    ("everything-at-once", {"seed": -1, "policy": {"model": "./models/nowhere"},
                            "data": {"task_ids": ["multi_turn_base_0", "multi_turn_miss_param_999"]},
                            "diagnoser": {"model": "{tmp}/nowhere/diagnoser.gguf"}},
     ["seed", "policy.model", "data.task_ids", "diagnoser.model"]),
]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A working directory with a few files to point recipes at, a registry model whose package is absent, a hub
    that is offline, and no GPU training library nor vLLM installed."""
    _write(tmp_path / "assets" / "fake.gguf", "not a model\n")
    _write(tmp_path / "assets" / "notes.txt", "notes\n")
    (tmp_path / "assets" / "empty-dir").mkdir()
    _write(tmp_path / "assets" / "model-dir" / "config.json", "{}\n")
    monkeypatch.setitem(REGISTRY, "absent-model", PipGGUF((ABSENT,), ("absent.gguf",), "0" * 64, f"pip install {ABSENT}"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(preflight, "_installed", lambda module: module not in ("unsloth", "bitsandbytes")
                        and preflight.importlib.util.find_spec(module) is not None)
    monkeypatch.setattr(vllm_rollouts, "vllm_missing", lambda: f"vLLM is not installed: {vllm_rollouts.VLLM_INSTALL}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _recipe(tmp: Path, case_id: str, fields: dict) -> str:
    text = yaml.safe_dump(fields).replace("{tmp}", str(tmp))
    return _write(tmp / "recipes" / f"{case_id}.yaml", text)


def _files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.mark.parametrize("case_id, fields, expected", CORPUS, ids=[case[0] for case in CORPUS])
@pytest.mark.parametrize("command", ["run", "recipe"])
def test_a_broken_recipe_is_refused_before_anything_is_written(machine, command, case_id, fields, expected):
    recipe = _recipe(machine, case_id, fields)
    before = _files(machine)
    args = [command, recipe]
    if command == "run" and "output_dir" not in fields:
        args += ["--out", str(machine / "out")]
    result = CliRunner().invoke(main, args)

    assert result.exit_code == 2, result.output
    header, *lines = result.output.strip().splitlines()
    assert header == "Invalid recipe (nothing was written):"
    assert len(lines) == len(expected), result.output  # one line per problem, all of them at once
    for line, field in zip(lines, expected):
        assert line.startswith(f"{recipe}: {field}"), line  # the file, then the field
        assert "; " in line.split(field, 1)[1], line  # what is wrong; then what to do instead
    assert _files(machine) == before  # no run directory, no store, no lock file
    assert not (machine / "runs").exists() and not (machine / "out").exists()


def test_the_fixes_name_the_install_command_the_ids_and_the_choices(machine):
    def refusal(fields: dict) -> str:
        return CliRunner().invoke(main, ["recipe", _recipe(machine, "case", fields)]).output

    assert f"install them with: pip install {ABSENT}" in refusal({"policy": {"model": "absent-model"}})
    assert "ids run from multi_turn_base_0 to multi_turn_base_199" in refusal(
        {"data": {"task_ids": ["multi_turn_base_9999"]}})
    assert "smollm2-135m" in refusal({"policy": {"model": "no-such-model"}})  # the registry names
    assert "lower it to 100" in refusal({"data": {"categories": ["base"], "num_tasks": 150}})
    assert "pip install -e '.[gpu]'" in refusal({"policy": {"backend": "peft-4bit"}})


def test_a_recipe_that_only_names_what_is_here_passes(machine, tiny_model_dir):
    fields = {"policy": {"model": tiny_model_dir}, "data": {"task_ids": ["multi_turn_long_context_3"]},
              "grpo": {"tasks_per_step": 1}, "diagnoser": {"model": "smollm2-135m"}}
    result = CliRunner().invoke(main, ["recipe", _recipe(machine, "fine", fields)])
    assert result.exit_code == 0, result.output


def test_the_two_first_reported_cases_through_the_installed_command(tmp_path):
    """Issue 18's two: a model and a BFCL task id that do not exist used to exit 1 after creating the run."""
    for setting in ("policy.model=qwen2.5-coder-7b", "data.task_ids=[multi_turn_base_4242]"):
        out = tmp_path / "run"
        result = subprocess.run([sys.executable, "-m", "seal_lite", "run", "--out", str(out), "--set", setting,
                                 "--set", "grpo.tasks_per_step=1"], capture_output=True, text=True, cwd=tmp_path,
                                env={**os.environ, "COLUMNS": "200"}, timeout=600)
        assert result.returncode == 2, result.stderr
        assert setting.split("=")[0] in result.stderr and "Traceback" not in result.stderr
        assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_before_storing_a_step_leaves_no_directory(tmp_path, monkeypatch, tiny_model_dir):
    """What preflight cannot know (a hub model that turns out not to load, a policy that does not fit) fails in
    the run; if no step was stored, the directories the run created go too. One that existed stays."""
    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines import policy
    from seal_lite.runs.train import run

    def broken(*args, **kwargs):
        raise RuntimeError("the policy does not load")

    monkeypatch.setattr(policy, "load_policy", broken)
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "diagnoser.mode": "off"})
    with pytest.raises(RuntimeError, match="does not load"):
        run(recipe, tmp_path / "runs" / "new")
    assert list(tmp_path.iterdir()) == []

    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError, match="does not load"):
        run(recipe, tmp_path / "mine")
    assert list(tmp_path.iterdir()) == [tmp_path / "mine"]


@pytest.mark.parametrize("command", ["run", "recipe"])
def test_vllm_with_a_4bit_policy_is_refused_without_the_plugin_that_loads_it(machine, monkeypatch, command):
    """vLLM is here (the fixture's stand-in), bitsandbytes too, but vllm-bnb-plugin is not where vLLM looks for its
    plugins (its entry points list none): vLLM 0.32 could not load the 4-bit policy."""
    monkeypatch.setattr(preflight, "_installed", lambda module: module != "unsloth"
                        and preflight.importlib.util.find_spec(module) is not None)
    monkeypatch.setattr(vllm_rollouts, "vllm_missing", lambda: None)
    entry_points = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: ())
    recipe = _recipe(machine, "vllm-4bit", {"policy": {"backend": "peft-4bit", "dtype": "bfloat16"},
                                            "rollout": {"backend": "vllm"}})
    before = _files(machine)
    result = CliRunner().invoke(main, [command, recipe, *(["--out", str(machine / "out")] if command == "run" else [])])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()[1:]
    assert line.startswith(f"{recipe}: rollout.backend") and "vllm-bnb-plugin is not installed" in line
    assert vllm_rollouts.BNB_PLUGIN_INSTALL in line
    assert _files(machine) == before

    # with the plugin where vLLM finds it, the policy must be 16-bit: the plugin sizes its NF4 weights for that
    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.syspath_prepend(str(vllm_rollouts.CPU_BUILD))
    float32 = _recipe(machine, "vllm-4bit-fp32", {"policy": {"backend": "peft-4bit", "dtype": "float32"},
                                                  "rollout": {"backend": "vllm"}})
    [line] = CliRunner().invoke(main, ["recipe", float32]).output.strip().splitlines()[1:]
    assert line.startswith(f"{float32}: policy.dtype") and "set policy.dtype bfloat16" in line


def test_paged_rollouts_with_an_unsloth_policy_are_refused(monkeypatch):
    """Unsloth replaces the attention forwards, so transformers' paged attention would never run: the recipe check
    says so and names the backends that work, before anything loads."""
    from seal_lite.core.recipe import load_recipe
    from seal_lite.runs import preflight

    monkeypatch.setattr(preflight, "_cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "_installed", lambda module: True)
    problems = preflight.recipe_problems(load_recipe(None, {"policy.backend": "unsloth", "rollout.backend": "paged"}))
    assert [(field, value) for field, value, _ in problems] == [("rollout.backend", "paged")]
    assert "policy.backend peft-4bit" in problems[0][2]
    assert preflight.recipe_problems(load_recipe(None, {"policy.backend": "peft-4bit", "rollout.backend": "paged"})) == []
