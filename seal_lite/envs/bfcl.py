"""The BFCL multi-turn adapter: tasks, a live environment per episode, the official verdict, turn evidence.

This is the only module that imports ``bfcl_eval``. Three things happen here:

* ``load_tasks`` reads the real BFCL v3 multi-turn entries (shipped as BFCL_v4_multi_turn_*) with their tool
  docs and ground truth.
* ``Environment`` holds fresh API instances for one episode and dispatches parsed ``ToolCall``s by
  ``getattr`` to the methods visible in the current turn: model text is never evaluated. Its answers read as
  the SEAL release's BFCL service writes them (docs/method.md §8): a tool's result as bfcl-eval's executor
  formats it, a rejected message as "[ERROR] Invalid tool call format: ...".
* ``official_verdict`` runs bfcl-eval's own ``multi_turn_checker``, and ``turn_evidence`` replays the same
  calls turn by turn to explain every ground-truth turn. Both hand bfcl-eval only canonical call strings that
  seal-lite built from parsed literals (``ToolCall.to_python``), because bfcl-eval ``eval``s them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, PROMPT_PATH
from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

from seal_lite.core.calls import ToolCall, parse_calls, rejects_whole_message
from seal_lite.core.types import NO_SUCH_FUNCTION_CALL, CallOutcome, CallStatus, TurnEvidence, TurnRecord

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
ERROR_PREFIX = "Error during execution:"
INVALID_FORMAT = "[ERROR] Invalid tool call format:"  # the official service's reply to a rejected message


@dataclass
class Task:
    id: str
    category: str
    turns: list[list[dict]]  # user messages per turn ([] for a miss_func turn that only reveals tools)
    functions: list[dict]  # tool docs visible from the first turn
    revealed: dict[int, list[dict]]  # turn index -> tool docs that become visible at that turn
    ground_truth: list[list[str]]  # BFCL call strings per turn
    initial_config: dict
    involved_classes: list[str]

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"

    def truncated(self, max_turns: int | None) -> Task:
        """The same task cut to its first ``max_turns`` turns (its ground truth cut alike)."""
        if max_turns is None or max_turns >= len(self.turns):
            return self
        return dataclasses.replace(self, turns=self.turns[:max_turns], ground_truth=self.ground_truth[:max_turns])

    def visible_functions(self, turn_index: int) -> list[dict]:
        docs = list(self.functions)
        for index in sorted(self.revealed):
            if index <= turn_index:
                docs.extend(self.revealed[index])
        return docs

    def user_message(self, turn_index: int) -> str:
        """The text of a user turn as the official surface sends it; a miss_func turn that only reveals tools
        gets bfcl-eval's additional-function prompt with the revealed docs."""
        messages = self.turns[turn_index]
        if not messages:
            return additional_functions_prompt(json.dumps(self.revealed.get(turn_index, []), ensure_ascii=False))
        return "\n".join(message["content"] for message in messages)


def additional_functions_prompt(functions_text: str) -> str:
    """The user message of a miss_func turn that reveals tools: bfcl-eval's additional-function prompt around
    the revealed docs, as the SEAL release sends it (its system message is never re-rendered, so the docs travel
    in this message)."""
    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=functions_text)


def category_of(task_id: str) -> str:
    category = task_id.removeprefix("multi_turn_").rsplit("_", 1)[0]
    if category not in CATEGORIES or not task_id.startswith("multi_turn_"):
        raise KeyError(f"{task_id!r} is not a BFCL multi-turn id like multi_turn_base_0")
    return category


def data_folder() -> Path:
    """seal-lite's data/ folder: inside the installed package, or beside it in a checkout."""
    packaged = Path(__file__).parent.parent / "data"
    return packaged if packaged.exists() else Path(__file__).parent.parent.parent / "data"


def split_ids(split: str, categories: list[str] | tuple[str, ...] = CATEGORIES) -> list[str]:
    """The ids of a SEAL split (data/<split>_ids.txt: train or eval) in the given categories, in file order."""
    wanted = {f"multi_turn_{category}_" for category in categories}
    ids = (data_folder() / f"{split}_ids.txt").read_text().split()
    return [task_id for task_id in ids if task_id.rsplit("_", 1)[0] + "_" in wanted]


