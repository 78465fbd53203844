"""Every §3 label and every cause, each produced by replaying calls on a real BFCL entry.

Turn 0 of multi_turn_base_0 expects cd(document), mkdir(temp), mv(final_report.pdf -> temp); turn 1 expects
cd(temp) and a grep whose result the user must see; multi_turn_miss_func_0 has a turn (2) whose ground truth
is empty because the needed tool is missing.
"""

import dataclasses

import pytest

from seal_lite.core.labels import BASE_UTILITY, CAUSES, EXCLUDED_LABELS, label_turn
from seal_lite.core.types import TurnEvidence
from seal_lite.envs import bfcl
from seal_lite.envs.bfcl import load_tasks
from seal_lite.envs.registry import replay_calls
from seal_lite.step.verifier import diagnose_episode

GREP = "grep(file_name='final_report.pdf', pattern='budget analysis')"


def diagnose(task_id, edits, task_edit=None):
    """Replay the ground truth with some turns replaced (turn index -> list of call strings)."""
    task = load_tasks([task_id])[0]
    if task_edit:
        task = task_edit(task)
    turns = [edits.get(index, calls) for index, calls in enumerate(task.ground_truth)]
    return diagnose_episode(task, replay_calls(task, [[calls] if calls else [] for calls in turns]))


# (label, cause) of the edited turn, the entry, the turn, the calls the "model" sent instead of the ground truth
CASES = [
    ("pass", None, "multi_turn_base_0", 1, ["cd(folder='temp')", GREP]),
    ("correct_abstention", None, "multi_turn_miss_func_0", 2, []),
    ("spurious_tool_call", None, "multi_turn_miss_func_0", 2, ["ls()"]),
    ("empty_turn_model_response", "missing_tool_call", "multi_turn_base_0", 0, ["I moved the file for you."]),
    ("empty_turn_model_response", "invalid_tool_call", "multi_turn_base_0", 0, ['[mkdir(dir_name="temp"']),
    ("state_mismatch", "state_mismatch", "multi_turn_base_0", 0,
     ["cd(folder='document')", "mkdir(dir_name='tmp')", "mv(source='final_report.pdf', destination='tmp')"]),
    ("state_mismatch", "invalid_tool_call", "multi_turn_base_0", 0,
     ["cd(folder='document')", "move_file(source='final_report.pdf')"]),
    ("state_mismatch", "argument_mismatch", "multi_turn_base_0", 0,
     ["cd(folder='document')", "mkdir(dir_name='temp', mode=7)", "mv(source='final_report.pdf', destination='temp')"]),
    ("response_mismatch", "missing_tool_call", "multi_turn_base_0", 1, ["cd(folder='temp')"]),
    ("response_mismatch", "recovery_failure", "multi_turn_base_0", 1,
     ["cd(folder='temp')", "grep(file_name='nonexistent.pdf', pattern='budget analysis')"]),
    ("response_mismatch", "response_mismatch", "multi_turn_base_0", 1,
     ["cd(folder='temp')", "grep(file_name='final_report.pdf', pattern='zzz')"]),
]


@pytest.mark.parametrize("label, cause, task_id, turn, calls", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_label_and_cause_from_a_real_entry(label, cause, task_id, turn, calls):
    diagnosis = diagnose(task_id, {turn: calls})
    assert (diagnosis.labels[turn], diagnosis.causes[turn]) == (label, cause)
    # the turns before replay the ground truth and pass; the verdict fails exactly when this turn's check
    # fails (an abstention turn is never part of the verdict, and later turns inherit a wrong state)
    assert all(lab in ("pass", "correct_abstention") for lab in diagnosis.labels[:turn])
    assert diagnosis.valid is (label in ("pass", "correct_abstention", "spurious_tool_call"))
    assert diagnosis.irrelevance_valid is (label != "spurious_tool_call")


def test_gt_error_when_the_ground_truth_itself_fails():
    def broken_ground_truth(task):
        ground_truth = [list(turn) for turn in task.ground_truth]
        ground_truth[0][1] = "mkdir(dir_name='temp', bogus=1)"  # raises TypeError in the real tool
        return dataclasses.replace(task, ground_truth=ground_truth)

    diagnosis = diagnose("multi_turn_base_0", {}, broken_ground_truth)
    assert diagnosis.labels[0] == "gt_error" and diagnosis.causes[0] is None
    assert "bogus" in diagnosis.turns[0].evidence.gt_error and "gt_error" in EXCLUDED_LABELS


def test_checker_error_when_the_checker_raises(monkeypatch):
    def fail(*args):
        raise RuntimeError("state comparison failed")

    monkeypatch.setattr(bfcl.checker, "_compare_instances", fail)  # a fault inside bfcl-eval's checker
    diagnosis = diagnose("multi_turn_base_0", {})
    assert set(diagnosis.labels) == {"checker_error"} and diagnosis.valid is False
    assert diagnosis.error_type == "checker_error"  # never read as a pass
    assert "state comparison failed" in diagnosis.turns[0].evidence.checker_error


def test_instance_mismatch_when_the_instantiated_classes_differ():
    # BFCL's executor instantiates every involved class for model and ground truth alike, so an episode
    # cannot reach this rule; the comparison still labels it from real instances.
    task = load_tasks(["multi_turn_base_0"])[0]
    instances = bfcl.episode(task).instances
    evidence = TurnEvidence(gt_calls=1, model_calls=1, decoded_calls=1)
    model_only = {name: instance for name, instance in instances.items() if name != "TwitterAPI"}
    bfcl._compare(evidence, model_only, instances, [], [])
    assert label_turn(evidence) == ("instance_mismatch", "state_mismatch")


def test_every_label_and_cause_is_covered():
    covered_labels = {case[0] for case in CASES} | {"gt_error", "checker_error", "instance_mismatch"}
    covered_causes = {case[1] for case in CASES} - {None}
    assert covered_labels == set(BASE_UTILITY)
    assert covered_causes == set(CAUSES)
