"""The real BFCL environment and official checker: ground-truth replay, corrupted calls, labels."""

from pathlib import Path

import pytest

from seal_lite.diagnosis.labels import label_turn
from seal_lite.envs.bfcl import Environment, TurnRecord, load_tasks, official_verdict, turn_evidence

DATA = Path(__file__).parent.parent / "data"
ALL_IDS = DATA.joinpath("train_ids.txt").read_text().split() + DATA.joinpath("eval_ids.txt").read_text().split()
# In this entry the ground truth calls `tail` at turn 1, but BFCL reveals `tail` only at turn 3: replaying it
# through an environment that enforces visibility (as SEAL_METHOD.md §6 requires) must reject that call.
GT_USES_HIDDEN_TOOL = {"multi_turn_miss_func_49"}


def replay(task, turn_texts):
    """Feed one model message per turn through the environment; return the turn records."""
    env = Environment(task)
    turns = []
    for index, text in enumerate(turn_texts):
        record = TurnRecord(task.user_message(index))
        if text:
            record.outcomes_per_step.append(env.run(text, index))
        turns.append(record)
    return turns


def labels_of(task, turns):
    return [label_turn(evidence) for evidence in turn_evidence(task, turns)]


def gt_texts(task):
    return ["[" + ", ".join(calls) + "]" if calls else "" for calls in task.ground_truth]


def test_split_files_are_the_paper_split():
    train = DATA.joinpath("train_ids.txt").read_text().split()
    evaluation = DATA.joinpath("eval_ids.txt").read_text().split()
    assert len(train) == len(evaluation) == 400 and not set(train) & set(evaluation)
    assert "multi_turn_base_0" in train and "multi_turn_base_1" in evaluation


def test_ground_truth_replay_passes_the_official_verdict_on_all_800():
    failures = []
    for task in load_tasks(ALL_IDS):
        turns = replay(task, gt_texts(task))
        verdict = official_verdict(task, [t.executed_steps() for t in turns])
        labels = {label for label, _ in labels_of(task, turns)}
        if not verdict["valid"] or not labels <= {"pass", "correct_abstention"}:
            failures.append(task.id)
    assert set(failures) == GT_USES_HIDDEN_TOOL


def test_miss_func_tools_are_hidden_until_revealed():
    task = load_tasks(["multi_turn_miss_func_0"])[0]
    hidden = [doc["name"] for doc in task.revealed[3]]
    assert hidden == ["sort"]
    env = Environment(task)
    before = env.run("[sort(file_name='final_report.pdf')]", 2)[0]
    assert before.status == "unknown_tool" and not before.executed
    assert env.run("[sort(file_name='final_report.pdf')]", 3)[0].status in ("ok", "tool_error")


@pytest.mark.parametrize(
    "corrupt, expected",
    [
        # wrong argument value: the directory gets another name -> state differs
        (lambda t: [t[0].replace("dir_name='temp'", "dir_name='tmp'")] + t[1:], ("state_mismatch", "state_mismatch")),
        # the model answers in text instead of calling tools
        (lambda t: ["I moved the file for you."] + t[1:], ("empty_turn_model_response", "missing_tool_call")),
        # a tool that does not exist: nothing executes
        (lambda t: ['<tool_call>{"name": "move_file", "arguments": {}}</tool_call>'] + t[1:],
         ("empty_turn_model_response", "invalid_tool_call")),
        # an argument the tool does not take
        (lambda t: [t[0].replace("mkdir(dir_name='temp')", "mkdir(dir_name='temp', mode=7)")] + t[1:],
         ("state_mismatch", "argument_mismatch")),
    ],
)
def test_corrupted_first_turn_gets_the_expected_label(corrupt, expected):
    task = load_tasks(["multi_turn_base_0"])[0]
    turns = replay(task, corrupt(gt_texts(task)))
    assert official_verdict(task, [t.executed_steps() for t in turns])["valid"] is False
    assert labels_of(task, turns)[0] == expected


def test_dropped_result_is_a_response_mismatch():
    task = load_tasks(["multi_turn_base_0"])[0]
    texts = gt_texts(task)
    # turn 1 must show grep's result; doing only the cd keeps the state right but loses the response
    texts[1] = "[cd(folder='temp')]"
    turns = replay(task, texts)
    assert labels_of(task, turns)[1] == ("response_mismatch", "missing_tool_call")
    assert official_verdict(task, [t.executed_steps() for t in turns])["valid"] is False


def test_abstention_labels():
    task = load_tasks(["multi_turn_miss_func_0"])[0]
    assert task.ground_truth[2] == []
    texts = gt_texts(task)
    assert labels_of(task, replay(task, texts))[2] == ("correct_abstention", None)
    texts[2] = "[ls()]"
    assert labels_of(task, replay(task, texts))[2][0] == "spurious_tool_call"
