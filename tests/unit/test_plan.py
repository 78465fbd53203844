"""seal_lite/core/plan.py on one card (``seal-lite recipe RECIPE --card NAME``): the memory model's fit, the budget
that makes a recipe fit, the update's estimated peak worked out by hand, and the command on a machine without the
card (the plan needs none)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core import plan
from seal_lite.core.memory import CUDA_CONTEXT, KNOWN_SHAPES, Shape, resident_bytes
from seal_lite.core.recipe import load_recipe

ROOT = Path(__file__).parents[2]
TOY = Shape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, tied_embeddings=True)
CARD = {plan.card_key(card): card for card in plan.CARDS}


def test_the_updates_peak_estimate_worked_out_by_hand():
    """Resident part and CUDA context; each of 2 layers' 100-token input in 16 bits (2 x 100 x 4 x 2); one layer
    recomputed, its MLP's 3 intermediates and 4 hidden-sized tensors (100 x (24 + 16) x 2); one 1,024-position
    chunk of fp32 logits and their gradient (1024 x 10 x 4 x 2)."""
    expected = resident_bytes(TOY, 2, True, 8) + CUDA_CONTEXT + 1600 + 8000 + 81920
    assert plan.update_peak_bytes(TOY, 100, 2, 8) == int(expected)


def test_a_recipe_that_does_not_fit_a_card_is_told_the_budget_that_does():
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    on_4090 = plan.card_plan(recipe, shape, CARD["rtx-4090"])
    assert on_4090["call_fits"] and on_4090["fitting_budget"] >= recipe.rollout.generation_token_budget
    on_t4 = plan.card_plan(recipe, shape, CARD["t4"])
    assert not on_t4["call_fits"] and 0 < on_t4["fitting_budget"] < recipe.rollout.generation_token_budget
    cut = recipe.model_copy(update={"rollout": recipe.rollout.model_copy(
        update={"generation_token_budget": on_t4["fitting_budget"]})})
    assert plan.card_plan(cut, shape, CARD["t4"])["call_fits"]  # the --set it names makes it fit
    # auto counts both GPU backends: Unsloth's generate holds less than bitsandbytes + peft's at the same rows
    unsloth = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"backend": "unsloth"})})
    assert plan.card_plan(unsloth, shape, CARD["t4"])["call_gb"] < on_t4["call_gb"]


def test_a_steps_hours_are_the_runs_over_its_steps_and_a_faster_card_takes_fewer():
    recipe = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    a100, h100 = (plan.card_plan(recipe, shape, CARD[key]) for key in ("a100-80gb", "h100-80gb-sxm"))
    for case, hours in a100["hours"].items():
        assert hours["run"] == pytest.approx(hours["step"] * recipe.grpo.steps)
        assert 0 < hours["update_share"] < 1 and h100["hours"][case]["run"] < hours["run"]
    assert a100["hours"]["whole budget"]["run"] > a100["hours"]["like the ground truth"]["run"]


def test_the_card_option_plans_a_gpu_recipe_on_a_machine_without_that_card():
    """On this machine `seal-lite recipe recipes/gpu-24gb.yaml` alone may refuse (no GPU here): with --card it plans
    for the card named, and the --set it prints makes the recipe fit."""
    runner = CliRunner()
    result = runner.invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "gpu-24gb on T4 (15 GB" in text and "does not fit in 90% of the card" in text
    fix = text.split("to fit: ")[1].split()[:2]
    assert fix[0] == "--set" and fix[1].startswith("rollout.generation_token_budget=")
    again = runner.invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4", *fix])
    assert "to fit" not in again.output and "fits in 90% of the card" in " ".join(again.output.split())
    assert "h a step" in text and "estimated" in text
    unknown = runner.invoke(main, ["recipe", "--card", "t4"])  # the default policy: a GGUF of no known shape
    assert unknown.exit_code == 2 and "--card: the shape of policy.model" in unknown.output
