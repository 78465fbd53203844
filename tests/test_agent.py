"""Token bookkeeping of multi-turn rollouts: the loss mask covers exactly the policy's own tokens."""

from conftest import ScriptedGenerator, tool_call_text

from seal_lite.agent import rollout_group
from seal_lite.envs.bfcl import load_tasks, official_verdict
from seal_lite.interface import TrainingInterface
from seal_lite.recipe import Recipe


def gt_scripts(task, wrong_episode: bool):
    """Per turn: one message with the turn's calls (correct or a wrong path), then a closing text message."""
    script = []
    for calls in task.ground_truth:
        if wrong_episode:
            calls = ["cd(folder='nowhere')"]
        script += [tool_call_text(calls) if calls else "Nothing to do.", "Done."]
    return script


def test_loss_mask_is_exactly_the_generated_tokens(smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(3)
    recipe = Recipe()
    # the python-call form of positional calls (see tool_call_text) needs the lenient parser
    rollout = recipe.rollout.model_copy(update={"max_calls_per_turn": 2, "max_model_calls": 20, "parser": "lenient"})
    generator = ScriptedGenerator(smol_tokenizer, [gt_scripts(task, False), gt_scripts(task, True)])
    trajectories = rollout_group(task, 2, generator, rollout, TrainingInterface(schema_cues=True))

    for trajectory, produced in zip(trajectories, generator.produced):
        ids, mask = trajectory.completion_ids, trajectory.env_mask
        assert len(ids) == len(mask)
        # the masked-in tokens, in order, are exactly what the policy produced, message by message
        spans, current = [], []
        for token, bit in zip(ids, mask):
            if bit:
                current.append(token)
            elif current:
                spans.append(current)
                current = []
        spans.append(current)
        assert spans == produced
        # and the prompt carries no loss at all: it is the rendered system + first user turn
        prompt = smol_tokenizer.decode(trajectory.prompt_ids)
        assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
        # environment text (tool results, later user turns) sits in the completion with mask 0
        env_text = smol_tokenizer.decode([t for t, bit in zip(ids, mask) if not bit])
        assert "<tool_response>" in env_text and task.user_message(1) in env_text
        assert trajectory.num_model_calls == 6 and len(trajectory.turns) == 3

    good, bad = trajectories
    assert official_verdict(task, good.steps_per_turn())["valid"] is True
    assert official_verdict(task, bad.steps_per_turn())["valid"] is False


def test_budget_and_context_limits_stop_an_episode(smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0]
    recipe = Recipe()
    rollout = recipe.rollout.model_copy(update={"max_calls_per_turn": 5, "max_model_calls": 3})
    generator = ScriptedGenerator(smol_tokenizer, [["<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call>"] * 3])
    (trajectory,) = rollout_group(task, 1, generator, rollout, TrainingInterface(schema_cues=True))
    assert trajectory.stop_reason == "call_budget" and trajectory.num_model_calls == 3

    rollout = recipe.rollout.model_copy(update={"max_context_tokens": 300})
    generator = ScriptedGenerator(smol_tokenizer, [["hello"]])
    (trajectory,) = rollout_group(task, 1, generator, rollout, TrainingInterface())
    assert trajectory.stop_reason == "context"
