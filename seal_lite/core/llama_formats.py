"""The SEAL release's two Llama-family tool-call formats (``rollout.parser`` toolace and llama3.1): how the prompt
shows the tools, how a model message is read, how tool results go back (docs/surface.md).

* ``toolace`` is the release's ``toolace_official_prompt`` mode, BFCL's prompt for ToolACE-2: the system message
  lists the tools as indented JSON (each doc's "parameters" named "arguments") and asks for a python call list,
  ``[cd(folder='x'), ls()]``; each result goes back as ``{"output": ...}``.
* ``llama3.1`` is the release's ``llama31_official_fc`` mode, Meta's JSON function calling: a fixed system message,
  the tool prompt before the first user question, calls as raw JSON ``{"name": ..., "parameters": {...}}`` (several
  as one JSON list); each result goes back as its text.

Both send executed calls' results under the ``ipython`` role, as Llama 3.1's chat format and the release do.

The readers follow the release's ``parse_toolace_content_to_tool_calls`` and
``parse_llama31_official_content_to_tool_calls`` with ``strict=True`` branch by branch, with its error texts, and
return what the message names, unchecked: (name, arguments) pairs and errors. seal_lite/core/calls.py then applies
its own guards (plain identifiers, JSON-like values). Model text is never executed: python calls are read with
``ast.parse`` and each value with ``ast.literal_eval``, JSON with ``json.loads``; a value that is no literal is kept
as its source text (``f(x=a+1)`` gives "a + 1"), as the release keeps it. Where the release's reader raises (a null
byte, an attribute chain thousands deep) these return an error.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

TOOLACE, LLAMA31 = "toolace", "llama3.1"
RESULT_ROLE = "ipython"  # Llama 3.1's role for tool output (the release's _append_env_response)

TOOLACE_INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. Based on "
    "the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out. If the given question lacks the parameters required by the "
    "function, also point it out.\n"
    "You should only return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1="
    "params_value1, params_name2=params_value2...), func_name2(params)].\n"
    "You SHOULD NOT include any other text in the response.\n\n"
    "Here is a list of functions in JSON format that you can invoke.\n"
)
LLAMA31_SYSTEM_PROMPT = "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"
LLAMA31_INSTRUCTIONS = [
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that "
    "best answers the given prompt.",
    "",
    'For one function call, respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.",
    "If multiple function calls are needed in the same turn, respond with one raw JSON list of those objects, for "
    'example [{"name": "func1", "parameters": {...}}, {"name": "func2", "parameters": {...}}].',
    "Do not use variables.",
    "Return only raw JSON for function calls; do not wrap the JSON in <tool_call> tags.",
    "Do not emit several standalone JSON objects on separate lines; use a JSON list for multiple calls.",
    "If no function can be used, or required parameters are missing, answer briefly in plain text.",
    "",
]


# --- prompts and results ---------------------------------------------------------------------------------------


def toolace_system_prompt(functions: list[dict]) -> str:
    """The toolace system message, as the release's tools_schema_to_toolace_official_prompt writes it: the docs as
    one indented JSON list of name, description and the parameters as "arguments"."""
    docs = []
    for doc in functions:
        entry = {"name": doc.get("name", ""), "description": doc.get("description", "")}
        parameters = doc.get("parameters") or doc.get("arguments")
        if parameters is not None:
            entry["arguments"] = parameters
        docs.append(entry)
    return TOOLACE_INSTRUCTIONS + json.dumps(docs, ensure_ascii=False, indent=4) + "\n"


def llama31_tool_prompt(functions: list[dict], extras: list[str]) -> str:
    """What the llama3.1 format puts before the first user question, as the release's
    tools_schema_to_llama31_official_prompt writes it: the instructions, each doc as indented JSON, then the training
    interface's extra lines, each part followed by an empty line."""
    lines = list(LLAMA31_INSTRUCTIONS)
    for doc in functions:
        lines += [json.dumps(doc, ensure_ascii=False, indent=4), ""]
    if extras:
        lines += [*extras, ""]
    return "\n".join(lines)


def llama31_first_message(tool_prompt: str, question: str) -> str:
    """The first user message of the llama3.1 format: the tool prompt, then the question."""
    return f"{tool_prompt}\n{question.strip()}".strip()


def result_text(result: str, call_format: str) -> str:
    """One executed call's result as the format sends it: ``{"output": result}`` for toolace (the JSON vLLM's ToolACE
    template writes, the release's toolace_official_prompt result mode), the text itself for llama3.1."""
    return json.dumps({"output": result}, ensure_ascii=False) if call_format == TOOLACE else result


# --- reading a message -------------------------------------------------------------------------------------------

READ_ERRORS = (ValueError, TypeError, SyntaxError, RecursionError, MemoryError)  # json, ast.parse and literal_eval's
_BARE_CALL = re.compile(r"^[A-Za-z_][\w.]*\s*\(")
_UNQUOTED_NAME = re.compile(r'((?:"name"|"function")\s*:\s*)([A-Za-z_][\w.]*)')
_OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
TAGS_IN_TOOLACE = ("ToolACE BFCL prompt mode expects a Python function-call list, e.g. [search(query=\"value\")], "
                   "not <tool_call> tags.")
