"""What ``rollout.backend`` resolves to (seal_lite/engines/rollout_engine.py ``rollout_choice``), with a GPU and
without: auto picks only engines that have run where it picks them, and says which and why."""

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.rollout_engine import rollout_choice


def test_auto_on_a_gpu_generates_with_the_policy_and_leaves_vllm_to_be_named():
    """No GPU has run vLLM yet, so auto never starts it (with a 4-bit policy, vLLM 0.32 alone cannot)."""
    backend, why = rollout_choice(load_recipe(None, {"policy.model": "Qwen/Qwen2.5-7B-Instruct"}), gpu=True)
    assert backend == "transformers"
    assert why == ("a GPU: token-budgeted generate; vLLM runs only when named, rollout.backend: vllm, until a GPU "
                   "has run it")


@pytest.mark.parametrize("model, backend", [("qwen2.5-coder-0.5b", "llamacpp"), ("models/policy.gguf", "llamacpp"),
                                            ("Qwen/Qwen2.5-0.5B-Instruct", "transformers")])
def test_auto_without_a_gpu_serves_a_gguf_with_llamacpp(model, backend):
    assert rollout_choice(load_recipe(None, {"policy.model": model}), gpu=False)[0] == backend


@pytest.mark.parametrize("gpu", [True, False])
def test_a_named_engine_is_the_one_used(gpu):
    recipe = load_recipe(None, {"rollout.backend": "vllm"})
    assert rollout_choice(recipe, gpu=gpu) == ("vllm", "rollout.backend")
