"""The Llama-family formats (seal_lite/core/llama_formats.py, ``rollout.parser`` toolace and llama3.1) on worked
cases: what each parser reads, refuses and leaves as an answer; where each puts the tools, the training interface's
lines and the tool results; and how a recipe, an evaluation and a stored interface carry the format.
tests/unit/test_release_formats.py holds them against the release's own functions."""

import json

import pytest

from seal_lite.core.calls import ToolCall, call_format, evaluation_parser, parse_calls
from seal_lite.core.errors import ConfigError
from seal_lite.core.interface import (
    SCHEMA_CUE_LINE,
    TrainingInterface,
    describe_version,
    interface_from_version,
    observation,
    observation_role,
    recovery_feedback,
    render_view,
)
from seal_lite.core.llama_formats import LLAMA31, LLAMA31_SYSTEM_PROMPT, TOOLACE, TOOLACE_INSTRUCTIONS
from seal_lite.core.recipe import RecipeError, load_recipe
from seal_lite.core.types import CallStatus
from seal_lite.envs.bfcl import episode, load_tasks
from seal_lite.runs.evaluate_bfcl import evaluation_rollout

DOCS = [{"name": "cd", "description": "Change directory.",
         "parameters": {"type": "dict", "properties": {"folder": {"type": "string", "description": "Where."}},
                        "required": ["folder"]}, "response": {"type": "dict"}}]


def calls(text: str, parser: str) -> list[ToolCall]:
    parsed = parse_calls(text, parser)
    assert parsed.errors == [], parsed.errors
    return parsed.calls


def error(text: str, parser: str) -> str:
    parsed = parse_calls(text, parser)
    assert parsed.calls == [] and len(parsed.errors) == 1, parsed
    return parsed.errors[0]


# ---- toolace: python call lists -------------------------------------------------------------------------------

def test_toolace_reads_call_lists_bare_calls_and_lists_inside_text():
    assert calls("[cd(folder='doc'), ls(a=True)]", TOOLACE) == [ToolCall("cd", {"folder": "doc"}), ToolCall("ls", {"a": True})]
    assert calls('mkdir(dir_name="x")', TOOLACE) == [ToolCall("mkdir", {"dir_name": "x"})]
    assert calls("```python\n[ls()]\n```", TOOLACE) == [ToolCall("ls", {})]
    assert calls("Sure. [ls()] That lists it.", TOOLACE) == [ToolCall("ls", {})]  # text around a list: the release's default
    assert calls("[echo(content=[1, (2, 3)], file_name=None)]", TOOLACE) == [
        ToolCall("echo", {"content": [1, [2, 3]], "file_name": None})]  # a tuple becomes a list


def test_toolace_keeps_a_value_that_is_no_literal_as_its_source_text():
    """As the release: the text is a string value, nothing is evaluated."""
    assert calls("[cd(folder=os.getcwd())]", TOOLACE) == [ToolCall("cd", {"folder": "os.getcwd()"})]


def test_toolace_reads_json_style_calls_as_the_release_does():
    assert calls('{"name": "cd", "parameters": {"folder": "x"}}', TOOLACE) == [ToolCall("cd", {"folder": "x"})]
    assert calls('{"name": ls, "parameters": {}}', TOOLACE) == [ToolCall("ls", {})]  # a bare name is quoted
    assert calls('{"name": "ls", "arguments": {"a": true}}; {"name": "pwd"}', TOOLACE) == [
        ToolCall("ls", {"a": True}), ToolCall("pwd", {})]


def test_toolace_refuses_what_the_release_refuses_with_its_words():
    assert error("[cd('x')]", TOOLACE) == "Tool 'cd' uses positional arguments."
    assert error("[cd(**{'folder': 'x'})]", TOOLACE) == "Tool 'cd' uses unsupported **kwargs."
    assert error("[cd(folder='x'), 3]", TOOLACE) == "ToolACE list contains a non-call item."
    assert error("[f(x) for x in y]", TOOLACE) == "ToolACE output must be a list of function calls."
    assert error("[cd(folder='x'", TOOLACE).startswith("Invalid ToolACE JSON-style function call:")
    assert error("[cd(folder='x')) ]", TOOLACE).startswith("Invalid ToolACE function-call syntax:")
    assert error('<tool_call>{"name": "cd"}</tool_call>', TOOLACE).endswith("not <tool_call> tags.")
    assert error("See the list [1]", TOOLACE) == "Invalid ToolACE function-call list."  # text that ends in "]"


