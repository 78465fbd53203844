"""Turn-level failure labels (docs/method.md §3): the taxonomy and the rule that picks one label per turn.

``label_turn`` is pure: it takes the executable evidence gathered for one ground-truth turn (by the BFCL
adapter) and returns ``(label, cause)``. The first matching rule of the §3 table wins. The cause records the
finer failure kind the paper names, in the paper's priority order.
"""

from __future__ import annotations

from seal_lite.core.types import TurnEvidence

# label -> base utility rho_z (None: excluded from weighting and statistics)
BASE_UTILITY: dict[str, float | None] = {
    "gt_error": None,
    "spurious_tool_call": 2.0,
    "correct_abstention": 1.8,
    "empty_turn_model_response": 1.5,
    "instance_mismatch": 0.6,
    "checker_error": None,
    "state_mismatch": 1.0,
    "response_mismatch": 0.9,
    "pass": 1.0,
}
EXCLUDED_LABELS = frozenset(label for label, utility in BASE_UTILITY.items() if utility is None)
SUCCESS_LABELS = frozenset({"pass", "correct_abstention"})
CAUSES = ("invalid_tool_call", "argument_mismatch", "state_mismatch", "recovery_failure", "missing_tool_call",
          "response_mismatch")  # the paper's priority order
# The official checker's error type for the first turn it fails, and the label seal-lite gives that turn.
OFFICIAL_ERROR_LABELS = {
    "multi_turn:empty_turn_model_response": "empty_turn_model_response",
    "multi_turn:instance_state_mismatch": "state_mismatch",
    "multi_turn:execution_response_mismatch": "response_mismatch",
    "checker_error": "checker_error",
}

def label_turn(evidence: TurnEvidence) -> tuple[str, str | None]:
    """Return (label, cause) for one ground-truth turn; cause is None for success labels."""
    e = evidence
    if e.gt_error:
        label = "gt_error"
    elif e.gt_calls == 0:
        # rejected attempts are no calls (docs/method.md §8): only accepted ones make a turn spurious
        label = "spurious_tool_call" if e.decoded_calls > 0 else "correct_abstention"
    elif e.decoded_calls == 0:
        label = "empty_turn_model_response"
    elif not e.instances_match:
        label = "instance_mismatch"
    elif e.checker_error:
        label = "checker_error"
    elif not e.state_match:
        label = "state_mismatch"
    elif not e.response_match:
        label = "response_mismatch"
    else:
        label = "pass"
    if label in SUCCESS_LABELS or label in EXCLUDED_LABELS:
        return label, None
    return label, failure_cause(e, label)


def passes_checker(e: TurnEvidence) -> bool:
    """The official checker's per-turn test: a turn with ground truth needs a non-empty response, equal
    instance state and every ground-truth result among the model's results so far. Turns whose ground truth
    is empty are not checked (the irrelevance check is separate). The verdict is: every turn passes. A call to
    a function the task does not have makes the response non-empty here, though not for ``label_turn``."""
    if e.gt_calls == 0:
        return True
    responded = e.decoded_calls + e.failed_unknown_calls > 0
    return responded and e.instances_match and not e.checker_error and e.state_match and e.response_match


def failure_cause(e: TurnEvidence, label: str) -> str | None:
    """The finer failure kind behind a failure label, first match in the paper's priority order:
    invalid_tool_call > argument_mismatch > state_mismatch > recovery_failure > missing_tool_call >
    response_mismatch."""
    if e.parse_errors or e.unknown_tools:
        return "invalid_tool_call"
    if e.argument_errors:
        return "argument_mismatch"
    if label in ("state_mismatch", "instance_mismatch"):
        return "state_mismatch"
    if e.unrepaired_tool_error:
        return "recovery_failure"
    if label == "spurious_tool_call":
        return None  # the call itself is the failure; none of the paper's kinds fits better
    if label == "empty_turn_model_response" or e.decoded_calls < e.gt_calls:
        return "missing_tool_call"
    return "response_mismatch"
