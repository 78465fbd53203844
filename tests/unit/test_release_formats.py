"""seal-lite's tool-call formats against the SEAL release's own functions (tests/support/release_parsers.py, vendored
verbatim): the parsers on a corpus of model outputs, the prompts on every BFCL multi-turn entry, the tool results.

The corpus: valid calls in each form (one, several, nested and odd values, code fences, text around them), the
same calls cut off and with a character dropped or added, and hand-written cases (malformed JSON, python syntax
errors, positional and ** arguments, non-literal values, unknown forms, plain answers, empty strings, hostile and
huge inputs). Every item goes through all three pairs: strict and the release's xml_json, toolace and
toolace_official_prompt, llama3.1 and llama31_official_fc, all with ``strict=True``.

Agreement is on what the environment does with the message: it runs the same calls (same names, same arguments),
or it is an answer, or it is refused as naming a tool the turn does not show, or it is a parse error with the same
text (the Llama-family formats; strict's texts were never the point). Three differences are allowed, each checked
for what it is (docs/deviations.md D19):
* ``guard``: the release accepts a call that seal-lite's guards refuse (a tool or argument name that is no plain
  identifier, a value that is not JSON-like, nesting deeper than 20); seal-lite rejects the message whole.
* ``release raises``: the release's parser raises (an integer too long to convert, a null byte); seal-lite rejects.
* ``too long``: over 20,000 characters, which seal-lite rejects before parsing.
"""

from __future__ import annotations

import json
import keyword
import math
import random
import re
from collections import Counter

import pytest

from seal_lite.core.calls import MAX_CALL_TEXT_CHARS, MAX_VALUE_DEPTH, parse_calls
from seal_lite.core.interface import TrainingInterface, apply_schema_cues, observation, render_view
from seal_lite.core.llama_formats import LLAMA31, TOOLACE
from seal_lite.core.types import CallStatus
from seal_lite.envs.bfcl import CATEGORIES, load_tasks, split_ids
from tests.support import release_parsers as release

PAIRS = {"strict": "xml_json", TOOLACE: "toolace_official_prompt", LLAMA31: "llama31_official_fc"}
TOOLS = ["cd", "ls", "mkdir", "touch", "echo", "cat", "mv", "grep", "sort", "wc", "post_tweet", "get_stock_info",
         "fillFuelTank", "startEngine", "send_message", "book_flight", "create_ticket", "get_watchlist"]
ODD_NAMES = ["unknown_tool", "os.system", "_load_scenario", "__import__", "class", "2fast", "a-b", "ls ", "self.cd",
             "print", "café"]
STRINGS = ["doc", "report.txt", "it's", 'say "hi"', "a\\b", "line1\nline2", "café ☕", "[x]", "{y}", "(z)", "a; b, c",
           "", " ", "True", "null", "</tool_call>", "x=1", "']", "```"]
ARGUMENT_NAMES = ["folder", "file_name", "content", "mode", "a", "count", "query", "dir_name"]

