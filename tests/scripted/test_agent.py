"""Token bookkeeping of multi-turn rollouts: the loss mask covers exactly the policy's own tokens."""

from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import Recipe
from seal_lite.core.types import StopReason
from seal_lite.envs.bfcl import load_tasks, official_verdict
from seal_lite.step.rollout import TokenConversation, opening_messages, rollout_group, rollout_groups
from tests.helpers import ScriptedGenerator, tool_call_text


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
    rollout = recipe.rollout.model_copy(update={"max_calls_per_turn": 2, "max_model_calls": 20, "parser": "lenient",
                                                "max_context_tokens": 8192})  # BFCL's tool block: 3-5k tokens
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
    rollout = recipe.rollout.model_copy(update={"max_calls_per_turn": 5, "max_model_calls": 3,
                                                "max_context_tokens": 8192})  # BFCL's tool block: 3-5k tokens
    generator = ScriptedGenerator(smol_tokenizer, [["<tool_call>{\"name\": \"ls\", \"arguments\": {}}</tool_call>"] * 3])
    (trajectory,) = rollout_group(task, 1, generator, rollout, TrainingInterface(schema_cues=True))
    assert trajectory.stop_reason == "call_budget" and trajectory.num_model_calls == 3

    rollout = recipe.rollout.model_copy(update={"max_context_tokens": 300})
    generator = ScriptedGenerator(smol_tokenizer, [["hello"]])
    (trajectory,) = rollout_group(task, 1, generator, rollout, TrainingInterface())
    assert trajectory.stop_reason == "context"


class _TaskKeyedGenerator:
    """A policy that answers each sequence with its own task's ground-truth calls for the turn it is in (found in
    the sequence's text), recording the size of every batch it was given and which tasks each batch mixed."""

    def __init__(self, tokenizer, tasks):
        self.tokenizer, self.tasks = tokenizer, tasks
        self.batches: list[set[str]] = []
        self.batch_sizes: list[int] = []

    def generate(self, batch, max_new_tokens, temperature):
        out, seen = [], set()
        for ids in batch:
            text = self.tokenizer.decode(ids)
            task = next(t for t in self.tasks if t.user_message(0) in text)
            seen.add(task.id)
            answered = text.count("<|im_start|>assistant\n") - 1  # messages this sequence already holds
            turn = min(answered // 2, len(task.ground_truth) - 1)
            reply = tool_call_text(task.ground_truth[turn]) if answered % 2 == 0 else "Done."
            out.append(self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        self.batches.append(seen)
        self.batch_sizes.append(len(batch))
        return out


def test_a_step_is_one_batch_across_tasks_and_chunks_cap_it(smol_tokenizer):
    tasks = [task.truncated(1) for task in load_tasks(["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3"])]
    rollout = Recipe().rollout.model_copy(update={"max_calls_per_turn": 2, "max_model_calls": 4, "parser": "lenient",
                                                  "max_context_tokens": 8192})  # BFCL's tool block: 3-5k tokens
    pairs = [(task, TrainingInterface()) for task in tasks]

    mixing = _TaskKeyedGenerator(smol_tokenizer, tasks)
    groups = rollout_groups(pairs, 2, mixing, rollout)
    # two rounds (the calls, then "Done."), each one generation over all 3 tasks x G = 2 sequences
    assert mixing.batch_sizes == [6, 6] and all(len(seen) == 3 for seen in mixing.batches)
    assert [[t.task_id for t in group] for group in groups] == [[task.id] * 2 for task in tasks]
    for task, group in zip(tasks, groups):
        for trajectory in group:  # each sequence was answered for its own task: every verdict passes
            assert official_verdict(task, trajectory.steps_per_turn())["valid"] is True

    capped = _TaskKeyedGenerator(smol_tokenizer, tasks)
    chunked = rollout_groups(pairs, 2, capped, rollout.model_copy(update={"generation_batch_size": 4}))
    assert capped.batch_sizes == [4, 2, 4, 2]
    assert [[t.completion_ids for t in g] for g in chunked] == [[t.completion_ids for t in g] for g in groups]


def test_groups_that_on_group_adds_play_in_the_same_call(smol_tokenizer):
    """Dynamic sampling's extra groups: what ``on_group`` returns when a group ends plays in the same call (in
    rounds: from the next one on) and follows the given groups in the result; an added group whose prompt leaves no
    room for a message ends at once, and is reported in turn."""
    tasks = [task.truncated(1) for task in load_tasks(["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3"])]
    short, long = TrainingInterface(tool_format="signatures"), TrainingInterface(tool_format="official")
    rollout = Recipe().rollout.model_copy(update={"max_calls_per_turn": 2, "max_model_calls": 4, "parser": "lenient"})
    fits = len(TokenConversation(smol_tokenizer, opening_messages(tasks[1], short)).ids) + rollout.max_new_tokens
    assert len(TokenConversation(smol_tokenizer, opening_messages(tasks[2], long)).ids) > 2 * fits
    rollout = rollout.model_copy(update={"max_context_tokens": 2 * fits})

    generator = _TaskKeyedGenerator(smol_tokenizer, tasks)
    reported = []

    def on_group(group):
        reported.append(group[0].task_id)
        return [(tasks[1], short), (tasks[2], long)] if group[0].task_id == tasks[0].id else None

    groups = rollout_groups([(tasks[0], short)], 2, generator, rollout, on_group)
    assert [[t.task_id for t in group] for group in groups] == [[task.id] * 2 for task in tasks]
    assert reported == [tasks[0].id, tasks[2].id, tasks[1].id]  # the one that cannot start is over at once
    assert all(t.stop_reason == StopReason.CONTEXT and not t.completion_ids for t in groups[2])
    # base_0's two rounds (its calls, then "Done."), then base_2's: its group joined when base_0's ended
    assert generator.batch_sizes == [2, 2, 2, 2] and generator.batches == [
        {tasks[0].id}, {tasks[0].id}, {tasks[1].id}, {tasks[1].id}]
    assert all(official_verdict(tasks[1], t.steps_per_turn())["valid"] for t in groups[1])
