"""The agent's view of a task and the training-time interface Omega (docs/method.md §4 and §8).

The plain view is the official BFCL surface of the SEAL release (``bfcl_qwen_fc``, docs/method.md §8): the
system message is the tool block Qwen2.5's chat template writes for ``tools=`` (every tool's BFCL doc as JSON
inside <tools></tools>, then the <tool_call> format), tool results come back as <tool_response> blocks in a
user message, and a rejected message is answered with the service's "[ERROR] Invalid tool call format: ...".
A ToolACE or Llama-3.1 run (``call_format`` toolace or llama3.1) sees the release's prompt and results for that
format instead (seal_lite/core/llama_formats.py), with the same components on top.

Three training-only components sit on top of it, each switchable, each a pure function of what the agent can
see (tool docs, the observation, failure statistics), never of the ground truth:

* phi_schema (``apply_schema_cues``): "[required]" and "Allowed values: ..." in the JSON docs' parameter
  descriptions, and one rule line appended to the system message.
* phi_err (``recovery_feedback``): after a failed call, one hint chosen from the error text.
* phi_cap (``capability_guidelines``): a guidelines block appended to the system message, one line per label
  that is frequent and costly in the failure statistics.

With all three off, training sees exactly the evaluation view. ``TrainingInterface`` holds which components are
on and the current guideline lines; ``render_view`` and ``observation`` apply it. ``evaluation_interface`` is the
one function that builds what evaluation uses: the plain view, whatever the training interface has become.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, replace
from typing import Protocol

from seal_lite.core.calls import QWEN
from seal_lite.core.errors import ConfigError
from seal_lite.core.explainer import argument_values, redact_unseen_values
from seal_lite.core.llama_formats import (
    LLAMA31,
    LLAMA31_SYSTEM_PROMPT,
    RESULT_ROLE,
    TOOLACE,
    llama31_first_message,
    llama31_tool_prompt,
    result_text,
    toolace_system_prompt,
)
from seal_lite.core.types import REJECTED, CallStatus, Label

# The tool block, byte for byte as the SEAL release's tools_schema_to_qwen_prompt("bfcl_qwen_fc") writes it.
TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
NOT_BFCL_VIEW = "not the BFCL view"  # the mark on every evaluation result under the signatures view
SCHEMA_CUE_LINE = ("Observation note: parameters marked [required] must be provided exactly when calling a tool; "
                   "do not invent tools outside the current schema.")  # the release's observation_lite text
GUIDELINES_HEADER = "# Behavioral guidelines (env-evolved from recent failures):"


@dataclass(frozen=True)
class View:
    system_prompt: str
    tools: list[dict]
    tool_prompt: str = ""  # llama3.1: the tools and the interface's lines, before the first user question

    def first_user_message(self, question: str) -> str:
        """The first user message: the question, after the tool prompt in the formats that put one there."""
        return llama31_first_message(self.tool_prompt, question) if self.tool_prompt else question


@dataclass(frozen=True)
class TrainingInterface:
    """Omega_t: the components in use and the texts they currently add."""

    schema_cues: bool = False  # phi_schema
    recovery_feedback: bool = False  # phi_err
    guidelines: tuple[str, ...] = ()  # phi_cap lines shown now
    tool_format: str = "official"
    call_format: str = QWEN  # whose prompt, call syntax and results: qwen, toolace or llama3.1 (rollout.parser's)

    def __post_init__(self):
        if self.tool_format != "official" and self.call_format != QWEN:
            raise ConfigError(f"tool format {self.tool_format} is a form of Qwen's tool block: the {self.call_format} "
                              "format shows every tool in its own prompt; use the official tool format")

    @property
    def plain(self) -> bool:
        return not (self.schema_cues or self.recovery_feedback or self.guidelines)


def evaluation_interface(tool_format: str = "official", call_format: str = QWEN) -> TrainingInterface:
    """What evaluation sees: the plain view. It takes no training state, so none can reach it."""
    return TrainingInterface(tool_format=tool_format, call_format=call_format)


def apply_schema_cues(functions: list[dict]) -> list[dict]:
    """phi_schema on a copy of the tool docs: "[required]" and "Allowed values: ..." after parameter
    descriptions, worded and joined as the release's observation_lite does."""
    cued = copy.deepcopy(functions)
    for doc in cued:
        parameters = doc.get("parameters", {})
        required = set(parameters.get("required", []))
        for name, spec in parameters.get("properties", {}).items():
            additions = ["[required]"] if name in required else []
            if spec.get("enum"):
                additions.append("Allowed values: " + ", ".join(str(value) for value in spec["enum"]))
            if additions:
                spec["description"] = f"{spec.get('description', '')} {' '.join(additions)}".strip()
    return cued


