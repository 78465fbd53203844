"""Safe parsing of model text into tool calls, in four modes (``rollout.parser``).

* ``strict`` is the official BFCL surface of the SEAL release (docs/method.md §8, ``strict_tool_parser``):
  calls are ``<tool_call>{"name": "cd", "arguments": {"folder": "x"}}</tool_call>`` blocks whose object has
  both "name" and "arguments". One malformed block makes the whole message a parse error (no call of it runs),
  and tag text without any valid block is one too. A message without tool-call tags is an answer in text.
* ``lenient`` also reads BFCL's python-call form ``[cd(folder='x'), ls()]`` (optionally inside a code fence),
  unclosed blocks and "parameters" for "arguments", and keeps the well-formed calls of a message beside its
  malformed ones. ``seal-lite verify`` and ground-truth replay use it: their input is python-call strings.
* ``toolace`` and ``llama3.1`` are the release's formats for Llama-family models (ToolACE-2's python call list,
  Meta's raw JSON calls), read by seal_lite/core/llama_formats.py as the release reads them, strict like
  ``strict``: any error rejects the whole message. Each also has its own prompt and tool results, so a parser
  names a call format (``call_format``): Qwen's for strict and lenient, else its own.

Model text is never executed. Python-style calls are read with ``ast.parse`` and each argument value with
``ast.literal_eval``, which only builds literals; JSON goes through ``json.loads``. Every value is then
checked to be JSON-like (str, int, finite float, bool, None, list, dict with str keys), and every tool and
argument name to be a plain identifier: seal-lite's guards on top of the release's checks. What fails becomes
a ``ParseError`` entry for the turn, never an exception in the loop.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
from dataclasses import dataclass, field

from seal_lite.core.llama_formats import LLAMA31, TOOLACE, FormCalls, read_llama31, read_toolace

QWEN = "qwen"  # the call format of strict and lenient: Qwen's <tool_call> blocks and tool block
FORM_READERS = {TOOLACE: read_toolace, LLAMA31: read_llama31}
MAX_CALL_TEXT_CHARS = 20_000  # longer model outputs are rejected before parsing (cost and recursion guard)
MAX_VALUE_DEPTH = 20

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_STRICT_BLOCK = re.compile(r"<tool_call>\s*\n?({.*?})\s*\n?</tool_call>", re.DOTALL)  # the release's pattern
_CODE_FENCE = re.compile(r"```(?:python|py|json)?\s*(.*?)```", re.DOTALL)
_CALL_START = re.compile(r"\[?\s*[A-Za-z_][\w.]*\(")
_JSON_STRING = re.compile(r'"(?:\\.|[^"\\])*"')


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    positional: tuple = ()  # positional values, bound to parameter names by the environment

    def to_python(self) -> str:
        """The canonical BFCL call string, e.g. ``cd(folder='x')``.

        Built only from a validated identifier and ``repr`` of JSON-like literals, so the official BFCL
        checker (which evaluates call strings) receives text we produced, never model text.
        """
        args = [repr(value) for value in self.positional]
        args += [f"{key}={value!r}" for key, value in self.arguments.items()]
        return f"{self.name}({', '.join(args)})"


@dataclass
class ParsedCalls:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _InvalidCall(ValueError):
    pass


def call_format(parser: str) -> str:
    """The format a parser reads, which also sets the prompt and the tool results: ``qwen`` for strict and lenient,
    else the parser's own (toolace, llama3.1)."""
    return parser if parser in FORM_READERS else QWEN


def evaluation_parser(parser: str) -> str:
    """The parser evaluation uses: strict in Qwen's format (lenient is a training aid), else the recipe's own
    format, in which the release evaluates a ToolACE or Llama-3.1 policy."""
    return parser if parser in FORM_READERS else "strict"


def rejects_whole_message(parser: str) -> bool:
    """Whether one bad call rejects every call of its message (strict, toolace, llama3.1: the release's strict
    parsers), rather than only itself (lenient)."""
    return parser != "lenient"


def parse_calls(text: str, parser: str = "lenient") -> ParsedCalls:
    """Extract tool calls from one model message with the ``strict``, ``lenient``, ``toolace`` or ``llama3.1``
    parser. Never raises on any input string."""
    if len(text) > MAX_CALL_TEXT_CHARS:
        return ParsedCalls(errors=[f"message too long to parse ({len(text)} > {MAX_CALL_TEXT_CHARS} chars)"])
    if parser == "strict":
        return _parse_strict(text)
    if parser in FORM_READERS:
        return _guarded(FORM_READERS[parser](text))
    blocks = _TOOL_CALL_BLOCK.findall(text)
    if blocks:
        return _collect(blocks, _parse_json_call)
    candidate = _python_call_candidate(text)
    if candidate is None:
        return ParsedCalls()  # plain-text answer: no calls
    return _collect([candidate], _parse_python_calls)