TAGS_IN_LLAMA31 = "Llama-3.1 official mode expects raw JSON, not <tool_call> XML tags."


@dataclass
class FormCalls:
    """What a message holds in its format, before seal-lite's guards: (name, arguments) as the message gives them,
    and the release's error texts (any error rejects the whole message)."""

    calls: list[tuple[object, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def read_llama31(text: str) -> FormCalls:
    """A llama3.1 message: raw JSON calls, one object or a list (or objects one after another); text that does not
    start like JSON and does not parse is an answer."""
    stripped = text.strip()
    if not stripped:
        return FormCalls()
    if "<tool_call" in stripped or "</tool_call>" in stripped:
        return FormCalls(errors=[TAGS_IN_LLAMA31])
    try:
        payload = _llama31_payload(stripped)
    except READ_ERRORS as error:
        if stripped.startswith(("{", "[", "```")):
            return FormCalls(errors=[f"Invalid Llama-3.1 JSON function call: {_shown(error)}"])
        return FormCalls()
    form = FormCalls()
    for entry in payload if isinstance(payload, list) else [payload]:
        _read_llama31_entry(entry, form)
    return form


def _llama31_payload(text: str):
    text = _strip_code_fence(text.replace("<|python_tag|>", ""))
    if not text:
        raise ValueError("empty response")
    try:
        return _json_or_literal(text)
    except READ_ERRORS:
        pass
    fragments = _top_level_values(text)
    if len(fragments) > 1:
        return [_json_or_literal(fragment) for fragment in fragments]
    raise ValueError("expected raw JSON function call")


def _read_llama31_entry(entry, form: FormCalls) -> None:
    if not isinstance(entry, dict):
        form.errors.append("Function call entry must be a JSON object.")
        return
    name = entry.get("name") or entry.get("function")
    arguments = entry.get("parameters", entry.get("arguments"))
    if not name:
        form.errors.append("Function call JSON must contain a 'name' key.")
        return
    if arguments is None:
        form.errors.append("Function call JSON must contain a 'parameters' object.")
        return
    name = _name_text(name)  # the release takes str(name): a tool list never has such a name, so it is refused
    if isinstance(arguments, str):
        try:
            arguments = _json_or_literal(arguments)
        except READ_ERRORS:
            form.errors.append(f"Tool '{name}' has non-JSON string parameters.")
            return
    if not isinstance(arguments, dict):
        form.errors.append(f"Tool '{name}' parameters must be a JSON object.")
        return
    form.calls.append((name, arguments))


def read_toolace(text: str) -> FormCalls:
    """A toolace message: every top-level [...] holding parentheses is a python call list; else one bare call
    ``f(a=1)``, or a JSON-style call as ToolACE sometimes writes one; other text is an answer (one ending in "]"
    is refused)."""
    lists = _bracket_spans(text)
    stripped = text.strip()
    if not lists:
        if "<tool_call" in stripped or "</tool_call>" in stripped:
            return FormCalls(errors=[TAGS_IN_TOOLACE])
        if _BARE_CALL.match(stripped) and stripped.endswith(")"):
            lists = [stripped]
        elif stripped.startswith(("{", "[", "```")):
            return _read_toolace_json(stripped)
        elif stripped.endswith("]"):
            return FormCalls(errors=["Invalid ToolACE function-call list."])
        else:
            return FormCalls()
    form = FormCalls()
    for source in lists:
        _read_call_list(source, form)
    return form


def _read_call_list(source: str, form: FormCalls) -> None:
    try:
        body = ast.parse(source, mode="eval").body
    except SyntaxError as error:
        form.errors.append(f"Invalid ToolACE function-call syntax: {error.msg}")
        return
    except (ValueError, RecursionError, MemoryError) as error:  # the release's parser raises here
        form.errors.append(f"Invalid ToolACE function-call syntax: {type(error).__name__}")
        return
    if isinstance(body, (ast.List, ast.Tuple)):
        elements = body.elts
    elif isinstance(body, ast.Call):
        elements = [body]
    else:
        form.errors.append("ToolACE output must be a list of function calls.")
        return
    for node in elements:
        _read_python_call(node, form)


def _read_python_call(node: ast.AST, form: FormCalls) -> None:
    if not isinstance(node, ast.Call):
        form.errors.append("ToolACE list contains a non-call item.")
        return
    name = _dotted_name(node.func)
    if not name:
        form.errors.append("ToolACE call has an invalid function name.")
        return
    if node.args:
        form.errors.append(f"Tool '{name}' uses positional arguments.")
        return
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            form.errors.append(f"Tool '{name}' uses unsupported **kwargs.")
            continue
        arguments[keyword.arg] = _literal_or_source(keyword.value)
    form.calls.append((name, arguments))


def _dotted_name(node: ast.AST) -> str | None:
    """``f``, or ``a.b.f`` for an attribute chain (from its first plain name on), as the release's
    _toolace_ast_name names a called function; walked in a loop, so a chain thousands deep cannot overflow."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts)) or None


def _literal_or_source(node: ast.AST):
    """An argument's value: its literal, else its source text, else None (the release's _toolace_literal)."""
    try:
        return ast.literal_eval(node)
    except READ_ERRORS:
        try:
            return ast.unparse(node)
        except READ_ERRORS:
            return None


def _read_toolace_json(text: str) -> FormCalls:
    try:
        payload = _toolace_json_payload(text)
    except READ_ERRORS as error:
        return FormCalls(errors=[f"Invalid ToolACE JSON-style function call: {_shown(error)}"])
    form = FormCalls()
    for entry in payload if isinstance(payload, list) else [payload]:
        _read_json_style_entry(entry, form)
    return form


def _read_json_style_entry(entry, form: FormCalls) -> None:
    if not isinstance(entry, dict):
        form.errors.append("ToolACE JSON-style call entry must be an object.")
        return
    name = entry.get("name") or entry.get("function")
    if not isinstance(name, str) or not name.strip():
        form.errors.append("ToolACE JSON-style call must contain a string 'name'.")
        return
    arguments = entry.get("parameters", entry.get("arguments", {}))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = _json_or_literal(arguments)
        except READ_ERRORS:
            form.errors.append(f"Tool '{name}' has non-JSON string parameters.")
            arguments = {}
    if not isinstance(arguments, dict):
        form.errors.append(f"Tool '{name}' parameters must be an object.")
        arguments = {}
    form.calls.append((name.strip(), arguments))


def _toolace_json_payload(text: str):
    """A JSON-style call, object or list, as the release's _loads_toolace_jsonish_payload reads one: objects
    separated by "," or ";" first as a list, a bare name value quoted, and JSON's true/false/null tried as Python's."""
    text = _strip_code_fence(text)
    candidates = [text]
    if text.startswith("{") and re.search(r"}\s*[,;]\s*{", text):
        candidates.insert(0, "[" + re.sub(r"}\s*;\s*{", "}, {", text) + "]")
    last_error: Exception = ValueError("empty ToolACE JSON-style payload")
    for candidate in candidates:
        quoted = _UNQUOTED_NAME.sub(lambda match: f'{match.group(1)}"{match.group(2)}"', candidate)
        for read in (_json_or_literal, _python_literal):
            try:
                return read(quoted)
            except READ_ERRORS as error:
                last_error = error
    raise last_error


def _python_literal(text: str):
    text = re.sub(r"\bnull\b", "None", re.sub(r"\bfalse\b", "False", re.sub(r"\btrue\b", "True", text)))
    return ast.literal_eval(text)


# --- shared by both readers -----------------------------------------------------------------------------------


def _json_or_literal(text: str):
    """json.loads, else ast.literal_eval (it builds literals only), as the release's _loads_json_or_literal."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def _strip_code_fence(text: str) -> str:
    """The text without a surrounding ``` fence (its first line, and its last if that is a fence too)."""
    text = text.strip()
    if not text.startswith("```"):
        return text
    lines = text.splitlines()[1:]
    if lines and lines[-1].strip().startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines).strip()


