"""Token bookkeeping of multi-turn rollouts: the loss mask covers exactly the policy's own tokens."""

from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import Recipe
from seal_lite.envs.bfcl import load_tasks, official_verdict
from seal_lite.step.rollout import rollout_group, rollout_groups
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
