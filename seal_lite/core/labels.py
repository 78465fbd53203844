"""Turn-level failure labels (docs/method.md §3): the taxonomy and the rule that picks one label per turn.

``label_turn`` is pure: it takes the executable evidence gathered for one ground-truth turn (by the BFCL
adapter) and returns ``(label, cause)``. The first matching rule of the §3 table wins. The cause records the
finer failure kind the paper names, in the paper's priority order.
"""

from __future__ import annotations

from seal_lite.core.types import Label, TurnEvidence

# label -> base utility rho_z (None: excluded from weighting and statistics)
BASE_UTILITY: dict[Label, float | None] = {
    Label.GT_ERROR: None,
    Label.SPURIOUS_TOOL_CALL: 2.0,
    Label.CORRECT_ABSTENTION: 1.8,
    Label.EMPTY_TURN_MODEL_RESPONSE: 1.5,
    Label.INSTANCE_MISMATCH: 0.6,
    Label.CHECKER_ERROR: None,
    Label.STATE_MISMATCH: 1.0,
    Label.RESPONSE_MISMATCH: 0.9,
    Label.PASS: 1.0,
}
EXCLUDED_LABELS = frozenset(label for label, utility in BASE_UTILITY.items() if utility is None)
SUCCESS_LABELS = frozenset({Label.PASS, Label.CORRECT_ABSTENTION})
CAUSES = ("invalid_tool_call", "argument_mismatch", "state_mismatch", "recovery_failure", "missing_tool_call",
          "response_mismatch")  # the paper's priority order
# The official checker's error type for the first turn it fails, and the label seal-lite gives that turn.
OFFICIAL_ERROR_LABELS = {
    "multi_turn:empty_turn_model_response": Label.EMPTY_TURN_MODEL_RESPONSE,
    "multi_turn:instance_state_mismatch": Label.STATE_MISMATCH,
    "multi_turn:execution_response_mismatch": Label.RESPONSE_MISMATCH,
    "checker_error": Label.CHECKER_ERROR,
}

def label_turn(evidence: TurnEvidence) -> tuple[Label, str | None]:
    """Return (label, cause) for one ground-truth turn; cause is None for success labels."""
    e = evidence
    if e.gt_error:
        label = Label.GT_ERROR
    elif e.gt_calls == 0:
        # rejected attempts are no calls (docs/method.md §8): only accepted ones make a turn spurious
        label = Label.SPURIOUS_TOOL_CALL if e.decoded_calls > 0 else Label.CORRECT_ABSTENTION
    elif e.decoded_calls == 0:
        label = Label.EMPTY_TURN_MODEL_RESPONSE
    elif not e.instances_match:
        label = Label.INSTANCE_MISMATCH
    elif e.checker_error:
        label = Label.CHECKER_ERROR
    elif not e.state_match:
        label = Label.STATE_MISMATCH
    elif not e.response_match:
        label = Label.RESPONSE_MISMATCH
    else:
        label = Label.PASS
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
    if label in (Label.STATE_MISMATCH, Label.INSTANCE_MISMATCH):
        return "state_mismatch"
    if e.unrepaired_tool_error:
        return "recovery_failure"
    if label == Label.SPURIOUS_TOOL_CALL:
        return None  # the call itself is the failure; none of the paper's kinds fits better
    if label == Label.EMPTY_TURN_MODEL_RESPONSE or e.decoded_calls < e.gt_calls:
        return "missing_tool_call"
    return "response_mismatch"