def render_tools(functions: list[dict], tool_format: str) -> str:
    """The tool lines inside <tools></tools>: each BFCL doc as ``json.dumps`` writes it (official), or one short
    signature per tool (the opt-in ``signatures`` format: about 6x fewer tokens, no descriptions or enums)."""
    if tool_format == "official":
        return "\n".join(json.dumps(doc) for doc in functions)
    return "\n".join(_signature(doc) for doc in functions)


def tool_block(functions: list[dict], tool_format: str = "official") -> str:
    """The system message of the official surface: the tool block alone."""
    return "\n".join([TOOLS_HEADER, render_tools(functions, tool_format), TOOLS_FOOTER])


def revealed_tools_text(functions: list[dict], tool_format: str) -> str:
    """The docs a miss_func turn reveals, as they go into bfcl-eval's additional-function prompt."""
    if tool_format == "official":
        return json.dumps(functions, ensure_ascii=False)  # as the release writes them there
    return render_tools(functions, tool_format)


def _signature(doc: dict) -> str:
    """One line per tool: name(param: type, ...): short description."""
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
    """The system message and tool docs for one episode under ``interface``: the tool block, then what the
    training interface adds, each part after an empty line (as the release appends its extra instructions). In
    the llama3.1 format the system message is fixed and all of that goes before the first question, as the
    release's get_init_state puts it."""
    tools = apply_schema_cues(functions) if interface.schema_cues else copy.deepcopy(functions)
    extras = [SCHEMA_CUE_LINE] if interface.schema_cues else []
    if interface.guidelines:
        extras.append(GUIDELINES_HEADER + "\n" + "\n".join(f"- {line}" for line in interface.guidelines))
    if interface.call_format == LLAMA31:
        return View(LLAMA31_SYSTEM_PROMPT, tools, llama31_tool_prompt(tools, extras))
    prompt = toolace_system_prompt(tools) if interface.call_format == TOOLACE else tool_block(tools, interface.tool_format)
    return View("\n\n".join([prompt, *extras]), tools)


def observation(results: list[tuple[str, str]], interface: TrainingInterface, visible: list[str]) -> str:
    """The environment's reply to one model message from its calls' (status, result): each executed call's
    result as a <tool_response> block (in the Llama-family formats as that format writes a result), a rejected
    call's [ERROR] line once, joined by newlines; with phi_err on, one hint after each failure."""
    parts, seen = [], set()
    for status, result in results:
        if status in REJECTED:
            if result in seen:  # a message the strict parser rejects whole carries one error line
                continue
            seen.add(result)
            text = result
        elif interface.call_format == QWEN:
            text = f"<tool_response>\n{result}\n</tool_response>"
        else:
            text = result_text(result, interface.call_format)
        if interface.recovery_feedback and status not in ("ok", "rejected"):
            text += "\nHint: " + recovery_feedback(status, result, visible, interface.call_format)
        parts.append(text)
    return "\n".join(parts)


def observation_role(statuses: list[str], interface: TrainingInterface) -> str:
    """Who sends the reply: ``ipython`` for executed calls' results in the Llama-family formats (Llama 3.1's tool
    role, as the release's result modes send them), ``user`` for Qwen's results and for every rejection."""
    executed = not any(status in REJECTED for status in statuses)
    return RESULT_ROLE if executed and interface.call_format != QWEN else "user"


# --- phi_err: recovery-oriented feedback ------------------------------------------------------------------

