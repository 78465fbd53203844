"""`seal-lite run` holds the recipe against the GPU torch sees before it writes anything (preflight.check_fit): the
plan's figures (`seal-lite recipe RECIPE --card here`) with that GPU's total memory. The GPU is pretended here."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite import api
from seal_lite.cli import main
from seal_lite.core.errors import SealLiteError
from seal_lite.core.recipe import RecipeError, load_recipe
from seal_lite.runs import preflight

ROOT = Path(__file__).parents[2]
RECIPES = ROOT / "recipes"
RTX_4090, T4 = ("NVIDIA GeForce RTX 4090", 25_757_220_864), ("Tesla T4", 15_828_320_256)  # torch's total_memory


@pytest.fixture
def gpu(monkeypatch):
    """Pretend torch sees a GPU of this (name, total bytes)."""

    def pretend(card: tuple[str, int]) -> None:
        monkeypatch.setattr(preflight, "_cuda_available", lambda: True)
        monkeypatch.setattr(preflight, "_gpu_memory", lambda: card)

    return pretend


def test_the_paper_recipe_on_a_24_gb_card_is_refused_naming_the_budget_that_fits(gpu):
    gpu(RTX_4090)
    recipe = load_recipe(RECIPES / "paper-qwen2.5-7b.yaml")
    with pytest.raises(RecipeError) as refused:
        preflight.check_fit(recipe, "recipes/paper-qwen2.5-7b.yaml")
    message = str(refused.value)
    assert ("recipes/paper-qwen2.5-7b.yaml: rollout.generation_token_budget = 212992: its widest generate call, 13 "
            "rows of 16,384 tokens, needs 59.8 GB by the memory model, more than 90% of this GPU's 24.0 GB (NVIDIA "
            "GeForce RTX 4090); set it to 49152") in message
    assert "recipes/gpu-24gb.yaml" in message and "--no-fit-check" in message
    assert "update" not in message.splitlines()[0]  # its update fits: one line, the budget's
    preflight.check_fit(load_recipe(RECIPES / "paper-qwen2.5-7b.yaml", {"rollout.generation_token_budget": 49152}))


def test_the_gpu_recipes_start_on_the_cards_they_are_made_for(gpu):
    gpu(RTX_4090)
    preflight.check_fit(load_recipe(RECIPES / "gpu-24gb.yaml"))
    gpu(T4)
    preflight.check_fit(load_recipe(RECIPES / "colab-t4.yaml"))


def test_the_paged_pool_and_the_update_are_held_against_the_card_too(gpu):
    """colab-t4 with a context longer than the T4's pool (189,396 tokens there): neither the pool nor the update's
    estimate fits, and each says so on its own line."""
    gpu(T4)
    with pytest.raises(RecipeError) as refused:
        preflight.check_fit(load_recipe(RECIPES / "colab-t4.yaml", {"rollout.max_context_tokens": 190_000}))
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("default recipe: rollout.max_context_tokens = 190000: the paged engine's KV pool, "
                               "189,396 tokens in 90% of this GPU's 14.7 GB (Tesla T4), cannot hold one context")
    assert "the update's estimated peak on trajectories this long" in lines[1] and lines[1].endswith("lower it")


def test_without_a_gpu_or_a_known_shape_nothing_is_checked(gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(preflight, "_cuda_available", lambda: False)
    preflight.check_fit(load_recipe(RECIPES / "paper-qwen2.5-7b.yaml"))
    gpu(("a small GPU", 2**30))
    preflight.check_fit(load_recipe(RECIPES / "quickstart.yaml"))  # a GGUF policy: its shape is unknown here
    (tmp_path / "config.json").write_text("{}")  # a directory whose config names no decoder sizes
    preflight.check_fit(load_recipe(RECIPES / "paper-qwen2.5-7b.yaml", {"policy.model": str(tmp_path)}))


def test_seal_lite_run_refuses_before_writing_and_no_fit_check_starts_it_anyway(gpu, monkeypatch, tmp_path):
    gpu(RTX_4090)
    monkeypatch.setattr(preflight, "check", lambda recipe, source=None: None)  # the hub, GGUFs: not this test's

    def started(*args, **kwargs):
        raise SealLiteError("the run started")

    monkeypatch.setattr(api, "run", started)
    arguments = ["run", str(RECIPES / "paper-qwen2.5-7b.yaml"), "--out", str(tmp_path / "run")]
    refused = CliRunner().invoke(main, arguments)
    assert refused.exit_code == 2 and "nothing was written" in refused.output
    assert "rollout.generation_token_budget = 212992" in refused.output and not (tmp_path / "run").exists()
    forced = CliRunner().invoke(main, [*arguments, "--no-fit-check"])
    assert forced.exit_code == 1 and "the run started" in forced.output
