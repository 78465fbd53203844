"""The agent's view of a task: system prompt, tool list, and the training-time schema cues (phi_schema).

``render_view`` is the one function that builds what the policy sees. ``schema_cues=False`` is the plain BFCL
view, which evaluation uses whatever the training interface is (SEAL_METHOD.md §4: evaluation sees none of
the training-time components). Pure functions of the tool docs: no ground truth ever reaches them.
"""

from __future__ import annotations

import copy
import json
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


def render_view(functions: list[dict], schema_cues: bool, tool_format: str = "signatures") -> View:
    """The system prompt and tool docs for one episode; ``schema_cues=False`` gives the plain view."""
    tools = apply_schema_cues(functions) if schema_cues else copy.deepcopy(functions)
    lines = ["You are an agent that completes the user's requests by calling tools.", "Available tools:"]
    lines.append(render_tools(tools, tool_format))
    lines.append(CALL_FORMAT)
    if schema_cues:
        lines.append(SCHEMA_CUE_LINE)
    return View("\n".join(lines), tools)


def reveal_message(new_functions: list[dict], schema_cues: bool, tool_format: str, user_text: str) -> str:
    """A user turn that also makes more tools visible (BFCL miss_func)."""
    tools = apply_schema_cues(new_functions) if schema_cues else new_functions
    return f"New tools are now available:\n{render_tools(tools, tool_format)}\n{user_text}"
