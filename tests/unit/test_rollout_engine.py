"""What ``rollout.backend`` resolves to (seal_lite/engines/rollout_engine.py ``rollout_choice``), with a GPU and
without: auto picks only engines that have run where it picks them, and says which and why."""

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.rollout_engine import rollout_choice


def test_auto_on_a_gpu_generates_with_the_policy_and_leaves_paged_and_vllm_to_be_named():
    """No GPU has measured paged or vLLM against generate yet, so auto starts neither there."""
    backend, why = rollout_choice(load_recipe(None, {"policy.model": "Qwen/Qwen2.5-7B-Instruct"}), gpu=True)
    assert backend == "transformers"
    assert why == ("a GPU: token-budgeted generate; paged and vLLM run only when named (rollout.backend paged or "
                   "vllm) until a GPU has measured them")


@pytest.mark.parametrize("model, backend", [("qwen2.5-coder-0.5b", "llamacpp"), ("models/policy.gguf", "llamacpp"),
                                            ("Qwen/Qwen2.5-0.5B-Instruct", "paged")])
def test_auto_without_a_gpu_serves_a_gguf_with_llamacpp_and_any_other_model_continuously(model, backend):
    assert rollout_choice(load_recipe(None, {"policy.model": model}), gpu=False)[0] == backend


@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("named", ["vllm", "paged", "transformers"])
def test_a_named_engine_is_the_one_used(gpu, named):
    recipe = load_recipe(None, {"rollout.backend": named})
    assert rollout_choice(recipe, gpu=gpu) == (named, "rollout.backend")
