# ruff: noqa
"""The SEAL release's tool-call parsers, prompt writers and result formats, vendored verbatim as the reference that
tests/unit/test_release_formats.py holds seal-lite's against.

Copied from github.com/yihaohu0118/SEAL, env_service/environments/bfcl/bfcl_env.py at commit
a0d22dbae7da81b1adf5deda5005406372c6dafd (lines 54-745 and 863-968; the same text on branch seal-release-cleanup),
Apache License 2.0 (the file's header credits github.com/ShishirPatil/gorilla, also Apache-2.0). Nothing was changed
in the copied lines; only this docstring and the imports below were added. The copied code prints a line for each
<tool_call> block that is not valid JSON.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Dict, List


LLAMA31_OFFICIAL_SYSTEM_PROMPT = """Environment: ipython
Cutting Knowledge Date: December 2023
Today Date: 26 Jul 2024"""


def _strip_json_code_fence(content: str) -> str:
    text = content.strip()
    if not text.startswith("```"):
        return text
    lines = text.splitlines()
    if lines and lines[0].strip().startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].strip().startswith("```"):
        lines = lines[:-1]
    return "\n".join(lines).strip()


def _loads_json_or_literal(fragment: str) -> Any:
    try:
        return json.loads(fragment)
    except json.JSONDecodeError:
        return ast.literal_eval(fragment)


def _split_top_level_jsonish_values(text: str) -> List[str]:
    """Split concatenated top-level JSON/Python-literal objects.

    Llama-3.1 often emits multiple raw function-call objects separated by
    newlines when a turn needs several tools. The official prompt prefers a
    JSON list, but accepting newline-separated objects avoids turning a
    semantically good multi-call plan into a parse-error loop.
    """
    fragments: list[str] = []
    stack: list[str] = []
    start: int | None = None
    quote: str | None = None
    escape = False

    matching = {"{": "}", "[": "]"}

    for idx, ch in enumerate(text):
        if start is None:
            if ch.isspace() or ch in ";,":
                continue
            if ch not in matching:
                raise ValueError("expected raw JSON function call")
            start = idx
            stack.append(matching[ch])
            continue

        if quote is not None:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = None
            continue

        if ch in ("'", '"'):
            quote = ch
        elif ch in matching:
            stack.append(matching[ch])
        elif ch in ("}", "]"):
            if not stack or ch != stack[-1]:
                raise ValueError("mismatched JSON brackets")
            stack.pop()
            if not stack:
                fragments.append(text[start : idx + 1].strip())
                start = None

    if start is not None or stack:
        raise ValueError("incomplete raw JSON function call")
    if not fragments:
        raise ValueError("expected raw JSON function call")
    return fragments


def _parse_llama31_payload(content: str) -> Any:
    text = _strip_json_code_fence(content.replace("<|python_tag|>", "")).strip()
    if not text:
        raise ValueError("empty response")
    try:
        return _loads_json_or_literal(text)
    except Exception:
        pass

    fragments = _split_top_level_jsonish_values(text)
    if len(fragments) > 1:
        return [_loads_json_or_literal(fragment) for fragment in fragments]

    raise ValueError("expected raw JSON function call")


def parse_llama31_official_content_to_tool_calls(
    content: str, strict: bool = False
) -> Dict[str, Any]:
    stripped = content.strip()
    if not stripped:
        return {"role": "assistant", "content": "", "tool_calls": []}

    has_tool_tag = "<tool_call" in stripped or "</tool_call>" in stripped
    looks_structured = stripped.startswith("{") or stripped.startswith("[") or stripped.startswith("```")
    if has_tool_tag:
        result = {"role": "assistant", "content": stripped, "tool_calls": []}
        if strict:
            result["_bfcl_parse_error"] = (
                "Llama-3.1 official mode expects raw JSON, not <tool_call> XML tags."
            )
        return result

    try:
        payload = _parse_llama31_payload(stripped)
    except Exception as exc:
        result = {"role": "assistant", "content": stripped, "tool_calls": []}
        if strict and looks_structured:
            result["_bfcl_parse_error"] = f"Invalid Llama-3.1 JSON function call: {exc}"
        return result

    entries = payload if isinstance(payload, list) else [payload]
    tool_calls: list[dict[str, Any]] = []
    parse_errors: list[str] = []
    call_id_counter = 1
    for entry in entries:
        if not isinstance(entry, dict):
            parse_errors.append("Function call entry must be a JSON object.")
            continue
        func_name = entry.get("name") or entry.get("function")
        arguments = entry.get("parameters", entry.get("arguments"))
        if not func_name:
            parse_errors.append("Function call JSON must contain a 'name' key.")
            continue
        if arguments is None:
            parse_errors.append("Function call JSON must contain a 'parameters' object.")
            continue
        if isinstance(arguments, str):
            try:
                arguments = _loads_json_or_literal(arguments)
            except Exception:
                parse_errors.append(f"Tool '{func_name}' has non-JSON string parameters.")
                continue
        if strict and not isinstance(arguments, dict):
            parse_errors.append(f"Tool '{func_name}' parameters must be a JSON object.")
            continue
        tool_calls.append(
            {
                "id": f"{func_name}_{call_id_counter}",
                "type": "function",
                "function": {
                    "name": str(func_name),
                    "arguments": arguments,
                },
            }
        )
        call_id_counter += 1

    result = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    if strict and parse_errors:
        result["_bfcl_parse_error"] = "; ".join(parse_errors)
    return result


def parse_assistant_content_to_tool_calls(
    msg: Dict[str, Any],
    strict: bool = False,
    parser_mode: str = "xml_json",
    reject_tool_call_with_content: bool = False,
    flag_python_literals: bool = False,
    accept_parameters_as_arguments: bool = False,
) -> Dict[str, Any]:
    """
    从 assistant 的 content 中解析出 tool_calls，并返回新的消息结构。
    支持 Qwen 的 <tool_call>...<tool_call> 工具调用格式。

    Args:
        msg (dict): 原始 assistant 消息，包含 'content' 字段

    Returns:
        dict: 包含 'content' 和 'tool_calls' 的新消息结构
    """
    content = msg.get("content", "") or ""
    if not isinstance(content, str):
        content = str(content)

    if parser_mode == "llama31_official_fc":
        return parse_llama31_official_content_to_tool_calls(content, strict=strict)
    if parser_mode in {"toolace_fc", "toolace_official_prompt"}:
        return parse_toolace_content_to_tool_calls(
            content,
            strict=strict,
            reject_tool_call_with_content=reject_tool_call_with_content,
        )
    if parser_mode == "envtuning_fc":
        return parse_envtuning_content_to_tool_calls(content, strict=strict)

    tool_calls = []
    remaining_content = content
    call_id_counter = 1

    # 正则匹配 <tool_call> ... asdf ... asdf ...
    pattern = r'<tool_call>\s*\n?({.*?})\s*\n?\</tool_call>'
    matches = list(re.finditer(pattern, content, re.DOTALL))
    parse_errors: list[str] = []
    has_tool_tag = "<tool_call" in content or "</tool_call>" in content

    if not matches:
        result = {
            "role": "assistant",
            "content": content.strip(),
            "tool_calls": []
        }
        if strict and has_tool_tag:
            result["_bfcl_parse_error"] = (
                "Found tool_call tag text, but no valid <tool_call>{...}</tool_call> block."
            )
        return result

    # 提取所有匹配的 JSON 字符串
    for match in matches:
        json_str = match.group(1).strip()
        try:
            data = json.loads(json_str)
            if not isinstance(data, dict):
                continue
            if (
                accept_parameters_as_arguments
                and "arguments" not in data
                and "parameters" in data
            ):
                data["arguments"] = data["parameters"]
            if "name" not in data or "arguments" not in data:
                parse_errors.append("Tool call JSON must contain both 'name' and 'arguments'.")
                continue
            
            func_name = data["name"]
            arguments = data["arguments"]
            if strict:
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        parse_errors.append(
                            f"Tool '{func_name}' has non-JSON string arguments."
                        )
                        continue
                if not isinstance(arguments, dict):
                    parse_errors.append(
                        f"Tool '{func_name}' arguments must be a JSON object."
                    )
                    continue
            tool_call = {
                "id": f"{func_name}_{call_id_counter}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": arguments
                }
            }
            tool_calls.append(tool_call)
            call_id_counter += 1
        except json.JSONDecodeError as e:
            print(f"JSON 解析失败: {json_str[:50]}... -> {e}")
            literal_hint = ""
            if flag_python_literals and re.search(r"\b(True|False|None)\b", json_str):
                literal_hint = (
                    " (use JSON true/false/null, not Python True/False/None)"
                )
            parse_errors.append(f"Invalid tool call JSON{literal_hint}: {e}")
            continue

    # 移除所有 tool call 部分，得到纯文本 content
    cleaned_content = re.sub(pattern, '', content, flags=re.DOTALL).strip()
    # 可选：清理多余的空白
    cleaned_content = re.sub(r'\n\s*\n', '\n\n', cleaned_content).strip()
    if strict and reject_tool_call_with_content and cleaned_content:
        parse_errors.append(
            "Tool-call output must not include text outside <tool_call> blocks."
        )

    result = {
        "role": "assistant",
        "content": cleaned_content,
        "tool_calls": tool_calls
    }
    if strict and parse_errors:
        result["_bfcl_parse_error"] = "; ".join(parse_errors)

    return result


def _extract_single_xml_block(content: str, tag: str) -> tuple[str | None, list[str]]:
    pattern = rf"<{tag}>([\s\S]*?)</{tag}>"
    matches = re.findall(pattern, content, flags=re.DOTALL)
    if not matches:
        return None, []
    return matches[0].strip(), matches


def parse_envtuning_content_to_tool_calls(
    content: str, strict: bool = False
) -> Dict[str, Any]:
    """Parse EnvTuning-style BFCL responses.

    EnvTuning's multi-turn FC interaction asks the model to emit exactly one
    thinking block and then either a JSON tool payload inside <tool_call> tags
    or a final answer inside <answer> tags. This mode is kept separate from the
    BFCL ToolACE prompt-mode parser because it is an interaction protocol, not
    the official prompt-mode string parser.
    """
    raw = content.strip()
    think_body, think_matches = _extract_single_xml_block(raw, "think")
    tool_body, tool_matches = _extract_single_xml_block(raw, "tool_call")
    answer_body, answer_matches = _extract_single_xml_block(raw, "answer")

    parse_errors: list[str] = []
    if strict:
        if not think_matches:
            parse_errors.append("Missing <think></think> block.")
        if len(think_matches) > 1:
            parse_errors.append("Multiple <think></think> blocks found.")
        if len(tool_matches) > 1:
            parse_errors.append("Multiple <tool_call></tool_call> blocks found.")
        if len(answer_matches) > 1:
            parse_errors.append("Multiple <answer></answer> blocks found.")
        if tool_matches and answer_matches:
            parse_errors.append("Use either <tool_call> or <answer>, not both.")

    if tool_body is None:
        if answer_body is not None:
            result = {"role": "assistant", "content": answer_body, "tool_calls": []}
        else:
            result = {"role": "assistant", "content": raw, "tool_calls": []}
            if strict and ("<tool_call" in raw or "</tool_call>" in raw):
                parse_errors.append("Malformed <tool_call> block.")
        if strict and parse_errors:
            result["_bfcl_parse_error"] = "; ".join(parse_errors)
        return result

    try:
        payload = _loads_json_or_literal(_strip_json_code_fence(tool_body))
    except Exception as exc:
        result = {"role": "assistant", "content": raw, "tool_calls": []}
        if strict:
            parse_errors.append(f"Invalid JSON inside <tool_call>: {exc}")
            result["_bfcl_parse_error"] = "; ".join(parse_errors)
        return result

    entries = payload if isinstance(payload, list) else [payload]
    tool_calls: list[dict[str, Any]] = []
    call_id_counter = 1
    for entry in entries:
        if not isinstance(entry, dict):
            parse_errors.append("Tool call entry must be a JSON object.")
            continue
        func_name = entry.get("name") or entry.get("function")
        arguments = entry.get("arguments", entry.get("parameters", {}))
        if not isinstance(func_name, str) or not func_name.strip():
            parse_errors.append("Tool call JSON must contain a string 'name'.")
            continue
        if isinstance(arguments, str):
            try:
                arguments = _loads_json_or_literal(arguments)
            except Exception:
                parse_errors.append(f"Tool '{func_name}' has non-JSON string arguments.")
                arguments = {}
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            parse_errors.append(f"Tool '{func_name}' arguments must be a JSON object.")
            arguments = {}
        tool_calls.append(
            {
                "id": f"{func_name}_{call_id_counter}",
                "type": "function",
                "function": {
                    "name": func_name.strip(),
                    "arguments": arguments,
                },
            }
        )
        call_id_counter += 1

    result = {"role": "assistant", "content": think_body or "", "tool_calls": tool_calls}
    if strict and parse_errors:
        result["_bfcl_parse_error"] = "; ".join(parse_errors)
    return result


def _toolace_ast_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        prefix = _toolace_ast_name(node.value)
        return f"{prefix}.{node.attr}" if prefix else node.attr
    return None


def _toolace_literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except Exception:
        try:
            return ast.unparse(node)
        except Exception:
            return None


def _loads_toolace_jsonish_payload(content: str) -> Any:
    raw = _strip_json_code_fence(content).strip()
    candidates = [raw]
    if raw.startswith("{") and re.search(r"}\s*[,;]\s*{", raw):
        joined = re.sub(r"}\s*;\s*{", "}, {", raw)
        candidates.insert(0, f"[{joined}]")

    last_error: Exception | None = None
    for candidate in candidates:
        text = re.sub(
            r'((?:"name"|"function")\s*:\s*)([A-Za-z_][\w.]*)',
            lambda m: f'{m.group(1)}"{m.group(2)}"',
            candidate,
        )
        try:
            return _loads_json_or_literal(text)
        except Exception as exc:
            last_error = exc
        try:
            pythonish = re.sub(r"\btrue\b", "True", text)
            pythonish = re.sub(r"\bfalse\b", "False", pythonish)
            pythonish = re.sub(r"\bnull\b", "None", pythonish)
            return ast.literal_eval(pythonish)
        except Exception as exc:
            last_error = exc

    if last_error is not None:
        raise last_error
    raise ValueError("empty ToolACE JSON-style payload")


def _parse_toolace_jsonish_to_tool_calls(
    content: str, strict: bool = False
) -> Dict[str, Any] | None:
    stripped = content.strip()
    looks_jsonish = stripped.startswith("{") or stripped.startswith("[") or stripped.startswith("```")
    if not looks_jsonish:
        return None

    try:
        payload = _loads_toolace_jsonish_payload(stripped)
    except Exception as exc:
        result = {"role": "assistant", "content": content.strip(), "tool_calls": []}
        if strict:
            result["_bfcl_parse_error"] = f"Invalid ToolACE JSON-style function call: {exc}"
        return result

    entries = payload if isinstance(payload, list) else [payload]
    tool_calls: list[dict[str, Any]] = []
    parse_errors: list[str] = []
    call_id_counter = 1
    for entry in entries:
        if not isinstance(entry, dict):
            parse_errors.append("ToolACE JSON-style call entry must be an object.")
            continue
        func_name = entry.get("name") or entry.get("function")
        if not isinstance(func_name, str) or not func_name.strip():
            parse_errors.append("ToolACE JSON-style call must contain a string 'name'.")
            continue
        arguments = entry.get("parameters", entry.get("arguments", {}))
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = _loads_json_or_literal(arguments)
            except Exception:
                parse_errors.append(f"Tool '{func_name}' has non-JSON string parameters.")
                arguments = {}
        if not isinstance(arguments, dict):
            parse_errors.append(f"Tool '{func_name}' parameters must be an object.")
            arguments = {}
        tool_calls.append(
            {
                "id": f"{func_name}_{call_id_counter}",
                "type": "function",
                "function": {
                    "name": func_name.strip(),
                    "arguments": arguments,
                },
            }
        )
        call_id_counter += 1

    result = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    if strict and parse_errors:
        result["_bfcl_parse_error"] = "; ".join(parse_errors)
    return result


def _toolace_bracket_spans(content: str) -> list[tuple[int, int, str]]:
    spans: list[tuple[int, int, str]] = []
    depth = 0
    start: int | None = None
    in_string: str | None = None
    escape = False
    for idx, ch in enumerate(content):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == in_string:
                in_string = None
            continue
        if ch in {"'", '"'}:
            in_string = ch
            continue
        if ch == "[":
            if depth == 0:
                start = idx
            depth += 1
        elif ch == "]" and depth > 0:
            depth -= 1
            if depth == 0 and start is not None:
                snippet = content[start : idx + 1]
                if "(" in snippet and ")" in snippet:
                    spans.append((start, idx + 1, snippet))
                start = None
    return spans


def parse_toolace_content_to_tool_calls(
    content: str,
    strict: bool = False,
    reject_tool_call_with_content: bool = False,
) -> Dict[str, Any]:
    spans = _toolace_bracket_spans(content)
    if not spans:
        stripped = content.strip()
        if "<tool_call" in stripped or "</tool_call>" in stripped:
            result = {"role": "assistant", "content": stripped, "tool_calls": []}
            if strict:
                result["_bfcl_parse_error"] = (
                    "ToolACE BFCL prompt mode expects a Python function-call list, "
                    'e.g. [search(query="value")], not <tool_call> tags.'
                )
            return result
        if (
            re.match(r"^[A-Za-z_][\w.]*\s*\(", stripped)
            and stripped.endswith(")")
        ):
            spans = [(0, len(content), stripped)]
        else:
            jsonish_result = _parse_toolace_jsonish_to_tool_calls(content, strict=strict)
            if jsonish_result is not None:
                return jsonish_result
            if stripped.startswith("[") or stripped.endswith("]"):
                return {
                    "role": "assistant",
                    "content": content.strip(),
                    "tool_calls": [],
                    "_bfcl_parse_error": "Invalid ToolACE function-call list.",
                }
            return {"role": "assistant", "content": content.strip(), "tool_calls": []}

    tool_calls: list[dict[str, Any]] = []
    parse_errors: list[str] = []
    call_id_counter = 1
    consumed: list[tuple[int, int]] = []

    for start, end, snippet in spans:
        try:
            parsed = ast.parse(snippet, mode="eval")
        except SyntaxError as e:
            parse_errors.append(f"Invalid ToolACE function-call syntax: {e.msg}")
            continue
        body = parsed.body
        if isinstance(body, (ast.List, ast.Tuple)):
            elements = body.elts
        elif isinstance(body, ast.Call):
            elements = [body]
        else:
            parse_errors.append("ToolACE output must be a list of function calls.")
            continue
        consumed.append((start, end))
        for call in elements:
            if not isinstance(call, ast.Call):
                parse_errors.append("ToolACE list contains a non-call item.")
                continue
            func_name = _toolace_ast_name(call.func)
            if not func_name:
                parse_errors.append("ToolACE call has an invalid function name.")
                continue
            if strict and call.args:
                parse_errors.append(f"Tool '{func_name}' uses positional arguments.")
                continue
            arguments: dict[str, Any] = {}
            for kw in call.keywords:
                if kw.arg is None:
                    parse_errors.append(f"Tool '{func_name}' uses unsupported **kwargs.")
                    continue
                arguments[kw.arg] = _toolace_literal(kw.value)
            tool_calls.append(
                {
                    "id": f"{func_name}_{call_id_counter}",
                    "type": "function",
                    "function": {
                        "name": func_name,
                        "arguments": arguments,
                    },
                }
            )
            call_id_counter += 1

    cleaned = content
    for start, end in reversed(consumed):
        cleaned = cleaned[:start] + cleaned[end:]
    cleaned = re.sub(r"\n\s*\n", "\n\n", cleaned).strip()
    if strict and reject_tool_call_with_content and tool_calls and cleaned:
        parse_errors.append(
            "ToolACE output must not include text outside the function-call list."
        )

    result = {"role": "assistant", "content": cleaned, "tool_calls": tool_calls}
    if strict and parse_errors:
        result["_bfcl_parse_error"] = "; ".join(parse_errors)
    return result


def tools_schema_to_llama31_official_prompt(
    tools_schema: List[Dict[str, Any]],
    user_query: str,
    extra_instructions: List[str] | None = None,
) -> str:
    lines = [
        "Given the following functions, please respond with a JSON for a function call "
        "with its proper arguments that best answers the given prompt.",
        "",
        'For one function call, respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.',
        'If multiple function calls are needed in the same turn, respond with one raw JSON list of those objects, for example [{"name": "func1", "parameters": {...}}, {"name": "func2", "parameters": {...}}].',
        "Do not use variables.",
        "Return only raw JSON for function calls; do not wrap the JSON in <tool_call> tags.",
        "Do not emit several standalone JSON objects on separate lines; use a JSON list for multiple calls.",
        "If no function can be used, or required parameters are missing, answer briefly in plain text.",
        "",
    ]
    for tool in tools_schema:
        lines.append(json.dumps(tool, ensure_ascii=False, indent=4))
        lines.append("")
    extras = [str(item).strip() for item in (extra_instructions or []) if str(item).strip()]
    if extras:
        lines.extend(extras)
        lines.append("")
    lines.append(user_query.strip())
    return "\n".join(lines).strip()


def tools_schema_to_toolace_official_prompt(
    tools_schema: List[Dict[str, Any]],
) -> str:
    """BFCL official prompt-mode interface used for ToolACE/watt Llama models.

    ToolACE/watt expects the key "arguments" (not "parameters") in each function
    definition.  BFCL's internal schema uses "parameters", so we rename it here
    before serialising to the system-prompt.
    """
    converted = []
    for tool in tools_schema:
        # Support both bare-function dicts and OpenAI {"type": "function", "function": {...}} wrappers.
        func = tool.get("function", tool)
        entry: Dict[str, Any] = {
            "name": func.get("name", ""),
            "description": func.get("description", ""),
        }
        # Rename "parameters" → "arguments" as expected by ToolACE/watt models.
        params = func.get("parameters") or func.get("arguments")
        if params is not None:
            entry["arguments"] = params
        converted.append(entry)
    function_docs = json.dumps(converted, ensure_ascii=False, indent=4)
    return (
        "You are an expert in composing functions. You are given a question and a "
        "set of possible functions. Based on the question, you will need to make "
        "one or more function/tool calls to achieve the purpose.\n"
        "If none of the functions can be used, point it out. If the given question "
        "lacks the parameters required by the function, also point it out.\n"
        "You should only return the function calls in your response.\n\n"
        "If you decide to invoke any of the function(s), you MUST put it in the "
        "format of [func_name1(params_name1=params_value1, "
        "params_name2=params_value2...), func_name2(params)].\n"
        "You SHOULD NOT include any other text in the response.\n\n"
        "Here is a list of functions in JSON format that you can invoke.\n"
        f"{function_docs}\n"
    )



def tool_message_to_qwen_text(tool_messages, result_mode: str = "bfcl_tool_response"):
    """
    将 role 为 'tool' 的消息列表转换为符合 Qwen chat_template 格式的字符串。
    支持单个或多个连续的 tool 消息。

    Args:
        tool_messages (list or dict): 一个或多个 tool 消息字典

    Returns:
        str: 符合 Qwen 模板的文本表示，包含 <|im_start|>user ... <|im_end|>
    """
    if isinstance(tool_messages, dict):
        tool_messages = [tool_messages]

    if not tool_messages:
        return ""

    # AgentEvolver feeds tool observations back as user-role text. The
    # bfcl_tool_response branch mirrors BFCL QwenFCHandler's tool rendering.
    tool_entries = []
    for msg in tool_messages:
        if msg.get("role") != "tool":
            raise ValueError("All messages must have role 'tool'")

        content = msg.get("content", "")
        tool_call_id = msg.get("tool_call_id", "")
        # NOTICE: yunpeng - bfcl 不返回toolname，用id代替
        name = msg.get("name", tool_call_id)  # 工具名称 

        if not name:
            raise ValueError("Missing 'name' in tool message.")

        if result_mode == "bfcl_tool_response":
            if isinstance(content, str):
                content_text = content
            else:
                content_text = json.dumps(content, ensure_ascii=False)
            tool_entries.append(f"<tool_response>\n{content_text}\n</tool_response>")
            continue
        if result_mode == "llama31_official":
            if isinstance(content, str):
                content_text = content
            else:
                content_text = json.dumps(content, ensure_ascii=False)
            tool_entries.append(content_text)
            continue
        if result_mode == "toolace_official_prompt":
            # vLLM's ToolACE chat template renders tool/ipython messages as a
            # JSON object.  For string observations it emits
            # {"output": message.content}; for mapping observations it emits the
            # mapping directly.  Matching that surface keeps Llama/ToolACE from
            # seeing a quoted JSON string as the whole tool result.
            if isinstance(content, dict):
                tool_entries.append(json.dumps(content, ensure_ascii=False))
            else:
                tool_entries.append(
                    json.dumps({"output": str(content)}, ensure_ascii=False)
                )
            continue
        if result_mode == "envtuning_fc":
            if isinstance(content, str):
                try:
                    content_obj = json.loads(content)
                except Exception:
                    content_obj = content
            else:
                content_obj = content
            response_content = json.dumps(content_obj, ensure_ascii=False)
            tool_entries.append(
                "Here are the function's execution results. "
                f"Execution results:{response_content}\n "
                "If you believe you have already fulfilled the user's request, "
                "please first outline your thought process in a <think></think> "
                "pair, and then give a brief summary of the result in an "
                "<answer></answer> pair. Otherwise, you should continue to call "
                "until fulfilling user's request."
            )
            continue

        # 确保 content 是 JSON 可序列化对象
        try:
            if isinstance(content, str):
                parsed_content = json.loads(content) if content.strip().startswith(('{', '[')) else content
            else:
                parsed_content = content
        except Exception:
            parsed_content = content

        # 构造工具返回的标准结构：{"name": "...", "content": ...}
        entry = {
            "name": name,
            "content": parsed_content
        }
        if result_mode == "plain_user":
            if isinstance(parsed_content, str):
                content_text = parsed_content
            else:
                content_text = json.dumps(parsed_content, ensure_ascii=False)
            tool_entries.append(f"Tool result from {name}:\n{content_text}")
        else:
            tool_entries.append(f'<tool_call>\n{json.dumps(entry, ensure_ascii=False)}\n</tool_call>')

    # 合并所有 tool entry，用换行连接
    inner_text = "\n".join(tool_entries) + "\n"

    return inner_text