def _top_level_values(text: str) -> list[str]:
    """Top-level {...} or [...] values written one after another (separated by space, "," or ";"), as the
    release's _split_top_level_jsonish_values cuts them: Llama 3.1 often writes one call object per line."""
    closing = {"{": "}", "[": "]"}
    fragments, expected, start, quote, escaped = [], [], None, None, False
    for index, char in enumerate(text):
        if start is None:
            if char.isspace() or char in ";,":
                continue
            if char not in closing:
                raise ValueError("expected raw JSON function call")
            start = index
            expected.append(closing[char])
        elif quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in closing:
            expected.append(closing[char])
        elif char in "}]":
            if not expected or char != expected[-1]:
                raise ValueError("mismatched JSON brackets")
            expected.pop()
            if not expected:
                fragments.append(text[start : index + 1].strip())
                start = None
    if start is not None or expected:
        raise ValueError("incomplete raw JSON function call")
    if not fragments:
        raise ValueError("expected raw JSON function call")
    return fragments


def _bracket_spans(text: str) -> list[str]:
    """Every top-level [...] outside quotes that holds a "(" and a ")", in order (the release's
    _toolace_bracket_spans): the call lists of a toolace message."""
    spans, depth, start, quote, escaped = [], 0, None, None, False
    for index, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "[":
            if depth == 0:
                start = index
            depth += 1
        elif char == "]" and depth > 0:
            depth -= 1
            if depth == 0:
                span = text[start : index + 1]
                if "(" in span and ")" in span:
                    spans.append(span)
    return spans


def _name_text(name) -> str:
    """A name as the release writes it (str), or its type's name when it is nested too deep to write."""
    try:
        return str(name)
    except RecursionError:
        return type(name).__name__


def _shown(error: Exception) -> str:
    """An error's text without object addresses (literal_eval names the node it refused by its address), so the
    environment's reply is the same in every run."""
    return _OBJECT_ADDRESS.sub("", str(error))