def test_toolace_guards_names_and_values_the_release_would_pass_on():
    assert error("[os.system(command='ls')]", TOOLACE) == "invalid tool name 'os.system'"
    assert error("[cd(folder={1, 2})]", TOOLACE) == "cd: unsupported argument type set"
    assert error("[_load_scenario(config={})]", TOOLACE) == "invalid tool name '_load_scenario'"


def test_toolace_answers_and_hostile_text_never_raise():
    assert parse_calls("The folder is empty.", TOOLACE).calls == parse_calls("", TOOLACE).errors == []
    for text in ["[ls(a='\0')]", "[" + "a." * 3000 + "b()]", "[" * 5000 + "ls()" + "]" * 5000,
                 "[ls(a=" + "[" * 900 + "]" * 900 + ")]"]:
        assert parse_calls(text, TOOLACE).errors, text[:40]


# ---- llama3.1: raw JSON -------------------------------------------------------------------------------------

def test_llama31_reads_one_object_a_list_or_objects_in_a_row():
    one = ToolCall("cd", {"folder": "x"})
    assert calls('{"name": "cd", "parameters": {"folder": "x"}}', LLAMA31) == [one]
    assert calls('[{"name": "cd", "parameters": {"folder": "x"}}, {"name": "ls", "parameters": {}}]', LLAMA31) == [
        one, ToolCall("ls", {})]
    assert calls('{"name": "cd", "parameters": {"folder": "x"}}\n{"name": "ls", "parameters": {}}', LLAMA31) == [
        one, ToolCall("ls", {})]
    assert calls('<|python_tag|>{"function": "cd", "arguments": "{\\"folder\\": \\"x\\"}"}', LLAMA31) == [one]
    assert calls("```json\n{'name': 'ls', 'parameters': {'a': True}}\n```", LLAMA31) == [ToolCall("ls", {"a": True})]


def test_llama31_refuses_what_the_release_refuses_with_its_words():
    assert error('{"name": "cd"}', LLAMA31) == "Function call JSON must contain a 'parameters' object."
    assert error('{"parameters": {}}', LLAMA31) == "Function call JSON must contain a 'name' key."
    assert error('{"name": "cd", "parameters": [1]}', LLAMA31) == "Tool 'cd' parameters must be a JSON object."
    assert error("[1]", LLAMA31) == "Function call entry must be a JSON object."
    assert error('{"name": "cd", "parameters": {', LLAMA31) == (
        "Invalid Llama-3.1 JSON function call: incomplete raw JSON function call")
    assert error("42", LLAMA31) == "Function call entry must be a JSON object."  # a bare literal, as the release reads it
    assert error('<tool_call>{"name": "cd"}</tool_call>', LLAMA31).endswith("not <tool_call> XML tags.")
    assert error('{"name": "cd", "parameters": {"folder": NaN}}', LLAMA31) == "cd: non-finite number"  # seal-lite's guard


def test_llama31_answers_are_text_that_does_not_start_like_json():
    for text in ["The folder is empty.", "", "  \n", "[]"]:
        assert parse_calls(text, LLAMA31).calls == parse_calls(text, LLAMA31).errors == []


def test_a_strict_format_rejects_the_whole_message_for_a_hidden_tool():
    task = load_tasks(["multi_turn_miss_func_0"])[0]  # sort is held out at turn 0
    for parser, text in ((TOOLACE, "[ls(), sort(file_name='a')]"),
                         (LLAMA31, '[{"name": "ls", "parameters": {}}, {"name": "sort", "parameters": {"file_name": "a"}}]')):
        outcomes = episode(task).run(text, 0, parser)
        assert [o.status for o in outcomes] == [CallStatus.REJECTED, CallStatus.UNKNOWN_TOOL], parser


# ---- prompts, results, hints -----------------------------------------------------------------------------------