HAND_WRITTEN = [
    # answers and unknown forms
    "", "   ", "\n", "Done.", "The file was moved (see above).", "Result: [1, 2]", "I cannot do that]", "None", "true",
    "42", '"text"', "[]", "{}", "```\nprint('hi')\n```", "Use ls() to list.", "cd folder=x", "<tool_call>", "</tool_call>",
    "<function=ls>{}</function>", "ls", "[ls]", "(ls())", "{ls()}",
    # python call lists
    "[ls(a=True)]", "ls(a=True)", "  [ls(a=True)]  ", "[ls(a=True)] then [cd(folder='x')]", "[cd('x')]",
    "[cd(*args)]", "[cd(**k)]", "[cd(folder=x+1)]", "[cd(folder=f(1))]", "[cd(folder=lambda: 1)]",
    "[os.system(command='ls')]", "[f()()]", "[x[0](a=1)]", "[ls(a=True), 3]", "[(ls(), cd())]", "(ls(), cd(folder='x'))",
    "[f(x) for x in y]", "[ls(a=b'x')]", "[ls(a={1, 2})]", "[ls(a=1j)]", "[ls(a=...)]", "[ls(a=float('nan'))]",
    "[ls(a=1e999)]", "[ls(a=-1)]", "[ls(a=(1, 2))]", "[ls(a={'k': (1,)})]", "[ls(a={1: 2})]", "[ls(**{'a': 1})]",
    "[ls(a='\0')]", "[ls(a=1, a=2)]", "[ls(a=" + "1" * 5000 + ")]", "[" + "a." * 3000 + "b()]",
    "[ls(a=" + "[" * 25 + "1" + "]" * 25 + ")]", "[ls(a=" + "[" * 900 + "]" * 900 + ")]", "[" * 3000 + "ls()" + "]" * 3000,
    "```python\n[ls(a=True)]\n```", "```\n[ls()]", "[ls(a='x]')] done", "ls(a=1) and cd(folder='x')",
    # JSON calls
    '{"name": "ls", "parameters": {"a": true}}', '{"name": "ls", "arguments": {}}', '{"function": "ls", "parameters": {}}',
    '{"name": "ls"}', '{"name": "", "parameters": {}}', '{"name": 5, "parameters": {}}', '{"name": true, "parameters": {}}',
    '{"name": ["ls"], "parameters": {}}', '{"name": "ls", "parameters": null}', '{"name": "ls", "parameters": "{\\"a\\": 1}"}',
    '{"name": "ls", "parameters": "not json"}', '{"name": "ls", "parameters": "null"}', '{"name": "ls", "parameters": [1]}',
    '{"name": "ls", "parameters": {"a": NaN}}', '{"name": "ls", "parameters": {"a": Infinity}}',
    '{"name": "ls", "parameters": {"a-b": 1}}', '{"name": "ls", "parameters": {"1": 1}}',
    "{'name': 'ls', 'parameters': {'a': True}}", "{'name': 'ls', 'parameters': {1: 2}}", '{"name": ls, "parameters": {}}',
    '{"name": "ls", "parameters": {}}; {"name": "cd", "parameters": {"folder": "x"}}',
    '{"name": "ls", "parameters": {}}, {"name": "cd", "parameters": {"folder": "x"}}',
    '{"name": "ls", "parameters": {}}\n{"name": "cd"}', '[{"name": "ls", "parameters": {}}, 5]', '[{"name": "ls"}]',
    '{"name": "ls", "parameters": {"a": ' + "[" * 25 + "1" + "]" * 25 + "}}",
    '{"name": "ls", "parameters": {"a": ' + "1" * 5000 + "}}", '{"name": "ls", "parameters": {"a": "\0"}}',
    '{"a": ' * 2000 + "1" + "}" * 2000, "{" * 3000, '<|python_tag|>{"name": "ls", "parameters": {}}',
    '```json\n{"name": "ls", "parameters": {}}\n```', '{"name": "ls", "parameters": {}} Listing now.',
    'Calling: {"name": "ls", "parameters": {}}', '{"name": "os.system", "parameters": {"command": "ls"}}',
    '{"name": "ls", "parameters": {}} {"name": "ls", "parameters": {}}',
    # Qwen's tags
    '<tool_call>{"name": "ls", "arguments": {}}</tool_call>', '<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>',
    'Sure.\n<tool_call>{"name": "cd", "arguments": {"folder": "x"}}</tool_call>', '<tool_call>{"name": "ls"}</tool_call>',
    '<tool_call>{"name": "ls", "arguments": "{}"}</tool_call>', '<tool_call>{"name": "ls", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "ls", "arguments": {"a": NaN}}</tool_call>', "<tool_call>[ls()]</tool_call>",
    '<tool_call>{"name": "ls", "arguments": {"a": ' + "1" * 5000 + "}}</tool_call>",
    # too long
    "x" * (MAX_CALL_TEXT_CHARS + 1), "[ls()]" * 5000,
]


def value(rng: random.Random, depth: int = 0):
    kinds = ["str", "str", "int", "float", "bool", "none", "list", "dict"] if depth < 3 else ["str", "int", "bool"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(["k", "mode", "a b", "1"]): value(rng, depth + 1) for _ in range(rng.randint(0, 2))}
    return rng.choice({"str": STRINGS, "int": [0, 1, -7, 42, 10**12], "float": [0.5, -2.25, 1e10, 3.0],
                       "bool": [True, False], "none": [None]}[kind])


def random_calls(rng: random.Random) -> list[tuple[str, dict]]:
    calls = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        name = rng.choice(TOOLS) if rng.random() < 0.9 else rng.choice(ODD_NAMES)
        calls.append((name, {rng.choice(ARGUMENT_NAMES): value(rng) for _ in range(rng.randint(0, 3))}))
    return calls


def python_form(calls: list[tuple[str, dict]], rng: random.Random) -> str:
    written = [f"{name}({', '.join(f'{key}={item!r}' for key, item in arguments.items())})" for name, arguments in calls]
    text, style = "[" + ", ".join(written) + "]", rng.random()
    if style < 0.15 and len(written) == 1:
        return written[0]
    if style < 0.25:
        return f"```python\n{text}\n```"
    if style < 0.35:
        return f"I will do that. {text}"
    return f"{text}\nDone." if style < 0.4 else text