def task_ids_of(category: str) -> set[str]:
    """Every id of bfcl-eval's data for a multi-turn category."""
    return set(_category_entries(category))


def load_tasks(task_ids: list[str]) -> list[Task]:
    """Load BFCL multi-turn tasks by id, in the given order. Unknown ids raise KeyError naming them."""
    tasks = []
    for task_id in task_ids:
        entries = _category_entries(category_of(task_id))
        if task_id not in entries:
            raise KeyError(f"{task_id!r} is not in bfcl-eval's {category_of(task_id)} data")
        tasks.append(copy.deepcopy(entries[task_id]))
    return tasks


@functools.cache
def _category_entries(category: str) -> dict[str, Task]:
    stem = f"BFCL_v4_multi_turn_{category}.json"
    answers = {entry["id"]: entry["ground_truth"] for entry in _read_jsonl(PROMPT_PATH / "possible_answer" / stem)}
    tasks = {}
    for entry in _read_jsonl(PROMPT_PATH / stem):
        functions = [doc for cls in entry["involved_classes"] for doc in _class_docs(cls)]
        revealed = {}  # as bfcl-eval's populate_test_cases_with_predefined_functions moves them, in name order
        for turn, names in entry.get("missed_function", {}).items():
            revealed[int(turn)] = [next(doc for doc in functions if doc["name"] == name) for name in names]
            functions = [doc for doc in functions if doc["name"] not in names]
        tasks[entry["id"]] = Task(
            id=entry["id"],
            category=category,
            turns=entry["question"],
            functions=functions,
            revealed=revealed,
            ground_truth=answers[entry["id"]],
            initial_config=entry["initial_config"],
            involved_classes=entry["involved_classes"],
        )
    return tasks


