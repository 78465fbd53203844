"""rollout.budget on real BFCL episodes (a scripted policy playing a task's ground truth through the real tools, their
real results in the context): ``model_tokens`` ends an episode once the model has written max_response_tokens
tokens and trains on all of them; ``release`` lets the episode run to its calls or its context, as the SEAL release
does, and trains on the first max_response_tokens tokens after the prompt, environment tokens counted."""

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.core.types import StopReason
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from tests.helpers import ScriptedGenerator, tool_call_text

TASK_ID = "multi_turn_base_0"
CAP = 100  # tokens: more than the first message's (93 with SmolLM2's tokenizer), less than the first three


def ground_truth_script(task) -> list[str]:
    """Per turn: the turn's calls in one message, then a text answer that ends the turn."""
    return [text for calls in task.ground_truth for text in (tool_call_text(calls), "Done.")]


def play(tmp_path, tokenizer, budget: str):
    task = load_tasks([TASK_ID])[0].truncated(3)
    recipe = load_recipe(None, {
        "data.task_ids": [TASK_ID], "grpo.tasks_per_step": 1, "rollout.num_generations": 2,
        "rollout.max_turns": 3, "rollout.max_model_calls": 6, "rollout.max_calls_per_turn": 2,
        "rollout.parser": "lenient", "rollout.max_response_tokens": CAP, "rollout.budget": budget,
        "interface.tool_format": "signatures", "diagnoser.mode": "off"})
    generator = ScriptedGenerator(tokenizer, [ground_truth_script(task)] * 2)
    step = SealStep(recipe, Store(tmp_path / f"{budget}.db"), {task.id: task}, generator)
    return step([task.id]), step.store.trajectories(step=1), generator


def test_model_tokens_ends_the_episode_at_the_cap_and_trains_on_every_model_token(tmp_path, smol_tokenizer):
    batch, rows, generator = play(tmp_path, smol_tokenizer, "model_tokens")
    lengths = [len(ids) for ids in generator.produced[0]]
    assert len(lengths) == 3 and sum(lengths[:2]) < CAP <= sum(lengths)  # the cap falls in the third message
    for completion, mask, row in zip(batch.completion_ids, batch.env_mask, rows, strict=True):
        assert row["stop_reason"] == StopReason.RESPONSE_BUDGET and row["num_model_calls"] == 3
        assert sum(mask) == sum(lengths)  # every model token trains, the ones past the cap included
        assert len(completion) == len(mask) > sum(mask)  # the tool results and the next turn sit between them


def test_release_plays_the_whole_episode_and_trains_on_its_first_tokens(tmp_path, smol_tokenizer):
    batch, rows, generator = play(tmp_path, smol_tokenizer, "release")
    assert all(row["stop_reason"] == StopReason.DONE and row["num_model_calls"] == 6 for row in rows)
    assert batch.rewards == [1.0, 1.0]  # the whole ground truth was played and verified
    first = len(generator.produced[0][0])
    for completion, mask in zip(batch.completion_ids, batch.env_mask, strict=True):
        assert len(completion) == len(mask) == CAP  # the window counts the environment's tokens too
        assert sum(mask[:first]) == first and 0 < sum(mask) < CAP  # the first message, then the tool result


@pytest.mark.parametrize("budget, cap, trained", [("model_tokens", 4096, None), ("release", 4096, 4096),
                                                  ("release", None, None)])
def test_the_field_says_what_the_cap_bounds(budget, cap, trained):
    rollout = load_recipe(None, {"rollout.budget": budget, "rollout.max_response_tokens": cap}).rollout
    assert rollout.trained_tokens() == trained
    assert rollout.episode_token_cap() == (cap if budget == "model_tokens" else None)
