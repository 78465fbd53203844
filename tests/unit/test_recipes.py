"""The shipped recipes (recipes/*.yaml): each validates, the quickstart file is the embedded default, the paper
recipe says what the paper did, and each ablation is the paper recipe minus its part; the third backbone's recipe
is the paper recipe in its format, and its ablations (command lines in docs/recipes.md) minus the same parts."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from seal_lite.core.recipe import Recipe, load_recipe

ROOT = Path(__file__).parents[2]


def test_quickstart_file_equals_the_embedded_default():
    assert load_recipe(ROOT / "recipes" / "quickstart.yaml") == Recipe()
    written = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    assert written == Recipe().model_dump()  # it restates every default, so users see every knob


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_recipe_validates(path):
    assert load_recipe(path).name == path.stem


def test_the_paper_recipe_says_what_the_paper_did():
    """docs/method.md §2 and §8; what still differs is docs/deviations.md's (LoRA, its learning rate, 4-bit)."""
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
    # the release's budget: up to 4096 tokens a message, the episode to the context's end or 20 calls, the update
    # on the first 4096 tokens after the prompt
    assert (rollout.max_new_tokens, rollout.budget, rollout.trained_tokens()) == (4096, "release", 4096)
    rows = (ROOT / "docs" / "deviations.md").read_text()
    for deviation in ("LoRA adapter", "2e-5", "4-bit NF4"):
        assert deviation in rows


def test_each_ablation_is_the_paper_recipe_minus_its_part():
    from seal_lite.runs.run_dir import recipe_differences

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


def test_the_toolace_recipe_is_the_paper_recipe_in_the_third_backbones_format():
    """The release ships no config for ToolACE-2-Llama-3.1-8B: its recipe is the Qwen paper recipe with the model, the
    ToolACE format and a generate budget that fits the 8B on the same card."""
    from seal_lite.core.memory import GIB, KNOWN_SHAPES, rollout_token_budget
    from seal_lite.runs.run_dir import recipe_differences

    paper = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    toolace = load_recipe(ROOT / "recipes" / "paper-toolace-llama3.1-8b.yaml")
    assert sorted(recipe_differences(paper.model_dump(), toolace.model_dump())) == [
        "name", "policy.model", "rollout.generation_token_budget", "rollout.parser"]
    assert (toolace.policy.model, toolace.rollout.parser) == ("Team-ACE/ToolACE-2-Llama-3.1-8B", "toolace")
    rollout = toolace.rollout
    shape = KNOWN_SHAPES[toolace.policy.model]  # the plan knows its shape without the hub
    # bf16 weights through peft, the tightest of the engines, as the Qwen recipe's 13 rows are
    fits = rollout_token_budget(shape, 80 * GIB, rollout.max_context_tokens, rollout.max_new_tokens, 2, "peft",
                                quantized=False, lora_rank=toolace.policy.lora_r)
    assert rollout.generation_token_budget == fits == 11 * rollout.max_context_tokens


def toolace_ablations() -> dict[str, str]:
    """docs/recipes.md's ToolACE ablations: the Qwen ablation's file -> the `seal-lite run` line that is its
    equivalent for the third backbone."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    rows = re.findall(r"\| `(ablation-[\w-]+\.yaml)` \| `(seal-lite run recipes/paper-toolace-llama3\.1-8b\.yaml[^`]*)`",
                      text)
    return dict(rows)


def test_each_toolace_ablation_line_changes_what_the_qwen_ablation_changes():
    """The ablations of the third backbone are its recipe with --set, as docs/recipes.md writes them: each line changes
    exactly the fields its Qwen ablation file changes (its name aside)."""
    from seal_lite.api import parse_overrides
    from seal_lite.runs.run_dir import recipe_differences

    lines = toolace_ablations()
    assert sorted(lines) == sorted(path.name for path in (ROOT / "recipes").glob("ablation-*.yaml"))
    paper = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml").model_dump()
    toolace = load_recipe(ROOT / "recipes" / "paper-toolace-llama3.1-8b.yaml").model_dump()
    for name, line in lines.items():
        words = shlex.split(line)
        overrides = parse_overrides(words[index + 1] for index, word in enumerate(words) if word == "--set")
        ablated = load_recipe(ROOT / words[2], overrides)
        qwen = load_recipe(ROOT / "recipes" / name).model_dump()
        assert ablated.name == "toolace-" + name.removesuffix(".yaml")
        assert recipe_differences(toolace, ablated.model_dump()) == recipe_differences(paper, qwen), name
