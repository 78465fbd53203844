"""Parsing a model's message into tool calls (seal_lite/core/calls.py): Qwen-style <tool_call> blocks, BFCL
python-call lists, plain text, malformed or cut-off calls as failed calls (never exceptions), hostile values
round-tripping, and deep JSON refused before the decoder recurses."""

import json

from seal_lite.core.calls import MAX_CALL_TEXT_CHARS, ToolCall, parse_calls


def test_qwen_style_blocks():
    text = 'ok <tool_call>{"name": "cd", "arguments": {"folder": "doc"}}</tool_call>\n<tool_call>{"name": "ls", "arguments": "{}"}</tool_call>'
    parsed = parse_calls(text)
    assert parsed.calls == [ToolCall("cd", {"folder": "doc"}), ToolCall("ls", {})]
    assert parsed.errors == []


def test_python_call_list_and_fence():
    parsed = parse_calls("```python\n[cd(folder='doc'), sort('a.txt'), wc(file_name='a', mode=\"l\")]\n```")
    assert [c.name for c in parsed.calls] == ["cd", "sort", "wc"]
    assert parsed.calls[1].positional == ("a.txt",)
    assert parsed.calls[2].to_python() == "wc(file_name='a', mode='l')"


def test_plain_text_is_no_call():
    assert parse_calls("The directory was created.").calls == []
    assert parse_calls("The directory was created.").errors == []


def test_malformed_calls_become_errors_not_exceptions():
    for text in ['<tool_call>{"name": "cd", </tool_call>', "<tool_call>[1, 2]</tool_call>",
                 "[cd(folder=open('x'))]", "[os.system('ls')]", "[f(**{'a': 1})]", "x" * (MAX_CALL_TEXT_CHARS + 1),
                 '<tool_call>{"name": "__import__", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "cd", "arguments": {"x": NaN}}</tool_call>',
                 "[f(a=" + "[" * 5000 + "]" * 5000 + ")]", "[f(a=" + "[" * 50 + "]" * 50 + ")]"]:
        parsed = parse_calls(text)
        assert parsed.calls == [] and parsed.errors, text[:60]
    assert parse_calls("[" * 5000 + "f()" + "]" * 5000).calls == []  # not a call list: plain text, no crash


def test_canonical_string_round_trips_hostile_values():
    value = "'); __import__('os').system('touch /tmp/x') #\n\"\\"
    call = ToolCall("echo", {"content": value, "n": [1, 2.5, None, True, {"k": "v"}]})
    again = parse_calls("[" + call.to_python() + "]").calls[0]
    assert again == call


def test_a_call_cut_off_mid_way_is_a_failed_call_not_prose():
    for text in ["[mkdir(dir_name='temp'", "cd(folder='x') and then ls()", "```python\n[ls(a=True)\n```"]:
        parsed = parse_calls(text)
        assert parsed.calls == [] and parsed.errors, text
    assert parse_calls("Note (see above): nothing to do.").errors == []


def test_deep_json_is_refused_before_the_decoder_recurses():
    deep = '{"a": ' * 2000 + "1" + "}" * 2000
    direct = parse_calls(f'<tool_call>{{"name": "ls", "arguments": {deep}}}</tool_call>')
    assert direct.calls == [] and direct.errors == ["tool_call block is not valid JSON: nested deeper than 20"]
    encoded = parse_calls(f'<tool_call>{{"name": "ls", "arguments": {json.dumps(deep)}}}</tool_call>')
    assert encoded.calls == [] and encoded.errors == ["arguments string is not valid JSON"]
    brackets_in_strings = '<tool_call>{"name": "ls", "arguments": {"a": "[[[[{{{{\\" ]]"}}</tool_call>'
    assert parse_calls(brackets_in_strings).calls[0].arguments == {"a": '[[[[{{{{" ]]'}