def json_form(calls: list[tuple[str, dict]], rng: random.Random) -> str:
    key = rng.choice(["parameters", "parameters", "arguments"])
    name_key = "function" if rng.random() < 0.1 else "name"
    encode = json.dumps if rng.random() < 0.1 else (lambda arguments: arguments)  # string-encoded arguments
    objects = [{name_key: name, key: encode(arguments)} for name, arguments in calls]
    style = rng.random()
    if len(objects) == 1 and style < 0.4:
        text = json.dumps(objects[0])
    elif style < 0.6:
        text = json.dumps(objects)
    elif style < 0.75:
        text = "\n".join(json.dumps(entry) for entry in objects)
    elif style < 0.85:
        text = "; ".join(json.dumps(entry) for entry in objects)
    else:
        text = repr(objects if len(objects) > 1 else objects[0])  # Python literals: True, None, single quotes
    if rng.random() < 0.1:
        text = f"```json\n{text}\n```"
    return "<|python_tag|>" + text if rng.random() < 0.05 else text


def qwen_form(calls: list[tuple[str, dict]], rng: random.Random) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
                     for name, arguments in calls)


def damaged(text: str, rng: random.Random) -> list[str]:
    """The text cut off twice (as a token budget cuts it), with one character dropped, with one added."""
    if len(text) < 2:
        return []
    dropped, added = rng.randrange(len(text)), rng.randrange(len(text) + 1)
    return [text[: rng.randrange(1, len(text))], text[: rng.randrange(1, len(text))],
            text[:dropped] + text[dropped + 1 :], text[:added] + rng.choice("[](){}\"',:;=") + text[added:]]


def corpus(seed: int = 0, groups: int = 200) -> list[str]:
    rng, items = random.Random(seed), list(HAND_WRITTEN)
    for _ in range(groups):
        calls = random_calls(rng)
        for form in (python_form, json_form, qwen_form):
            text = form(calls, rng)
            items += [text, *damaged(text, rng)]
    return items


# ---- what the environment does with a message, by each side ---------------------------------------------------

def release_outcome(text: str, parser: str) -> tuple:
    try:
        read = release.parse_assistant_content_to_tool_calls({"role": "assistant", "content": text}, strict=True,
                                                              parser_mode=PAIRS[parser])
    except Exception as error:  # the reference crashing is an outcome of its own
        return ("raises", type(error).__name__)
    if "_bfcl_parse_error" in read:
        return ("parse error", re.sub(r" at 0x[0-9a-fA-F]+", "", read["_bfcl_parse_error"]))
    calls = [(call["function"]["name"], as_lists(call["function"]["arguments"])) for call in read["tool_calls"]]
    return outcome_of_calls(calls)


def seal_lite_outcome(text: str, parser: str) -> tuple:
    parsed = parse_calls(text, parser)
    if parsed.errors:
        return ("parse error", parsed.errors[0])
    return outcome_of_calls([(call.name, call.arguments) for call in parsed.calls])


def outcome_of_calls(calls: list) -> tuple:
    if not calls:
        return ("answer",)
    if any(name not in TOOLS for name, _ in calls):  # the environment refuses the whole message
        return ("unavailable",)
    return ("runs", calls)


def as_lists(item):
    """The release's values as seal-lite's guards pass them on: tuples as lists."""
    if isinstance(item, (list, tuple)):
        return [as_lists(element) for element in item]
    return {key: as_lists(element) for key, element in item.items()} if isinstance(item, dict) else item


def guard_refuses(text: str, parser: str) -> bool:
    """Whether seal-lite's guards refuse a call the release accepts: written here from the guards' rule (plain
    identifiers not starting with "_", JSON-like values nested at most 20 deep), not from seal-lite's code."""
    read = release.parse_assistant_content_to_tool_calls({"content": text}, strict=True, parser_mode=PAIRS[parser])
    for call in read["tool_calls"]:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if not plain(name) or name.startswith("_") or not isinstance(arguments, dict):
            return True
        if not all(plain(key) and json_like(item) for key, item in arguments.items()):
            return True
    return False


def plain(name) -> bool:
    return isinstance(name, str) and name.isascii() and name.isidentifier() and not keyword.iskeyword(name)


def json_like(item, depth: int = 0) -> bool:
    if depth > MAX_VALUE_DEPTH:
        return False
    if isinstance(item, float):
        return math.isfinite(item)
    if item is None or isinstance(item, (bool, int, str)):
        return True
    if isinstance(item, dict) and not all(isinstance(key, str) for key in item):
        return False
    children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
    return children is not None and all(json_like(child, depth + 1) for child in children)