def test_toolace_puts_its_tool_list_and_the_interfaces_lines_in_the_system_message():
    view = render_view(DOCS, TrainingInterface(schema_cues=True, guidelines=("Check.",), call_format=TOOLACE))
    prompt, cue, guidelines = view.system_prompt.split("\n\n\n")[0], *view.system_prompt.rsplit("\n\n", 2)[1:]
    assert prompt.startswith(TOOLACE_INSTRUCTIONS)
    [doc] = json.loads(prompt.removeprefix(TOOLACE_INSTRUCTIONS))
    assert list(doc) == ["name", "description", "arguments"] and "[required]" in json.dumps(doc)
    assert cue == SCHEMA_CUE_LINE and guidelines.endswith("- Check.")
    assert view.first_user_message("Go to x.") == "Go to x."


def test_llama31_puts_its_tools_and_the_interfaces_lines_before_the_first_question():
    view = render_view(DOCS, TrainingInterface(schema_cues=True, call_format=LLAMA31))
    assert view.system_prompt == LLAMA31_SYSTEM_PROMPT
    message = view.first_user_message("  Go to x.\n")
    assert message.startswith("Given the following functions") and message.endswith(
        f"{json.dumps(view.tools[0], indent=4)}\n\n{SCHEMA_CUE_LINE}\n\nGo to x.")


def test_results_come_back_in_the_formats_own_wrapping_under_the_ipython_role():
    results = [(CallStatus.OK, '{"a": 1}'), (CallStatus.TOOL_ERROR, "Error during execution: no")]
    toolace, llama = TrainingInterface(call_format=TOOLACE), TrainingInterface(call_format=LLAMA31)
    assert observation(results, toolace, ["cd"]) == '{"output": "{\\"a\\": 1}"}\n{"output": "Error during execution: no"}'
    assert observation(results, llama, ["cd"]) == '{"a": 1}\nError during execution: no'
    statuses = [status for status, _ in results]
    assert observation_role(statuses, toolace) == observation_role(statuses, llama) == "ipython"
    assert observation_role(statuses, TrainingInterface()) == "user"  # Qwen's results are a user message
    assert observation_role([CallStatus.PARSE_ERROR], toolace) == "user"  # a rejection is the service's [ERROR]


def test_a_parse_errors_hint_shows_the_formats_own_syntax():
    toolace, llama = (recovery_feedback(CallStatus.PARSE_ERROR, "", ["cd", "ls"], fmt) for fmt in (TOOLACE, LLAMA31))
    assert toolace.startswith("Write the calls as one Python list, [tool_name(") and "cd, ls" in toolace
    assert llama.startswith('Write a call as raw JSON, {"name": "tool_name", "parameters": {...}}')
    assert "<tool_call>" in recovery_feedback(CallStatus.PARSE_ERROR, "", ["cd"])  # Qwen's, unchanged


# ---- recipes, evaluation, stored versions ---------------------------------------------------------------------

def test_a_parser_names_its_call_format_and_evaluation_keeps_a_llama_format():
    assert [call_format(parser) for parser in ("strict", "lenient", TOOLACE, LLAMA31)] == ["qwen", "qwen", TOOLACE, LLAMA31]
    assert [evaluation_parser(parser) for parser in ("strict", "lenient", TOOLACE, LLAMA31)] == [
        "strict", "strict", TOOLACE, LLAMA31]
    rollout = load_recipe(None, {"rollout.parser": TOOLACE, "interface.tool_format": "official"}).rollout
    assert evaluation_rollout(rollout).parser == TOOLACE


def test_the_signatures_view_is_refused_in_a_llama_format():
    with pytest.raises(RecipeError, match="interface.tool_format = 'signatures': .* set interface.tool_format official"):
        load_recipe(None, {"rollout.parser": LLAMA31})  # the default tool format is signatures
    with pytest.raises(ConfigError, match="use the official tool format"):
        TrainingInterface(tool_format="signatures", call_format=TOOLACE)


def test_a_stored_interface_version_keeps_its_call_format():
    row = {"version": 1, "guidelines": [], "components": {"schema_cues": True, "recovery_feedback": False,
                                                           "tool_format": "official", "call_format": TOOLACE}}
    assert interface_from_version(row).call_format == TOOLACE
    assert describe_version(row).endswith("call format: toolace")
    row["components"].pop("call_format")  # a run stored before the formats existed was Qwen's
    assert interface_from_version(row).call_format == "qwen" and "call format" not in describe_version(row)
