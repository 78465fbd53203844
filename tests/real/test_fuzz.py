"""Hostile model output, property-based: >= 10,000 generated messages through the parser, the dispatcher and
the diagnosis. Nothing outside the tools visible this turn runs, nothing crashes, every case gets a label.

Messages mix free text, Qwen-style <tool_call> JSON blocks, BFCL python-call lists and the Llama-family raw JSON
calls; names include hidden tools, private methods and builtins; values include injection payloads; some inputs are
huge or nested thousands of levels deep. Every parser reads every kind of message (strict, lenient, toolace,
llama3.1). The entry is multi_turn_miss_func_0 at turn 0, where `sort` exists but is hidden.
"""

import builtins
import gc
import json
import os
import string
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seal_lite.core.calls import parse_calls
from seal_lite.core.labels import BASE_UTILITY
from seal_lite.core.types import NO_SUCH_FUNCTION_CALL, REJECTED, TurnRecord
from seal_lite.envs.bfcl import episode, load_tasks
from seal_lite.step.verifier import diagnose_episode

EXAMPLES = int(os.environ.get("SEAL_LITE_FUZZ_EXAMPLES", "10000"))
TASK = load_tasks(["multi_turn_miss_func_0"])[0].truncated(1)
VISIBLE = {doc["name"] for doc in TASK.visible_functions(0)}
ALL_METHODS = set(episode(TASK).tool_names)  # every tool of the task, visible or held out
HIDDEN = {doc["name"] for docs in TASK.revealed.values() for doc in docs}
API_SOURCE = str(Path(sys.modules[type(episode(TASK).instances["GorillaFileSystem"]).__module__].__file__).parent)
FORBIDDEN = {builtins.eval, builtins.exec, builtins.open, builtins.breakpoint, os.system, os.popen, subprocess.Popen}
MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / f"seal-lite-fuzz-{os.getpid()}"
PAYLOADS = [
    f"__import__('os').system('touch {MARKER}')",
    f"exec(\"open('{MARKER}', 'w')\")",
    f"eval(\"__import__('os').system('touch {MARKER}')\")",
    "globals()['__builtins__']",
    "().__class__.__base__.__subclasses__()",
    "lambda: 1",
    "[x for x in range(10**9)]",
    "10**10**10",
    "{'a': 1} | {'b': 2}",
]

IDENTIFIER_CHARS = string.ascii_letters + string.digits + "_"
names = st.one_of(
    st.sampled_from(sorted(VISIBLE)),
    st.sampled_from(sorted(HIDDEN) + ["eval", "exec", "open", "__import__", "getattr", "globals", "compile",
                                      "_load_scenario", "__init__", "__class__", "os.system", "seal_lite_refused_call",
                                      "execute_multi_turn_func_call", "print", "kill", "exit"]),
    st.text(IDENTIFIER_CHARS + ".", min_size=1, max_size=30),
    st.text(max_size=20),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
    | st.sampled_from(PAYLOADS),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=6,
)
argument_names = st.one_of(st.sampled_from(["folder", "file_name", "dir_name", "a", "source", "destination", "pattern"]),
                           st.text(IDENTIFIER_CHARS, min_size=1, max_size=10), st.text(max_size=8))


@st.composite
def python_call(draw):
    arguments = draw(st.lists(st.tuples(argument_names, st.one_of(json_values.map(repr), st.sampled_from(PAYLOADS))),
                              max_size=4))
    positional = draw(st.lists(st.one_of(json_values.map(repr), st.sampled_from(PAYLOADS)), max_size=2))
    return f"{draw(names)}({', '.join(positional + [f'{key}={value}' for key, value in arguments])})"


@st.composite
def tool_call_block(draw):
    payload = {"name": draw(names), "arguments": draw(st.dictionaries(argument_names, json_values, max_size=4))}
    if draw(st.booleans()):
        payload["arguments"] = json.dumps(payload["arguments"])  # double-encoded, as some models do
    text = json.dumps(payload)
    if draw(st.booleans()):  # cut anywhere, as a token budget does
        text = text[: draw(st.integers(0, len(text)))]
    return f"<tool_call>{text}</tool_call>"


@st.composite
def json_calls(draw):
    """Llama 3.1's raw JSON: one object, a list, or objects one per line, maybe fenced, cut or python-tagged."""
    key = draw(st.sampled_from(["parameters", "arguments"]))
    entries = draw(st.lists(st.fixed_dictionaries({"name": names, key: st.dictionaries(argument_names, json_values,
                                                                                        max_size=4)}),
                            min_size=1, max_size=3))
    text = draw(st.sampled_from([json.dumps(entries[0]), json.dumps(entries),
                                 "\n".join(json.dumps(entry) for entry in entries), repr(entries)]))
    if draw(st.booleans()):  # cut anywhere, as a token budget does
        text = text[: draw(st.integers(0, len(text)))]
    return draw(st.sampled_from(["", "<|python_tag|>", "```json\n"])) + text