def compare(text: str, parser: str) -> str:
    """How the two sides relate on one message: "agree" or an allowed difference; AssertionError otherwise."""
    ours, theirs = seal_lite_outcome(text, parser), release_outcome(text, parser)
    if len(text) > MAX_CALL_TEXT_CHARS:
        assert ours[0] == "parse error", (parser, text[:80], ours)
        return "too long"
    if theirs[0] == "raises":
        assert ours[0] == "parse error", (parser, text, theirs, ours)
        return "release raises"
    if parser == "strict" and ours[0] == theirs[0] == "parse error":
        return "agree"
    if ours != theirs and theirs[0] in ("runs", "unavailable") and guard_refuses(text, parser):
        assert ours[0] == "parse error", (parser, text, theirs, ours)
        return "guard"
    assert ours == theirs, (parser, text, theirs, ours)
    return "agree"


@pytest.fixture(scope="module")
def items():
    return corpus()


def test_the_parsers_agree_with_the_releases_on_the_corpus(items, capsys):
    assert len(items) >= 3000
    tally = Counter()
    for parser in PAIRS:
        for text in items:
            relation = compare(text, parser)
            tally[parser, relation] += 1
            if relation == "agree":
                tally[parser, seal_lite_outcome(text, parser)[0]] += 1
    for parser in PAIRS:  # the corpus reaches every outcome in every format
        for kind in ("runs", "answer", "unavailable", "parse error", "guard", "too long"):
            assert tally[parser, kind] > 0, (parser, kind)
        assert tally[parser, "agree"] >= 0.9 * len(items)
    capsys.readouterr()  # the release's parser prints each block it cannot read
    with capsys.disabled():
        print(f"\n{len(items)} messages x {len(PAIRS)} formats: " + "; ".join(
            f"{parser}: " + ", ".join(f"{kind} {tally[parser, kind]}" for kind in
                                      ("agree", "runs", "answer", "unavailable", "parse error", "guard",
                                       "release raises", "too long")) for parser in PAIRS))


# ---- prompts and results --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tasks():
    return load_tasks([task_id for split in ("train", "eval") for task_id in split_ids(split, CATEGORIES)])


@pytest.mark.parametrize("cues", [False, True], ids=["plain", "trained"])
def test_the_opening_is_the_releases_on_every_entry(tasks, cues):
    """The system and first user message of both formats, byte for byte as the release's get_init_state writes them,
    plain and with phi_schema and a guideline block (the release's extra instructions)."""
    guidelines = ("Check the state.",) if cues else ()
    extras = ["Observation note: parameters marked [required] must be provided exactly when calling a tool; do not "
              "invent tools outside the current schema.", "# Behavioral guidelines (env-evolved from recent failures):"
              "\n- Check the state."] if cues else []
    assert len(tasks) == 800
    for task in tasks:
        docs = task.visible_functions(0)
        shown = apply_schema_cues(docs) if cues else docs
        toolace = render_view(docs, TrainingInterface(cues, False, guidelines, call_format=TOOLACE))
        assert toolace.system_prompt == "\n\n".join([release.tools_schema_to_toolace_official_prompt(shown), *extras])
        assert toolace.first_user_message(task.user_message(0)) == task.user_message(0)
        llama = render_view(docs, TrainingInterface(cues, False, guidelines, call_format=LLAMA31))
        assert llama.system_prompt == release.LLAMA31_OFFICIAL_SYSTEM_PROMPT
        assert llama.first_user_message(task.user_message(0)) == release.tools_schema_to_llama31_official_prompt(
            shown, task.user_message(0), extra_instructions=extras), task.id


def test_results_are_the_releases_but_for_its_final_newline():
    """Each executed call's result as the release's result mode writes it (tool_message_to_qwen_text); the release
    ends each with a newline, seal-lite joins them with one (as Qwen's own template does), so the release's reply is
    seal-lite's plus one newline (docs/deviations.md D19)."""
    results = ['{"current_working_directory": "workspace"}', "None", "Error during execution: cd() got an unexpected "
               "keyword argument 'x'", "Ünïcode \"quoted\"\nline"]
    for call_format, mode in (("qwen", "bfcl_tool_response"), (TOOLACE, "toolace_official_prompt"),
                              (LLAMA31, "llama31_official")):
        theirs = "".join(release.tool_message_to_qwen_text({"role": "tool", "content": result, "tool_call_id": "x"},
                                                           result_mode=mode) for result in results)
        ours = observation([(CallStatus.OK, result) for result in results], TrainingInterface(call_format=call_format),
                           ["cd"])
        assert theirs == ours + "\n", call_format