PARSE_HINTS = {  # per call format, after the release's _enrich_parse_error hints
    QWEN: "Write each call as <tool_call>{{\"name\": \"tool_name\", \"arguments\": {{...}}}}</tool_call>. ",
    TOOLACE: "Write the calls as one Python list, [tool_name(arg=\"value\")], without <tool_call> tags or JSON. ",
    LLAMA31: "Write a call as raw JSON, {{\"name\": \"tool_name\", \"parameters\": {{...}}}}, several as one JSON list, "
             "without <tool_call> tags. ",
}
PARSE_HINT_END = "Available tools: {tools}. If no tool fits, answer in plain text."
GENERIC_HINT = "Re-read the tool's schema and the error message, then correct the call."
# (kind, pattern in the error text, hint): the first match wins. The kinds cover every error the eight BFCL API
# classes return (tests/unit/test_error_hints.py checks each one against its intended kind).
ERROR_HINTS = [
    ("missing_argument", r"missing (?:a|\d+) required (?:positional |keyword-only )?arguments?: '?(\w+)",
     "Supply the required argument '{0}'."),
    ("unexpected_argument", r"unexpected keyword argument '?(\w+)", "Drop the argument '{0}': this tool does not take it."),
    ("log_in", r"not authenticated|log ?in|logged in|authenticate|access token|token (?:expired|not initialized)",
     "Log in first with the authentication tool, then try again."),
    ("one_step", r"invalid character|path not allowed|unsupported path|one folder level",
     "Go one step at a time: a name or path with several components is not accepted."),
    ("inspect", r"no such (?:file|directory)|not found|does not exist|not registered|already the root|"
                r"is a directory|not a (?:file|directory)|invalid (?:stock symbol|departure|destination)",
     "Inspect first (for example list what is there) to find the exact name."),
    ("types", r"must be (?:a )?numbers?|must be an integer|unsupported operand|not supported between|"
              r"invalid literal|must be (?:str|int|float|list|dict)|not iterable|can only concatenate",
     "Re-check the argument types against the schema."),
    ("value", r"invalid (?:mode|option|headlight|ignition|priority|travel class|date format|speed|fields)|wc: invalid mode|"
              r"must be between|must be positive|must be one of|cannot be (?:negative|zero)|negative number|by zero|"
              r"too large|empty list|is not supported|above the tank|no available (?:route|exchange)",
     "Use a value the tool accepts: check the schema's allowed values, ranges and formats."),
    ("precondition", r"before|already|exists|not empty|closed|insufficient|exceeded|budget|is empty|"
                     r"needs to be pressed|press the brake",
     "The current state does not allow this yet: do what the error asks first, then try again."),
]


def recovery_feedback(status: str, result: str, visible: list[str], call_format: str = QWEN) -> str:
    """phi_err: one hint for a failed call, chosen from the error text (docs/method.md §4); a parse error's hint
    shows the call syntax of ``call_format``."""
    tools = ", ".join(sorted(visible))
    if status == CallStatus.PARSE_ERROR:
        return (PARSE_HINTS[call_format] + PARSE_HINT_END).format(tools=tools)
    if status == CallStatus.UNKNOWN_TOOL:
        return f"Use only the listed tools: {tools}."
    for _, pattern, hint in ERROR_HINTS:
        match = re.search(pattern, result, re.IGNORECASE)
        if match:
            return hint.format(*match.groups())
    return GENERIC_HINT


# --- phi_cap: capability guidelines -----------------------------------------------------------------------

GUIDELINES = {  # one template line per failure label
    Label.SPURIOUS_TOOL_CALL: "If none of the tools can do what the user asks, say so in plain text instead of calling one.",
    Label.EMPTY_TURN_MODEL_RESPONSE: "When a request needs an action, call the tools; do not only describe what you would do.",
    Label.INSTANCE_MISMATCH: "Use the tools of the service the request is about.",
    Label.STATE_MISMATCH: "Check names and values against the request before acting; inspect the current state when unsure.",
    Label.RESPONSE_MISMATCH: "Call the tools that show the user what they asked for, and report the results.",
}
MIN_COUNT, MIN_PREVALENCE, MAX_REWARD, MAX_LINES = 8, 0.10, 0.6, 3  # the release's defaults (its min_tag_count: 8)


