"""Choosing and loading the policy backend (the GPU paths are chosen here without a GPU; see benchmarks/RESULTS.md)."""

import pytest
import torch

from seal_lite.recipe import load_recipe
from seal_lite.training.policy import PolicyBackendError, choose_backend, load_policy

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")


@pytest.mark.parametrize(("cuda", "installed", "expected"), [
    (True, {"unsloth", "bitsandbytes"}, "unsloth"),
    (True, {"bitsandbytes"}, "peft-4bit"),
    (True, set(), "peft"),
    (False, {"unsloth", "bitsandbytes"}, "peft"),
])
def test_auto_prefers_unsloth_then_bitsandbytes_then_plain_lora(cuda, installed, expected):
    assert choose_backend("auto", cuda, installed)[0] == expected


def test_requested_backend_that_cannot_run_says_why_and_what_to_use():
    with pytest.raises(PolicyBackendError, match="needs an NVIDIA GPU.*use auto, peft-4bit or peft"):
        choose_backend("unsloth", False, {"unsloth"})
    with pytest.raises(PolicyBackendError, match=r"pip install -e '\.\[gpu\]'"):
        choose_backend("unsloth", True, {"bitsandbytes"})
    with pytest.raises(PolicyBackendError, match="bitsandbytes"):
        choose_backend("peft-4bit", True, set())
    with pytest.raises(PolicyBackendError, match="bitsandbytes"):
        choose_backend("peft-4bit", False, set())
    assert choose_backend("peft", True, {"unsloth"})[0] == "peft"


def test_4bit_runs_on_a_cpu_when_requested_but_auto_keeps_plain_lora_there():
    backend, reason = choose_backend("peft-4bit", False, {"bitsandbytes"})
    assert backend == "peft-4bit" and "CPU" in reason
    assert choose_backend("auto", False, {"bitsandbytes"})[0] == "peft"


@cpu_only
def test_4bit_policy_loads_nf4_layers_on_a_cpu(tiny_model_dir):
    from seal_lite.training.policy import count_linear4bit

    policy = load_policy(tiny_model_dir, load_recipe(None, {"policy.backend": "peft-4bit", "policy.dtype": "float32"}))
    assert policy.backend == "peft-4bit" and policy.model.device.type == "cpu"
    assert count_linear4bit(policy.model) == 2 * 7  # every projection of both decoder blocks


@cpu_only
def test_cpu_loads_plain_lora_in_the_recipe_dtype(tiny_model_dir):
    for dtype, expected in (("auto", torch.bfloat16), ("float32", torch.float32)):
        policy = load_policy(tiny_model_dir, load_recipe(None, {"policy.dtype": dtype}))
        assert (policy.backend, policy.dtype, policy.model.dtype) == ("peft", expected, expected)
        assert policy.peft_config is not None  # TRL wraps the model with LoRA
        assert not any(hasattr(module, "lora_A") for module in policy.model.modules())


@cpu_only
def test_run_with_an_impossible_backend_fails_cleanly(tmp_path, tiny_model_dir):
    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--set", f"policy.model={tiny_model_dir}",
                                       "--set", "policy.backend=unsloth", "--set", "diagnoser.mode=off"])
    assert result.exit_code == 1
    assert "policy.backend unsloth needs an NVIDIA GPU" in result.output
    assert not isinstance(result.exception, PolicyBackendError)  # shown as a message, not a traceback
