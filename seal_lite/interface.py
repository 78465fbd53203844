"""The agent's view of a task and the training-time interface Omega (SEAL_METHOD.md §4).

Three components, each switchable, each a pure function of what the agent can see (tool docs, the
observation, failure statistics), never of the ground truth:

* phi_schema (``apply_schema_cues``): " [required]" and " Allowed values: ..." in parameter descriptions, and
  one rule line in the system prompt.
* phi_err (``recovery_feedback``): after a call that failed, one hint chosen from the error text.
* phi_cap (``capability_guidelines``): a "Guidelines" block in the system prompt, one line per label that is
  frequent and costly in the failure statistics.

``TrainingInterface`` holds which components are on and the current guideline lines; ``render_view`` and
``observation`` apply it. ``evaluation_interface`` is the one function that builds what evaluation uses: the
plain BFCL view, whatever the training interface has become.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass

CALL_FORMAT = (
    "To call tools, reply with one or more lines of the form\n"
    '<tool_call>{"name": "tool_name", "arguments": {"argument": "value"}}</tool_call>\n'
    "After the tool results arrive you may call more tools. When the request is done, or no tool fits, "
    "answer in plain text without a tool call."
)
SCHEMA_CUE_LINE = (
    "Supply every [required] parameter exactly as the schema names it, use only the allowed values, "
    "and never invent a tool that is not in the list."
)


@dataclass(frozen=True)
class View:
    system_prompt: str
    tools: list[dict]


@dataclass(frozen=True)
class TrainingInterface:
    """Omega_t: the components in use and the texts they currently add."""

    schema_cues: bool = False  # phi_schema
    recovery_feedback: bool = False  # phi_err
    guidelines: tuple[str, ...] = ()  # phi_cap lines shown now
    tool_format: str = "signatures"

    @property
    def plain(self) -> bool:
        return not (self.schema_cues or self.recovery_feedback or self.guidelines)


def evaluation_interface(tool_format: str = "signatures") -> TrainingInterface:
    """What evaluation sees: the plain view. It takes no training state, so none can reach it."""
    return TrainingInterface(tool_format=tool_format)


def apply_schema_cues(functions: list[dict]) -> list[dict]:
    """phi_schema on a copy of the tool docs: ' [required]' and ' Allowed values: ...' in parameter descriptions."""
    cued = copy.deepcopy(functions)
    for doc in cued:
        parameters = doc.get("parameters", {})
        required = set(parameters.get("required", []))
        for name, spec in parameters.get("properties", {}).items():
            description = spec.get("description", "")
            if name in required:
                description += " [required]"
            if spec.get("enum"):
                description += " Allowed values: " + ", ".join(str(value) for value in spec["enum"]) + "."
            spec["description"] = description
    return cued


def render_tools(functions: list[dict], tool_format: str) -> str:
    if tool_format == "json":
        return "\n".join(json.dumps(doc, ensure_ascii=False) for doc in functions)
    return "\n".join(_signature(doc) for doc in functions)


def _signature(doc: dict) -> str:
    """One line per tool: name(param: type, ...): short description. About 6x fewer tokens than JSON."""
    parameters = doc.get("parameters", {})
    required = set(parameters.get("required", []))
    params = []
    for name, spec in parameters.get("properties", {}).items():
        text = f"{name}: {spec.get('type', 'any')}"
        if name not in required:
            text += " = optional"
        cues = [part for part in ("[required]", "Allowed values:") if part in spec.get("description", "")]
        if cues:  # keep the phi_schema cue visible in the short form too
            description = spec["description"]
            text += " " + description[description.index(cues[0]) :].strip()
        params.append(text)
    description = doc.get("description", "")
    description = description.split("Tool description:")[-1].strip().split(". ")[0].rstrip(".")
    return f"- {doc['name']}({', '.join(params)}): {description}"


def render_view(functions: list[dict], interface: TrainingInterface) -> View:
    """The system prompt and tool docs for one episode under ``interface``."""
    tools = apply_schema_cues(functions) if interface.schema_cues else copy.deepcopy(functions)
    lines = ["You are an agent that completes the user's requests by calling tools.", "Available tools:"]
    lines.append(render_tools(tools, interface.tool_format))
    lines.append(CALL_FORMAT)
    if interface.schema_cues:
        lines.append(SCHEMA_CUE_LINE)
    if interface.guidelines:
        lines.append("Guidelines:\n" + "\n".join(f"- {line}" for line in interface.guidelines))
    return View("\n".join(lines), tools)


def reveal_message(new_functions: list[dict], interface: TrainingInterface, user_text: str) -> str:
    """A user turn that also makes more tools visible (BFCL miss_func)."""
    tools = apply_schema_cues(new_functions) if interface.schema_cues else new_functions
    return f"New tools are now available:\n{render_tools(tools, interface.tool_format)}\n{user_text}"


def observation(results: list[tuple[str, str, str]], interface: TrainingInterface, visible: list[str]) -> str:
    """The tool message for one model step: ``call -> result`` per (call, status, result), and with phi_err
    on, one recovery hint after each call that failed."""
    lines = []
    for call, status, result in results:
        lines.append(f"{call} -> {result}")
        if interface.recovery_feedback and status != "ok":
            lines.append("Hint: " + recovery_feedback(status, result, visible))
    return "\n".join(lines)


# --- phi_err: recovery-oriented feedback ------------------------------------------------------------------

PARSE_HINT = ("Write each call as <tool_call>{{\"name\": \"tool_name\", \"arguments\": {{...}}}}</tool_call>. "
              "Available tools: {tools}. If no tool fits, answer in plain text.")
_ERROR_HINTS = [  # (pattern in the error text, hint): the first match wins
    (r"missing (?:a|\d+) required (?:positional )?argument: '?(\w+)", "Supply the required argument '{0}'."),
    (r"unexpected keyword argument '?(\w+)", "Drop the argument '{0}': this tool does not take it."),
    (r"no such file|not found|does not exist", "Inspect first (for example list what is there) to find the exact name."),
    (r"invalid character|'[^']*/[^']*'", "Go one step at a time: a name or path with several components is not accepted."),
    (r"not authenticated|log ?in|authenticate", "Log in first with the authentication tool, then try again."),
    (r"type|must be|invalid literal|not supported between|expected", "Re-check the argument types against the schema."),
]


def recovery_feedback(status: str, result: str, visible: list[str]) -> str:
    """phi_err: one hint for a failed call, chosen from the error text (SEAL_METHOD.md §4)."""
    tools = ", ".join(sorted(visible))
    if status == "parse_error":
        return PARSE_HINT.format(tools=tools)
    if status == "unknown_tool":
        return f"Use only the listed tools: {tools}."
    for pattern, hint in _ERROR_HINTS:
        match = re.search(pattern, result, re.IGNORECASE)
        if match:
            return hint.format(*match.groups(), tools=tools)
    return "Re-read the tool's schema and the error message, then correct the call."


# --- phi_cap: capability guidelines -----------------------------------------------------------------------

GUIDELINES = {  # one template line per failure label
    "spurious_tool_call": "If none of the tools can do what the user asks, say so in plain text instead of calling one.",
    "empty_turn_model_response": "When a request needs an action, call the tools; do not only describe what you would do.",
    "instance_mismatch": "Use the tools of the service the request is about.",
    "state_mismatch": "Check names and values against the request before acting; inspect the current state when unsure.",
    "response_mismatch": "Call the tools that show the user what they asked for, and report the results.",
}
MIN_COUNT, MIN_PREVALENCE, MAX_REWARD, MAX_LINES = 8, 0.10, 0.6, 3


def capability_guidelines(counts: dict[str, int], mean_rewards: dict[str, float],
                          hints: dict[str, str] | None = None) -> tuple[str, ...]:
    """phi_cap: the labels with count >= 8, at least 10% of failure labels and mean reward < 0.6, ranked by
    prevalence * (1 - mean reward), at most 3 lines. A line leaves once its label stops qualifying (its reward
    recovered). ``hints`` replaces a label's template with another text (the local diagnoser's hint)."""
    failures = {label: n for label, n in counts.items() if label in GUIDELINES and n > 0}
    total = sum(failures.values())
    ranked = []
    for label, n in failures.items():
        prevalence, reward = n / total, mean_rewards.get(label, 0.0)
        if n >= MIN_COUNT and prevalence >= MIN_PREVALENCE and reward < MAX_REWARD:
            ranked.append((prevalence * (1 - reward), label))
    chosen = [label for _, label in sorted(ranked, key=lambda item: (-item[0], item[1]))[:MAX_LINES]]
    return tuple((hints or {}).get(label) or GUIDELINES[label] for label in chosen)


def describe_version(row: dict) -> str:
    """A stored interface version as text, one component per line (what ``seal-lite interface`` shows and diffs)."""
    components = row["components"]
    lines = [f"phi_schema (schema cues): {'on' if components.get('schema_cues') else 'off'}"]
    if row.get("system_prompt_cues"):
        lines.append(f"  rule line: {row['system_prompt_cues']}")
    lines.append(f"phi_err (recovery feedback): {'on' if components.get('recovery_feedback') else 'off'}")
    lines.append(f"phi_cap (capability guidelines): {'on' if components.get('capability_hints') else 'off'}"
                 f", texts from {components.get('hints', 'template')}")
    lines += [f"  - {line}" for line in row.get("guidelines") or []] or ["  (no guideline)"]
    lines.append(f"tool format: {components.get('tool_format')}")
    return "\n".join(lines)


def diff_versions(first: dict, second: dict) -> str:
    """A unified diff of two stored interface versions as ``describe_version`` shows them ("" if equal)."""
    import difflib

    return "\n".join(difflib.unified_diff(describe_version(first).splitlines(), describe_version(second).splitlines(),
                                          f"version {first['version']}", f"version {second['version']}", lineterm=""))
