"""``seal-lite rehearse``'s plan (seal_lite/runs/rehearse.py): for each GPU recipe, the card it is written for and the
configuration that card runs (backend, dtype, 4-bit layers, engine, attention, update path), and what the toy run
is told to run here. The toy runs themselves are in tests/real/test_rehearse.py and the T4 notebook's test."""

from __future__ import annotations

from pathlib import Path

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.runs.rehearse import default_card, plan

ROOT = Path(__file__).parents[2]


def rehearsal(name: str, **overrides):
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml", overrides)
    card = default_card(recipe)
    return card, plan(recipe, card, "/toy", ["multi_turn_base_0", "multi_turn_base_1"], ["multi_turn_base_100"])


def settings(done) -> dict[str, tuple[str, str]]:
    return {setting.name: (setting.on_card, setting.rehearsed) for setting in done.settings}


def test_colab_t4_is_rehearsed_for_a_t4_in_fp16_on_nf4_layers_with_the_paged_engine():
    card, done = rehearsal("colab-t4")
    seen = settings(done)
    assert card.name == "T4" and not card.bf16
    assert seen["dtype"] == ("float16 (the card has no bf16)", "float16")
    assert seen["4-bit layers"][1].startswith("NF4") and seen["policy backend"][1] == "peft-4bit"
    assert seen["rollout engine"] == ("paged", "paged") and seen["attention"][0] == "paged|sdpa"
    assert "suffix graphs kept" in seen["update"][1]
    assert done.overrides["policy.dtype"] == "float16" and done.overrides["rollout.backend"] == "paged"
    assert done.overrides["policy.model"] == "/toy" and done.overrides["grpo.steps"] == 2


@pytest.mark.parametrize("name, card_name", [("gpu-24gb", "RTX 4090"), ("paper-qwen2.5-7b", "A100 80GB")])
def test_the_7b_recipes_are_rehearsed_in_bf16_with_the_engine_auto_picks_on_a_gpu(name, card_name):
    """auto picks generate on a GPU and the paged engine on a CPU: the rehearsal names the GPU's."""
    card, done = rehearsal(name)
    seen = settings(done)
    assert card.name == card_name
    assert seen["dtype"] == ("bfloat16", "bfloat16") and seen["attention"][0] == "sdpa"
    assert done.overrides["rollout.backend"] == "transformers" and done.overrides["policy.backend"] == "peft-4bit"
    recipe = load_recipe(ROOT / "recipes" / f"{name}.yaml")
    assert done.overrides["validation.before_training"] == recipe.validation.before_training


def test_what_a_cpu_cannot_run_is_replaced_by_the_nearest_and_named():
    _, done = rehearsal("gpu-24gb", **{"policy.backend": "auto", "rollout.backend": "vllm"})
    seen = {setting.name: setting for setting in done.settings}
    assert seen["policy backend"].on_card.startswith("unsloth") and seen["policy backend"].rehearsed == "peft-4bit"
    assert "Unsloth needs a GPU" in seen["policy backend"].note
    assert seen["rollout engine"].rehearsed == "paged" and "vLLM needs a GPU" in seen["rollout engine"].note
    assert done.overrides["policy.backend"] == "peft-4bit" and done.overrides["rollout.backend"] == "paged"
    assert seen["update"].on_card.startswith("one pass per trajectory") and not done.overrides["grpo.shared_prefix"]


def test_a_dtype_the_recipe_names_is_kept_whatever_the_card():
    _, done = rehearsal("colab-t4", **{"policy.dtype": "float32"})
    assert settings(done)["dtype"] == ("float32", "float32")
