"""The §3 rule table and the cause priority, on hand-made evidence."""

import pytest

from seal_lite.core.labels import label_turn, passes_checker
from seal_lite.core.types import TurnEvidence


def evidence(**fields):
    return TurnEvidence(**{"gt_calls": 2, "model_calls": 2, "decoded_calls": 2, **fields})


@pytest.mark.parametrize("fields, expected", [
    ({"gt_error": "boom", "gt_calls": 0, "state_match": False}, ("gt_error", None)),
    ({"gt_calls": 0, "model_calls": 1}, ("spurious_tool_call", None)),
    # only rejected attempts (unparseable, or a tool not shown): no call was made (docs/method.md §8)
    ({"gt_calls": 0, "model_calls": 2, "decoded_calls": 0, "unknown_tools": 2}, ("correct_abstention", None)),
    ({"model_calls": 1, "decoded_calls": 0, "unknown_tools": 1}, ("empty_turn_model_response", "invalid_tool_call")),
    ({"gt_calls": 0, "model_calls": 0, "decoded_calls": 0}, ("correct_abstention", None)),
    ({"decoded_calls": 0, "parse_errors": 2}, ("empty_turn_model_response", "invalid_tool_call")),
    ({"decoded_calls": 0, "model_calls": 0}, ("empty_turn_model_response", "missing_tool_call")),
    ({"instances_match": False, "checker_error": "x"}, ("instance_mismatch", "state_mismatch")),
    ({"checker_error": "x", "state_match": False}, ("checker_error", None)),
    ({"state_match": False, "response_match": False, "argument_errors": 1}, ("state_mismatch", "argument_mismatch")),
    ({"state_match": False, "unknown_tools": 1, "argument_errors": 1}, ("state_mismatch", "invalid_tool_call")),
    ({"response_match": False, "unrepaired_tool_error": True}, ("response_mismatch", "recovery_failure")),
    ({"state_match": False, "unknown_tools": 2, "decoded_calls": 1}, ("state_mismatch", "invalid_tool_call")),
    ({"response_match": False, "decoded_calls": 1}, ("response_mismatch", "missing_tool_call")),
    ({"response_match": False}, ("response_mismatch", "response_mismatch")),
    ({}, ("pass", None)),
])
def test_first_matching_rule_wins(fields, expected):
    assert label_turn(evidence(**fields)) == expected


@pytest.mark.parametrize("fields, passes", [
    ({"gt_calls": 0, "model_calls": 3, "decoded_calls": 3, "state_match": False}, True),  # not checked
    ({"decoded_calls": 0}, False),
    ({"state_match": False}, False),
    ({"response_match": False}, False),
    ({"checker_error": "x"}, False),
    ({"gt_error": "boom"}, True),  # the checker compares against whatever the ground truth did
    ({}, True),
])
def test_passes_checker_mirrors_the_official_turn_check(fields, passes):
    assert passes_checker(evidence(**fields)) is passes
