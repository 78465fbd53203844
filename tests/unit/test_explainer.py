"""The diagnoser's contract without a model: prompt, cache key, validation, and the leak filter."""

import json

import pytest

from seal_lite.core.explainer import (
    DIAGNOSIS_SCHEMA,
    FAILURE_LABELS,
    REDACTED,
    FailedTurn,
    InvalidDiagnosis,
    argument_values,
    build_messages,
    parse_diagnosis,
    redact_unseen_values,
)

TURN = FailedTurn(
    tools="mkdir(dir_name: string): make a directory",
    user_text="Make a folder for the report in document.",
    calls=(("cd(folder='document')", "ok", '{"current_working_directory": "document"}'),
           ("mkdir(dir_name='tmp')", "ok", "None")),
    rule_label="state_mismatch",
    rule_cause="state_mismatch",
    evidence=("GorillaFileSystem state differs in root",),
    seen_text="Make a folder for the report in document. cd(folder='document') mkdir(dir_name='tmp')",
    hidden_values=("temp", "final_report.pdf", "document", "l"),
)


def answer(**fields):
    base = {"label": "state_mismatch", "cause": "state_mismatch", "culprit_call_index": 1,
            "explanation": "The folder got the wrong name.", "recovery_hint": "Use the folder name the user asked for."}
    return json.dumps(base | fields)


def test_prompt_shows_calls_results_and_evidence_but_no_ground_truth():
    system, user = build_messages(TURN)
    assert system["role"] == "system" and "JSON" in system["content"]
    text = user["content"]
    assert text.startswith("Tools:\nmkdir(") and "1. mkdir(dir_name='tmp') [ok] -> None" in text
    assert "GorillaFileSystem state differs in root" in text and "state_mismatch" in text
    assert "temp" not in text and "final_report.pdf" not in text


def test_key_is_a_content_hash():
    same = FailedTurn(**{**vars(TURN), "seen_text": "other", "hidden_values": ()})
    other_calls = FailedTurn(**{**vars(TURN), "calls": TURN.calls[:1]})
    assert TURN.key("m") == same.key("m") != other_calls.key("m")
    assert TURN.key("m") != TURN.key("another model")


def test_schema_offers_only_failure_labels():
    assert set(DIAGNOSIS_SCHEMA["properties"]["label"]["enum"]) == set(FAILURE_LABELS)
    assert "pass" not in FAILURE_LABELS and "gt_error" not in FAILURE_LABELS


def test_valid_answer_is_accepted():
    diagnosis = parse_diagnosis(answer(), TURN)
    assert (diagnosis.label, diagnosis.cause, diagnosis.culprit_call_index) == ("state_mismatch", "state_mismatch", 1)
    assert diagnosis.recovery_hint == "Use the folder name the user asked for." and diagnosis.redactions == 0


@pytest.mark.parametrize("text, reason", [
    ("{not json", "not JSON"),
    ("[1]", "not a JSON object"),
    (json.dumps({"label": "state_mismatch"}), "missing cause"),
    (answer(label="pass"), "not a failure label"),
    (answer(cause="bad_luck"), "is not one of"),
    (answer(culprit_call_index=2), "does not name one of the 2 calls"),
    (answer(culprit_call_index=True), "does not name one of"),
    (answer(explanation=""), "non-empty strings"),
    (answer(recovery_hint=7), "non-empty strings"),
])
def test_invalid_answers_are_rejected_with_a_reason(text, reason):
    with pytest.raises(InvalidDiagnosis, match=reason):
        parse_diagnosis(text, TURN)


def test_hints_lose_ground_truth_values_the_agent_has_not_seen():
    diagnosis = parse_diagnosis(answer(recovery_hint="Name it temp, then move Final_Report.pdf into document."), TURN)
    # 'temp' and 'final_report.pdf' were never shown; 'document' was; 'l' is too short to identify anything
    assert diagnosis.recovery_hint == f"Name it {REDACTED}, then move {REDACTED} into document."
    assert diagnosis.redactions == 2
    assert redact_unseen_values("temporary files", ("temp",), "") == ("temporary files", 0)  # whole words only
    long_hint = parse_diagnosis(answer(recovery_hint="x" * 500), TURN).recovery_hint
    assert len(long_hint) == 200


def test_argument_values_flatten_literals():
    values = argument_values(["mv(source='a.txt', destination='temp')", "wc(file_name='f', mode='l')",
                              "post_tweet(content='hi', tags=['#x', '#y'], mentions=[])", "ls(a=True)"])
    assert values == ("a.txt", "temp", "f", "l", "hi", "#x", "#y")
