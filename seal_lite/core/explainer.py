"""What the local diagnoser model is asked and what it may answer: pure functions, no model in sight.

For a failed turn the rule diagnoser has already given a label from executable evidence. The local model
(served by llama.cpp, seal_lite/engines/serving.py) adds an explanation and a recovery hint, and may refine the
label, under a JSON schema that constrains its generation:

    {"label": <failure label>, "cause": <cause or null>, "culprit_call_index": <int or null>,
     "explanation": <= 200 chars, "recovery_hint": <= 200 chars}

Its input is what the issue allows it to see: the user request, the visible tools, the model's calls with their
results, and the checker's evidence. Not the ground-truth calls. Output is validated again after generation
(grammars constrain the shape, not the meaning), and a hint may not carry a ground-truth argument value the
agent has not already seen: such values are redacted and counted.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from seal_lite.core.calls import parse_calls
from seal_lite.core.labels import BASE_UTILITY, CAUSES, EXCLUDED_LABELS, SUCCESS_LABELS

PROMPT_VERSION = 1  # part of the cache key: a new prompt must not reuse old answers
MAX_TEXT_CHARS = 200
REDACTED = "[...]"
# Labels the model may give: the failure labels a turn can have (never a success, never an excluded label).
FAILURE_LABELS = tuple(label for label in BASE_UTILITY if label not in SUCCESS_LABELS | EXCLUDED_LABELS)

DIAGNOSIS_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": list(FAILURE_LABELS)},
        "cause": {"anyOf": [{"type": "string", "enum": list(CAUSES)}, {"type": "null"}]},
        "culprit_call_index": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        "explanation": {"type": "string", "maxLength": MAX_TEXT_CHARS},
        "recovery_hint": {"type": "string", "maxLength": MAX_TEXT_CHARS},
    },
    "required": ["label", "cause", "culprit_call_index", "explanation", "recovery_hint"],
}

SYSTEM_PROMPT = (
    "You review one failed turn of a tool-using assistant. You see the tools it could use, the user's request, "
    "the calls it made with their results, and what the checker found. Reply with JSON only: label (the "
    "failure kind), cause, culprit_call_index (0-based index of the call that went wrong, or null), "
    "explanation (what went wrong, at most 200 characters) and recovery_hint (one general instruction that "
    "would avoid the failure next time, at most 200 characters; do not guess values the user did not give)."
)


@dataclass(frozen=True)
class FailedTurn:
    """Everything the diagnoser model may see about one failed turn, plus what the leak filter needs."""

    tools: str  # the visible tools: their names, and the signatures of those the model called
    user_text: str
    calls: tuple[tuple[str, str, str], ...]  # (call, status, result) in order
    rule_label: str
    rule_cause: str | None
    evidence: tuple[str, ...]  # state differences, missing results
    seen_text: str = field(default="", compare=False)  # everything the agent saw so far (for the leak filter)
    hidden_values: tuple[str, ...] = field(default=(), compare=False)  # ground-truth argument values, as text

    def key(self, model: str) -> str:
        """Content hash: the same failure, shown to the same model with the same prompt, is diagnosed once."""
        payload = json.dumps([PROMPT_VERSION, model, self.tools, self.user_text, self.calls, self.rule_label,
                              self.rule_cause, self.evidence], ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class ModelDiagnosis:
    label: str
    cause: str | None
    culprit_call_index: int | None
    explanation: str
    recovery_hint: str
    redactions: int = 0  # ground-truth values removed from the hint


def schema_for(turn: FailedTurn) -> dict:
    """DIAGNOSIS_SCHEMA with the culprit restricted to this turn's calls, so the grammar cannot point elsewhere."""
    culprit = [{"type": "null"}]
    if turn.calls:
        culprit.insert(0, {"type": "integer", "enum": list(range(len(turn.calls)))})
    return {**DIAGNOSIS_SCHEMA, "properties": {**DIAGNOSIS_SCHEMA["properties"], "culprit_call_index": {"anyOf": culprit}}}


def build_messages(turn: FailedTurn) -> list[dict]:
    """The chat sent to the diagnoser. Tools come first so consecutive turns of a task share a prompt prefix."""
    calls = "\n".join(f"{index}. {call} [{status}] -> {_clip(result, 300)}"
                      for index, (call, status, result) in enumerate(turn.calls)) or "(no tool call)"
    evidence = "\n".join(f"- {_clip(item, 300)}" for item in turn.evidence) or "- (none)"
    user = (
        f"Tools:\n{turn.tools}\n\nUser request:\n{_clip(turn.user_text, 800)}\n\nAssistant's calls:\n{calls}\n\n"
        f"Checker: {turn.rule_label} ({turn.rule_cause or 'no cause'})\n{evidence}"
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class InvalidDiagnosis(ValueError):
    """The model's answer does not fit the schema or the turn; the message says how."""


def parse_diagnosis(text: str, turn: FailedTurn) -> ModelDiagnosis:
    """Validate the model's JSON answer for this turn and redact leaked values from its hint."""
    try:
        payload = json.loads(text)
    except ValueError:
        raise InvalidDiagnosis(f"not JSON: {text[:80]!r}") from None
    if not isinstance(payload, dict):
        raise InvalidDiagnosis("not a JSON object")
    missing = [key for key in DIAGNOSIS_SCHEMA["required"] if key not in payload]
    if missing:
        raise InvalidDiagnosis(f"missing {', '.join(missing)}")
    label, cause, culprit = payload["label"], payload["cause"], payload["culprit_call_index"]
    if label not in FAILURE_LABELS:
        raise InvalidDiagnosis(f"label {label!r} is not a failure label")
    if cause is not None and cause not in CAUSES:
        raise InvalidDiagnosis(f"cause {cause!r} is not one of {', '.join(CAUSES)}")
    if culprit is not None and (not isinstance(culprit, int) or isinstance(culprit, bool)
                                or not 0 <= culprit < len(turn.calls)):
        raise InvalidDiagnosis(f"culprit_call_index {culprit!r} does not name one of the {len(turn.calls)} calls")
    texts = [payload["explanation"], payload["recovery_hint"]]
    if not all(isinstance(text, str) and text.strip() for text in texts):
        raise InvalidDiagnosis("explanation and recovery_hint must be non-empty strings")
    hint, redactions = redact_unseen_values(_clip(texts[1].strip(), MAX_TEXT_CHARS), turn.hidden_values, turn.seen_text)
    return ModelDiagnosis(label, cause, culprit, _clip(texts[0].strip(), MAX_TEXT_CHARS), hint, redactions)


def redact_unseen_values(text: str, values: tuple[str, ...], seen: str) -> tuple[str, int]:
    """Replace every value of ``values`` that occurs in ``text`` but not in ``seen`` (case-insensitive, as a
    whole word); return the new text and the number of replacements. Values shorter than 3 characters are
    ignored: they occur everywhere and identify nothing."""
    redactions = 0
    seen_lower = seen.lower()
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) < 3 or value.lower() in seen_lower:
            continue
        pattern = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)", re.IGNORECASE)
        text, count = pattern.subn(REDACTED, text)
        redactions += count
    return text, redactions


def argument_values(calls: list[str]) -> tuple[str, ...]:
    """The literal argument values of BFCL call strings, as text (lists and dicts flattened)."""
    values: list[str] = []

    def collect(value):
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)
        elif value is not None and not isinstance(value, bool):
            values.append(str(value))

    for call in parse_calls("[" + ", ".join(calls) + "]").calls if calls else []:
        collect(list(call.positional) + list(call.arguments.values()))
    return tuple(values)


def _clip(text: str, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