@dataclass(frozen=True)
class GuidelineCandidate:
    """One failure label as phi_cap's rule sees it."""

    label: str
    count: int
    prevalence: float  # its share of the failure labels that have a guideline
    mean_reward: float  # of the trajectories it occurred in
    score: float  # prevalence * (1 - mean reward): the rank
    qualifies: bool  # count >= min_count (8), prevalence >= 10% and mean reward < 0.6


def guideline_candidates(counts: dict[str, int], mean_rewards: dict[str, float],
                         min_count: int = MIN_COUNT) -> list[GuidelineCandidate]:
    """phi_cap's rule label by label: every failure label with a guideline that occurred, best score first, with
    whether it qualifies for a line (``capability_guidelines`` shows the first three that do)."""
    failures = {label: n for label, n in counts.items() if label in GUIDELINES and n > 0}
    total = sum(failures.values())
    candidates = []
    for label, n in failures.items():
        prevalence, reward = n / total, mean_rewards.get(label, 0.0)
        qualifies = n >= min_count and prevalence >= MIN_PREVALENCE and reward < MAX_REWARD
        candidates.append(GuidelineCandidate(label, n, prevalence, reward, prevalence * (1 - reward), qualifies))
    return sorted(candidates, key=lambda candidate: (-candidate.score, candidate.label))


def capability_guidelines(counts: dict[str, int], mean_rewards: dict[str, float],
                          hints: dict[str, str] | None = None, min_count: int = MIN_COUNT) -> tuple[str, ...]:
    """phi_cap: the labels with count >= ``min_count`` (8), at least 10% of failure labels and mean reward < 0.6,
    ranked by prevalence * (1 - mean reward), at most 3 lines. A line leaves once its label stops qualifying (its
    reward recovered). ``hints`` replaces a label's template with another text (the local diagnoser's hint)."""
    chosen = [candidate.label for candidate in guideline_candidates(counts, mean_rewards, min_count)
              if candidate.qualifies]
    return tuple((hints or {}).get(label) or GUIDELINES[label] for label in chosen[:MAX_LINES])


class TaskView(Protocol):
    """What the core reads of a task (seal_lite/envs/bfcl.py's ``Task`` is one): its turns, the tools and user
    messages it shows, and its ground-truth calls."""

    turns: list
    ground_truth: list[list[str]]  # call strings per turn

    def visible_functions(self, turn_index: int) -> list[dict]: ...
    def user_message(self, turn_index: int) -> str: ...


def interface_for_task(interface: TrainingInterface, task: TaskView) -> TrainingInterface:
    """The interface for one task, with any of its ground-truth argument values that its own conversation does
    not show removed from the guidelines (a diagnoser hint learned on another task could carry one)."""
    if not interface.guidelines:
        return interface
    visible = json.dumps(task.visible_functions(len(task.turns) - 1)) + " ".join(
        task.user_message(index) for index in range(len(task.turns)))
    hidden = argument_values([call for turn in task.ground_truth for call in turn])
    guarded = tuple(redact_unseen_values(line, hidden, visible)[0] for line in interface.guidelines)
    return replace(interface, guidelines=guarded)


def interface_from_version(row: dict) -> TrainingInterface:
    """The training interface a stored version describes (``seal-lite prompt --run`` renders it)."""
    components = row["components"]
    return TrainingInterface(bool(components.get("schema_cues")), bool(components.get("recovery_feedback")),
                             tuple(row.get("guidelines") or ()), components.get("tool_format") or "official",
                             components.get("call_format") or QWEN)


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
    if components.get("call_format", QWEN) != QWEN:  # runs in Qwen's format show what they always showed
        lines.append(f"call format: {components['call_format']}")
    return "\n".join(lines)


def diff_versions(first: dict, second: dict) -> str:
    """A unified diff of two stored interface versions as ``describe_version`` shows them ("" if equal)."""
    import difflib

    return "\n".join(difflib.unified_diff(describe_version(first).splitlines(), describe_version(second).splitlines(),
                                          f"version {first['version']}", f"version {second['version']}", lineterm=""))