deep = st.integers(1, 5000).flatmap(lambda depth: st.sampled_from([
    "[ls(a=" + "[" * depth + "]" * depth + ")]",
    "[" * depth + "ls()" + "]" * depth,
    '<tool_call>{"name": "ls", "arguments": ' + '{"a": ' * depth + "1" + "}" * depth + "}</tool_call>",
    "[cd(folder=" + "(" * depth + "'x'" + ")" * depth + ")]",
    '{"name": "ls", "parameters": ' + '{"a": ' * depth + "1" + "}" * depth + "}",
    "[" + "a." * depth + "ls()]",
]))
huge = st.sampled_from(["[ls(a='" + "x" * 19_900 + "')]", "x" * 25_000, "[ls()]" * 5000, "<tool_call>" * 3000])
messages = st.one_of(
    st.text(max_size=200),
    st.lists(python_call(), min_size=1, max_size=4).map(lambda calls: "[" + ", ".join(calls) + "]"),
    python_call(),
    st.lists(tool_call_block(), min_size=1, max_size=3).map("\n".join),
    st.tuples(st.text(max_size=50), python_call()).map(lambda parts: f"{parts[0]}\n```python\n[{parts[1]}]\n```"),
    st.sampled_from(PAYLOADS).map(lambda payload: f"[{payload}]"),
    json_calls(),
    deep,
    huge,
)


class CallWatcher:
    """Records every entry into the BFCL API code from outside it, and any call of a forbidden builtin."""

    def __init__(self):
        self.entries, self.forbidden = [], []

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(API_SOURCE):
            caller = frame.f_back
            if caller is not None and not caller.f_code.co_filename.startswith(API_SOURCE):
                self.entries.append(frame.f_code.co_name)
        elif event == "c_call" and arg in FORBIDDEN:
            self.forbidden.append(arg)


seen = []


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(messages, st.sampled_from(["strict", "lenient", "toolace", "llama3.1"]))
def check_one_message(text, parser):
    seen.append(text)
    env = episode(TASK)
    watcher = CallWatcher()
    sys.setprofile(watcher)
    try:
        outcomes = env.run(text, 0, parser)
    finally:
        sys.setprofile(None)
    assert watcher.forbidden == []
    assert set(watcher.entries) <= VISIBLE - {"__init__"}, watcher.entries
    for outcome in outcomes:
        if outcome.executed:  # what bfcl-eval's checker will evaluate: a literal-only call of a visible tool
            assert outcome.call.name in VISIBLE
            assert parse_calls(outcome.checker_call).calls == [outcome.call]
        else:  # nothing, or for a function the task does not have the fixed placeholder: never the model's text
            assert outcome.status in REJECTED
            assert outcome.checker_call == (NO_SUCH_FUNCTION_CALL if not outcome.exists else None)
            assert outcome.call is None or outcome.exists == (outcome.call.name in ALL_METHODS)
    record = TurnRecord(TASK.user_message(0), [outcomes] if outcomes else [])
    diagnosis = diagnose_episode(TASK, [record])
    assert len(diagnosis.labels) == 1 and diagnosis.labels[0] in BASE_UTILITY


def test_hostile_messages_run_nothing_outside_the_visible_tools():
    # The collector runs whenever allocations say so, also while a deeply nested message is parsed near the recursion
    # limit; a finalizer it calls there fails, and that failure cannot even be reported (pytest's unraisable hook
    # overflows the stack too). Cycles are collected before and after instead.
    gc.collect()
    gc.disable()
    try:
        check_one_message()
    finally:
        gc.enable()
        gc.collect()
    assert len(seen) >= EXAMPLES and len(set(seen)) >= 0.9 * EXAMPLES
    assert not MARKER.exists()


def test_the_watcher_sees_tool_entries_and_forbidden_builtins():
    env, watcher = episode(load_tasks(["multi_turn_miss_func_0"])[0]), CallWatcher()
    sys.setprofile(watcher)
    try:
        env.run("[sort(file_name='final_report.pdf')]", 0)  # hidden at turn 0: refused
        env.run("[sort(file_name='final_report.pdf')]", 3)  # revealed at turn 3: runs
        eval("1")
    finally:
        sys.setprofile(None)
    assert watcher.entries == ["sort"] and watcher.forbidden == [builtins.eval]