def _parse_strict(text: str) -> ParsedCalls:
    """The official parser: every block must be a JSON object with "name" and "arguments" (an object, or a JSON
    string holding one); any problem rejects the whole message with the reasons joined by "; ", as the release
    words them."""
    blocks = _STRICT_BLOCK.findall(text)
    if not blocks:
        if "<tool_call" in text or "</tool_call>" in text:
            return ParsedCalls(errors=["Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block."])
        return ParsedCalls()
    calls, errors = [], []
    for block in blocks:
        try:
            payload = _load_json(block.strip())
        except (ValueError, RecursionError) as error:
            errors.append(f"Invalid tool call JSON: {str(error)[:80]}")
            continue
        if not isinstance(payload, dict) or "name" not in payload or "arguments" not in payload:
            errors.append("Tool call JSON must contain both 'name' and 'arguments'.")
            continue
        name, arguments = payload["name"], payload["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = _load_json(arguments)
            except (ValueError, RecursionError):
                errors.append(f"Tool '{str(name)[:40]}' has non-JSON string arguments.")
                continue
        if not isinstance(arguments, dict):
            errors.append(f"Tool '{str(name)[:40]}' arguments must be a JSON object.")
            continue
        try:  # seal-lite's own guards (plain identifiers, JSON-like values) on top of the release's checks
            calls.append(_make_call(name if isinstance(name, str) else "", arguments))
        except _InvalidCall as error:
            errors.append(str(error))
    return ParsedCalls(errors=["; ".join(errors)]) if errors else ParsedCalls(calls=calls)


def _guarded(form: FormCalls) -> ParsedCalls:
    """A Llama-family message as the release reads it, then seal-lite's guards on the calls it accepts; as in the
    release, any error makes the whole message one parse error."""
    if form.errors:
        return ParsedCalls(errors=["; ".join(form.errors)])
    calls, errors = [], []
    for name, arguments in form.calls:
        try:
            calls.append(_make_call(name, arguments))
        except _InvalidCall as error:
            errors.append(str(error))
    return ParsedCalls(errors=["; ".join(errors)]) if errors else ParsedCalls(calls=calls)


def _collect(chunks, parse_chunk) -> ParsedCalls:
    parsed = ParsedCalls()
    for chunk in chunks:
        try:
            parsed.calls.extend(parse_chunk(chunk.strip()))
        except _InvalidCall as error:
            parsed.errors.append(str(error))
    return parsed


def _python_call_candidate(text: str) -> str | None:
    """The message body if it starts like a python call list (``[f(`` or ``f(``), else None (plain text).

    A body that starts like a call but does not parse (say, cut off by the token budget) is a failed call,
    not an answer in prose.
    """
    fenced = _CODE_FENCE.search(text)
    body = (fenced.group(1) if fenced else text).strip()
    return body if _CALL_START.match(body) else None


def _load_json(text: str):
    """json.loads, refusing NaN/Infinity and nesting deeper than arguments may go before the decoder recurses
    (a thousand levels would exhaust the interpreter's stack)."""
    if _nesting_depth(text) > MAX_VALUE_DEPTH + 2:
        raise ValueError(f"nested deeper than {MAX_VALUE_DEPTH}")
    return json.loads(text, parse_constant=_reject_constant)


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in _JSON_STRING.sub('""', text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parse_json_call(block: str) -> list[ToolCall]:
    try:
        payload = _load_json(block)
    except (ValueError, RecursionError) as error:
        raise _InvalidCall(f"tool_call block is not valid JSON: {str(error)[:80]}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        raise _InvalidCall('tool_call block must be an object with a "name" string')
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = _load_json(arguments)
        except (ValueError, RecursionError):
            raise _InvalidCall("arguments string is not valid JSON") from None
    return [_make_call(payload["name"], arguments)]


def _parse_python_calls(source: str) -> list[ToolCall]:
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise _InvalidCall(f"not a valid python call list: {type(error).__name__}") from None
    nodes = tree.body.elts if isinstance(tree.body, (ast.List, ast.Tuple)) else [tree.body]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise _InvalidCall("each element must be a call of a plain function name, like f(a=1)")
        positional = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise _InvalidCall(f"{node.func.id}: *args is not allowed")
            positional.append(_literal(arg, node.func.id, "a positional argument"))
        arguments = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _InvalidCall(f"{node.func.id}: **kwargs is not allowed")
            arguments[kw.arg] = _literal(kw.value, node.func.id, f"argument {kw.arg}")
        calls.append(_make_call(node.func.id, arguments, positional))
    return calls


def _literal(node: ast.AST, name: str, what: str):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise _InvalidCall(f"{name}: {what} is not a literal value") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _make_call(name: str, arguments, positional=()) -> ToolCall:
    # ASCII only: python normalises other identifiers (NFKC), so the call the checker evaluates would name
    # another argument than the one dispatched.
    if not _is_plain_identifier(name) or name.startswith("_"):
        raise _InvalidCall(f"invalid tool name {name[:40]!r}")
    if not isinstance(arguments, dict):
        raise _InvalidCall(f"{name}: arguments must be an object")
    for key in arguments:
        if not isinstance(key, str) or not _is_plain_identifier(key):
            raise _InvalidCall(f"{name}: invalid argument name {str(key)[:40]!r}")
    return ToolCall(
        name,
        {key: _json_like(value, name, 0) for key, value in arguments.items()},
        tuple(_json_like(value, name, 0) for value in positional),
    )


def _is_plain_identifier(text: str) -> bool:
    return text.isascii() and text.isidentifier() and not keyword.iskeyword(text)


def _json_like(value, name: str, depth: int):
    if depth > MAX_VALUE_DEPTH:
        raise _InvalidCall(f"{name}: argument nested deeper than {MAX_VALUE_DEPTH}")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _InvalidCall(f"{name}: non-finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_like(item, name, depth + 1) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_like(item, name, depth + 1) for key, item in value.items()}
    raise _InvalidCall(f"{name}: unsupported argument type {type(value).__name__}")