@functools.cache
def _class_docs(class_name: str) -> tuple[dict, ...]:
    return tuple(_read_jsonl(MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def _read_jsonl(path) -> list[dict]:
    with open(path) as source:
        return [json.loads(line) for line in source if line.strip()]


# --- the live environment ---------------------------------------------------------------------------------


def _new_instances(task: Task) -> dict[str, object]:
    instances = {}
    for class_name in task.involved_classes:
        module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
        instance = getattr(module, class_name)()
        if class_name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(task.initial_config.get(class_name, {})), long_context=task.long_context)
        instances[class_name] = instance
    return instances


class Environment:
    """Fresh BFCL API instances for one episode; dispatches only to the tools visible in the current turn."""

    def __init__(self, task: Task):
        self.task = task
        self.instances = _new_instances(task)
        self._methods = {}
        for instance in self.instances.values():
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self._methods[name] = method

    def run(self, model_text: str, turn_index: int, parser: str = "lenient") -> list[CallOutcome]:
        """Parse one model message and execute its calls; returns one outcome per attempted call.

        ``strict`` (the official surface), ``toolace`` and ``llama3.1`` reject the whole message when one of its
        calls is malformed or names a tool the turn does not show; ``lenient`` rejects only the offending calls.
        """
        parsed = parse_calls(model_text, parser)
        outcomes = [CallOutcome(None, f"{INVALID_FORMAT} {error}", CallStatus.PARSE_ERROR) for error in parsed.errors]
        visible = {doc["name"] for doc in self.task.visible_functions(turn_index)}
        hidden = [call for call in parsed.calls if not self._available(call.name, visible)]
        if rejects_whole_message(parser) and hidden:
            message = _not_available(hidden[0].name)
            return [CallOutcome(call, message, CallStatus.UNKNOWN_TOOL if call in hidden else CallStatus.REJECTED,
                                exists=call.name in self._methods) for call in parsed.calls]
        for call in parsed.calls:
            outcomes.append(self.execute(call, visible))
        return outcomes

    def _available(self, name: str, visible: set[str]) -> bool:
        return name in visible and name in self._methods

    def execute(self, call: ToolCall, visible: set[str]) -> CallOutcome:
        if not self._available(call.name, visible):
            return CallOutcome(call, _not_available(call.name), CallStatus.UNKNOWN_TOOL, exists=call.name in self._methods)
        method = self._methods[call.name]
        try:  # bind first, so positional values get their parameter names in the canonical call
            bound = inspect.signature(method).bind(*call.positional, **call.arguments)
        except TypeError:  # missing / unexpected argument: the message Python gives the call itself, as BFCL's
            return CallOutcome(call, f"{ERROR_PREFIX} {_binding_error(method, call)}", CallStatus.ARGUMENT_ERROR,
                               call.to_python())
        call = ToolCall(call.name, dict(bound.arguments))
        canonical = call.to_python()
        try:  # a copy: BFCL tools keep and later mutate list arguments (post_tweet's mentions)
            value = method(**copy.deepcopy(call.arguments))
        except TypeError as error:
            return CallOutcome(call, f"{ERROR_PREFIX} {error}", CallStatus.ARGUMENT_ERROR, canonical)
        except Exception as error:  # the tool's own failure is feedback for the agent, not a crash
            return CallOutcome(call, f"{ERROR_PREFIX} {error}", CallStatus.TOOL_ERROR, canonical)
        status = CallStatus.TOOL_ERROR if isinstance(value, dict) and "error" in value else CallStatus.OK
        return CallOutcome(call, _format_result(value), status, canonical)


def _not_available(name: str) -> str:
    return f"{INVALID_FORMAT} Tool '{name}' is not available in the current tool list."


def _binding_error(method, call: ToolCall) -> str:
    """The TypeError Python raises for these arguments (what BFCL's executor reports). Arguments are bound
    before a method's body runs, so the call fails before it can change any state."""
    try:
        method(*call.positional, **call.arguments)
    except TypeError as error:
        return str(error)
    raise AssertionError(f"{call.name}: arguments that do not bind were accepted")


def _format_result(value) -> str:
    """Format a tool's return value exactly as bfcl-eval's executor does."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


# --- verdict and evidence ---------------------------------------------------------------------------------


def official_verdict(task: Task, steps_per_turn: list[list[list[str]]]) -> dict:
    """bfcl-eval's multi-turn verdict for checker call strings grouped per turn and per model step.

    Turns the episode never reached (it ran out of budget) count as empty, as in the official runner.
    Every check uses a fresh, unique model name so no state is shared through bfcl-eval's module-level
    instance cache, and that cache is emptied afterwards.
    """
    steps_per_turn = _every_turn(task, steps_per_turn)
    entry = {"id": task.id, "initial_config": task.initial_config, "involved_classes": task.involved_classes}
    model_name = f"seal_lite_{uuid.uuid4().hex}"
    try:
        return checker.multi_turn_checker(steps_per_turn, task.ground_truth, entry, task.category, model_name)
    except Exception as error:  # a checker crash must not read as a pass or a model failure
        return {"valid": False, "error_type": "checker_error", "error_message": f"{type(error).__name__}: {error}"}
    finally:
        _forget_instances(model_name)


def official_irrelevance(task: Task, steps_per_turn: list[list[list[str]]]) -> bool:
    """bfcl-eval's irrelevance check: no call in turns whose ground truth is empty. The official multi-turn
    runner skips it, so it never changes the verdict; seal-lite reports it as a separate metric."""
    steps_per_turn = _every_turn(task, steps_per_turn)
    return checker.multi_turn_irrelevance_checker(steps_per_turn, task.ground_truth)["valid"]


def _every_turn(task: Task, steps_per_turn: list[list[list[str]]]) -> list[list[list[str]]]:
    """Steps for every ground-truth turn: turns the episode never reached count as empty."""
    return list(steps_per_turn) + [[]] * (len(task.ground_truth) - len(steps_per_turn))


def _forget_instances(model_name: str) -> None:
    cache = vars(multi_turn_utils)
    for key in [key for key in cache if key.startswith(model_name)]:
        del cache[key]


def replay_calls(task: Task, steps_per_turn: list[list[list[str]]], parser: str = "lenient") -> list[TurnRecord]:
    """Play calls through a fresh environment, as if a model had sent them: per user turn, per model step,
    message texts (BFCL python form such as ``"cd(folder='x')"`` for the lenient parser, <tool_call> blocks for
    the strict one). Every string is parsed, never evaluated."""
    env = Environment(task)
    records = []
    for index, steps in enumerate(steps_per_turn):
        record = TurnRecord(task.user_message(index) if index < len(task.turns) else "")
        for step in steps:
            outcomes = [outcome for text in step for outcome in env.run(text, index, parser)]
            if outcomes:
                record.outcomes_per_step.append(outcomes)
        records.append(record)
    return records


def turn_evidence(task: Task, turns: list[TurnRecord]) -> list[TurnEvidence]:
    """Replay model calls and ground truth turn by turn on separate instances, as the official checker does,
    but through every ground-truth turn instead of stopping at the first failure; one evidence per GT turn."""
    model_name = f"seal_lite_{uuid.uuid4().hex}"
    evidences = []
    all_model_results: list[str] = []  # the response check looks at results of all turns so far
    try:
        for index, gt_calls in enumerate(task.ground_truth):
            record = turns[index] if index < len(turns) else TurnRecord(user_text="")
            outcomes = record.outcomes
            model_instances = {}
            for step in record.checker_steps() or [[]]:  # an empty step still yields the instances to compare
                results, model_instances = _execute(step, task, model_name)
                all_model_results.extend(results)
            gt_results, gt_instances = _execute(gt_calls, task, model_name + "_ground_truth")
            evidence = TurnEvidence(
                gt_calls=len(gt_calls),
                model_calls=len(outcomes),
                decoded_calls=sum(o.executed for o in outcomes),
                failed_unknown_calls=sum(o.checker_call == NO_SUCH_FUNCTION_CALL for o in outcomes),
                parse_errors=sum(o.status == CallStatus.PARSE_ERROR for o in outcomes),
                unknown_tools=sum(o.status in (CallStatus.UNKNOWN_TOOL, CallStatus.REJECTED) for o in outcomes),
                argument_errors=sum(o.status == CallStatus.ARGUMENT_ERROR for o in outcomes),
                unrepaired_tool_error=_unrepaired_error(outcomes),
            )
            failed_gt = [result for result in gt_results if str(result).startswith(ERROR_PREFIX)]
            if failed_gt:
                evidence.gt_error = failed_gt[0][:200]
            try:
                _compare(evidence, model_instances, gt_instances, all_model_results, gt_results)
            except Exception as error:
                evidence.checker_error = f"{type(error).__name__}: {error}"[:200]
            evidences.append(evidence)
    finally:
        _forget_instances(model_name)
    return evidences


def _execute(calls: list[str], task: Task, model_name: str):
    return multi_turn_utils.execute_multi_turn_func_call(
        calls, task.initial_config, task.involved_classes, model_name, task.id,
        long_context=task.long_context, is_evaL_run=True,
    )


def _compare(evidence: TurnEvidence, model_instances, gt_instances, all_model_results, gt_results) -> None:
    evidence.instances_match = set(model_instances) == set(gt_instances)
    if not evidence.instances_match:
        evidence.differences.append(f"instances {sorted(model_instances)} vs {sorted(gt_instances)}")
        return
    for class_name, gt_instance in gt_instances.items():
        valid, differences = checker._compare_instances(model_instances[class_name], gt_instance)
        if not valid:
            evidence.state_match = False
            evidence.differences.append(f"{class_name} state differs in {', '.join(sorted(differences))}")
    contained, missing = checker._is_subsequence_unordered(gt_results, all_model_results)
    if not contained:
        evidence.response_match = False
        evidence.differences.append(f"missing results: {json.dumps(missing)[:300]}")


def _unrepaired_error(outcomes: list[CallOutcome]) -> bool:
    """A tool or argument error that no later successful call in the same turn followed."""
    errors = (CallStatus.TOOL_ERROR, CallStatus.ARGUMENT_ERROR)
    last_error = max((i for i, o in enumerate(outcomes) if o.status in errors), default=None)
    if last_error is None:
        return False
    return not any(o.status == CallStatus.OK for o in outcomes[last_error + 1 :])
