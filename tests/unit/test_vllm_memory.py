"""The vLLM rollout engine's memory by the model (seal_lite/core/memory.py), against hand-computed figures: the
KV cache its share of the card leaves beside its copy of the weights, and the largest share the trainer allows."""

import pytest

from seal_lite.core.memory import (
    CUDA_CONTEXT,
    GIB,
    KNOWN_SHAPES,
    NF4_BYTES,
    VLLM_ACTIVATIONS,
    Shape,
    vllm_cache_tokens,
    vllm_share,
)

TOY = Shape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, tied_embeddings=True)


def test_the_cache_is_the_share_less_the_weights_and_activations():
    card = 4 * GIB
    # 16-bit: embeddings 10 x 4 x 2 bytes, projections 288 x 2, the LoRA slot of rank 1 in 16-bit; 16 bytes a token
    weights = 80 + 288 * 2 + TOY.lora_params(1) * 2
    assert vllm_cache_tokens(TOY, card, 0.5, 2, False, 1) == (2 * GIB - weights - VLLM_ACTIVATIONS) // 16
    quantized = 80 + 288 * NF4_BYTES + TOY.lora_params(1) * 2  # NF4 projections when the policy is 4-bit
    assert vllm_cache_tokens(TOY, card, 0.5, 2, True, 1) == int((2 * GIB - quantized - VLLM_ACTIVATIONS) // 16)
    assert vllm_cache_tokens(TOY, card, 0.2, 2, False, 1) == 0  # its activations alone exceed 0.8 GB


def test_the_share_leaves_the_trainer_and_the_headroom():
    card = 10 * GIB
    trainer = 80 + 288 * 2 + 16 * TOY.lora_params(4) + CUDA_CONTEXT  # weights, LoRA with Adam, the CUDA context
    assert vllm_share(TOY, card, 2, False, 4) == pytest.approx(1 - 0.1 - trainer / card)
    # the 7B policy in 4-bit: on 24 GB vLLM may take about 0.63 and holds 10 rows of the paper's 16k context
    seven_b = KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    share = vllm_share(seven_b, 24 * GIB, 2, True, 16)
    assert 0.6 < share < 0.65 and vllm_cache_tokens(seven_b, 24 * GIB, share, 2, True, 16) // 16384 == 10
    assert vllm_share(seven_b, 4 * GIB, 2, True, 16) == 0.0  # the trainer alone fills a 4 GB card


@pytest.mark.parametrize(("name", "card_gb"), [("gpu-24gb", 24), ("paper-qwen2.5-7b", 80),
                                                  ("paper-toolace-llama3.1-8b", 80)])
def test_each_gpu_recipes_vllm_share_leaves_the_trainer_room_and_holds_a_whole_episode(name, card_gb):
    from pathlib import Path

    from seal_lite.core.recipe import load_recipe

    recipe = load_recipe(Path(__file__).parents[2] / "recipes" / f"{name}.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    share = recipe.rollout.vllm_memory
    assert share <= vllm_share(shape, card_gb * GIB, 2, True, recipe.policy.lora_r)
    assert vllm_cache_tokens(shape, card_gb * GIB, share, 2, True, recipe.policy.lora_r) >= 4 * 16384
