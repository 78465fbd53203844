"""Bring your own tools: an ``Environment`` made of one Python class and a list of tasks (docs/your-tools.md).

The class's public methods are the tools. Their docs, which the policy reads, are made from each method's type
hints and Google-style docstring (a summary, then ``Args:`` with one line per parameter), in BFCL's doc format, so
every part of seal-lite shows them as it shows BFCL's (``Literal`` types become an ``enum``, which φ_schema cues).
Every episode gets a fresh instance, ``tools(**task["state"])``.

A task is user turns and, per turn, the calls that do what it asks, as Python call strings (``[]`` where the turn
must be declined). They are parsed, never evaluated, as the policy's calls are. The verdict and the turn evidence
are BFCL multi-turn checker's rules, applied to these instances: after each turn with expected calls, the model's
instance must equal the expected calls' instance in every public attribute, every result of the expected calls must
be among the model's results so far, and a turn with expected calls needs at least one accepted call. So the
labels mean what they mean on BFCL (docs/your-tools.md says which cannot occur here).
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import types
import typing
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from seal_lite.core.calls import ToolCall, parse_calls
from seal_lite.core.errors import ConfigError
from seal_lite.core.types import TurnEvidence, TurnRecord
from seal_lite.envs.task import Task, every_turn
from seal_lite.envs.tools import ERROR_PREFIX, ToolEpisode, call_evidence

SPLITS = ("train", "eval")
TASK_KEYS = {"id", "turns", "calls", "state", "split", "category"}
_SCALAR_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean", dict: "dict"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):\s*$")


class ToolEnvironmentError(ConfigError):
    """A tool class or task list seal-lite cannot use; the message names it and the fix."""


class ToolEnvironment:
    """An environment from one tool class and its tasks.

    ``name``: what a recipe's ``data.environment`` and the store call it. ``tools``: the class whose public methods
    are the tools; every parameter typed, every method and parameter documented. ``tasks``: dicts with ``id``,
    ``turns`` (the user's messages, one per turn), ``calls`` (per turn, the expected calls as strings such as
    ``"borrow(title='Dune')"``; ``[]`` where the turn must be declined), and optionally ``state`` (keyword arguments
    of ``tools`` for the episode's start), ``split`` (train, the default, or eval) and ``category`` (default base).
    Everything is checked here, the expected calls played once: a bad doc, call or task raises a
    ``ToolEnvironmentError`` that names it and the fix.
    """

    def __init__(self, name: str, tools: type, tasks: Iterable[dict]):
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][\w.-]*", name):
            raise ToolEnvironmentError(f"environment name {name!r}: use letters, digits, _, - and . "
                                       "(e.g. 'library')")
        if not inspect.isclass(tools):
            raise ToolEnvironmentError(f"{name}: tools must be a class whose public methods are the tools, "
                                       f"not {type(tools).__name__}")
        self.name = name
        self.tools = tools
        self.functions = tool_docs(tools)
        self._tasks: dict[str, Task] = {}
        self._splits: dict[str, str] = {}
        for entry in tasks:
            task, split = self._task(entry)
            if task.id in self._tasks:
                raise ToolEnvironmentError(f"{name}: two tasks have the id {task.id!r}; ids must be unique")
            if failed := expected_call_errors(self, task):  # else every label of the task would be gt_error
                raise ToolEnvironmentError(f"{name}: task {task.id!r}: {failed[0]}; fix the call or the task's state")
            self._tasks[task.id], self._splits[task.id] = task, split
        if not self._tasks:
            raise ToolEnvironmentError(f"{name}: no task; give at least one dict with id, turns and calls")
        self.categories = tuple(dict.fromkeys(task.category for task in self._tasks.values()))

    def __repr__(self) -> str:
        return f"ToolEnvironment({self.name!r}, {self.tools.__name__}, {len(self._tasks)} tasks)"

    # --- the tasks --------------------------------------------------------------------------------------------

    def _task(self, entry: dict) -> tuple[Task, str]:
        if not isinstance(entry, dict):
            raise ToolEnvironmentError(f"{self.name}: a task is a dict with id, turns and calls, "
                                       f"not {type(entry).__name__}")
        where = f"{self.name}: task {entry.get('id', '(no id)')!r}"
        if unknown := set(entry) - TASK_KEYS:
            raise ToolEnvironmentError(f"{where}: unknown keys {sorted(unknown)}; a task has {sorted(TASK_KEYS)}")
        if not isinstance(entry.get("id"), str) or not entry["id"]:
            raise ToolEnvironmentError(f"{where}: give it an id, a non-empty string")
        turns, calls = entry.get("turns"), entry.get("calls")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ToolEnvironmentError(f"{where}: turns must be a non-empty list of the user's messages (strings)")
        if not isinstance(calls, list) or len(calls) != len(turns) or not all(isinstance(c, list) for c in calls):
            raise ToolEnvironmentError(f"{where}: calls must be a list with one list of call strings per turn "
                                       f"({len(turns)}); [] for a turn the agent must decline")
        state = entry.get("state", {})
        if not isinstance(state, dict):
            raise ToolEnvironmentError(f"{where}: state must be a dict of keyword arguments of {self.tools.__name__}")
        split = entry.get("split", "train")
        if split not in SPLITS:
            raise ToolEnvironmentError(f"{where}: split {split!r}: use train or eval")
        category = entry.get("category", "base")
        if not isinstance(category, str) or not re.fullmatch(r"\w+", category):
            raise ToolEnvironmentError(f"{where}: category {category!r}: use a word such as base")
        task = Task(id=entry["id"], category=category, turns=[[{"role": "user", "content": text}] for text in turns],
                    functions=self.functions, revealed={},
                    ground_truth=[[self._expected_call(where, index, text) for text in turn]
                                  for index, turn in enumerate(calls)],
                    initial_config={self.tools.__name__: state}, involved_classes=[self.tools.__name__],
                    environment=self.name)
        try:
            self._instance(task)
        except Exception as error:
            raise ToolEnvironmentError(f"{where}: {self.tools.__name__}(**state) failed: {error}") from None
        return task, split

    def _expected_call(self, where: str, turn: int, text) -> str:
        """An expected call as the checker compares it: parsed (never evaluated), bound to its method, canonical."""
        parsed = parse_calls(text, "lenient") if isinstance(text, str) else None
        if parsed is None or parsed.errors or len(parsed.calls) != 1:
            example = self.functions[0]["name"]
            raise ToolEnvironmentError(f"{where}: turn {turn}: {text!r} is not one call such as \"{example}(...)\" "
                                       "with literal arguments")
        call = parsed.calls[0]
        if call.name not in {doc["name"] for doc in self.functions}:
            raise ToolEnvironmentError(f"{where}: turn {turn}: {call.name!r} is not a tool of {self.tools.__name__} "
                                       f"(its tools: {', '.join(doc['name'] for doc in self.functions)})")
        signature = inspect.signature(getattr(self.tools, call.name))
        without_self = signature.replace(parameters=list(signature.parameters.values())[1:])
        try:
            bound = without_self.bind(*call.positional, **call.arguments)
        except TypeError as error:
            raise ToolEnvironmentError(f"{where}: turn {turn}: {text!r}: {error}") from None
        return ToolCall(call.name, dict(bound.arguments)).to_python()

    def split_ids(self, split: str, categories: Sequence[str] | None = None) -> list[str]:
        return [task_id for task_id, task in self._tasks.items()
                if self._splits[task_id] == split and (categories is None or task.category in categories)]

    def category_of(self, task_id: str) -> str:
        if task_id not in self._tasks:
            raise KeyError(f"{task_id!r} is not a task of environment {self.name!r}; its ids include "
                           f"{', '.join(list(self._tasks)[:3])}")
        return self._tasks[task_id].category

    def load_tasks(self, task_ids: list[str]) -> list[Task]:
        for task_id in task_ids:
            self.category_of(task_id)  # a KeyError naming an unknown id
        return [copy.deepcopy(self._tasks[task_id]) for task_id in task_ids]

    # --- playing and judging ----------------------------------------------------------------------------------

    def _instance(self, task: Task) -> object:
        return self.tools(**copy.deepcopy(task.initial_config[self.tools.__name__]))

    def episode(self, task: Task) -> ToolEpisode:
        return ToolEpisode(task, {self.tools.__name__: self._instance(task)})

    def turn_evidence(self, task: Task, turns: list[TurnRecord]) -> list[TurnEvidence]:
        """One evidence per turn with what its attempted calls show and how the replay compared."""
        records = list(turns) + [TurnRecord(user_text="")] * (len(task.ground_truth) - len(turns))
        compared = self._compare(task, [record.checker_steps() for record in records])
        evidences = []
        for expected_calls, record, turn in zip(task.ground_truth, records, compared):
            evidence = call_evidence(len(expected_calls), record.outcomes)
            evidence.gt_error = turn.expected_error
            evidence.state_match, evidence.response_match = not turn.state, not turn.missing
            if turn.state:
                evidence.differences.append(f"{self.tools.__name__} state differs in {', '.join(turn.state)}")
            if turn.missing:
                evidence.differences.append(f"missing results: {json.dumps(turn.missing)[:300]}")
            evidences.append(evidence)
        return evidences

    def verdict(self, task: Task, steps_per_turn: list[list[list[str]]]) -> dict:
        """BFCL's verdict rules on this environment: the first turn with expected calls that fails decides, with
        the error type BFCL's checker gives."""
        for expected_calls, turn in zip(task.ground_truth, self._compare(task, every_turn(task, steps_per_turn))):
            if not expected_calls:
                continue  # a turn to decline is not checked (BFCL's irrelevance check is apart)
            if not turn.responded:
                return {"valid": False, "error_type": "multi_turn:empty_turn_model_response"}
            if turn.state:
                return {"valid": False, "error_type": "multi_turn:instance_state_mismatch"}
            if turn.missing:
                return {"valid": False, "error_type": "multi_turn:execution_response_mismatch"}
        return {"valid": True}

    def irrelevance(self, task: Task, steps_per_turn: list[list[list[str]]]) -> bool:
        steps = every_turn(task, steps_per_turn)
        return all(not any(steps[index]) for index, calls in enumerate(task.ground_truth) if not calls)

    def _compare(self, task: Task, steps_per_turn: list[list[list[str]]]) -> list[ComparedTurn]:
        """Replay the model's checker calls and the expected calls turn by turn on two instances, each turn compared
        as BFCL's checker compares it: the state after the turn, and the expected results among all the model's
        results so far."""
        model, expected = self.episode(task), self.episode(task)
        model_results: list[str] = []
        compared = []
        for steps, expected_calls in zip(steps_per_turn, task.ground_truth):
            model_results += [replay(model, call) for step in steps for call in step]
            expected_results = [replay(expected, call) for call in expected_calls]
            failed = [result for result in expected_results if result.startswith(ERROR_PREFIX)]
            compared.append(ComparedTurn(
                responded=any(steps), expected_error=failed[0][:200] if failed else None,
                state=state_differences(*(episode.instances[self.tools.__name__] for episode in (model, expected))),
                missing=missing_results(expected_results, model_results)))
        return compared


@dataclass
class ComparedTurn:
    responded: bool  # the model sent at least one call the checker sees
    expected_error: str | None  # the first error an expected call raised
    state: list[str] = field(default_factory=list)  # public attributes that differ after the turn
    missing: list[str] = field(default_factory=list)  # expected results not among the model's so far


def replay(episode: ToolEpisode, call_text: str) -> str:
    """The result of one checker call string on an episode's instances (every tool visible), as text. It is
    parsed, never evaluated; a call to a function the tools do not have fails, as BFCL's executor fails it."""
    parsed = parse_calls(call_text, "lenient")
    if parsed.errors or len(parsed.calls) != 1:
        return f"{ERROR_PREFIX} {call_text!r} is not a call"
    return episode.execute(parsed.calls[0], set(episode.tool_names)).result


def state_differences(model: object, expected: object) -> list[str]:
    """The public attributes in which two instances of a tool class differ (BFCL's ``_compare_instances``)."""
    return sorted(name for name, value in vars(expected).items()
                  if not name.startswith("_") and getattr(model, name, None) != value)


def missing_results(expected: list[str], model: list[str]) -> list[str]:
    """The expected results not found among the model's, each matched at most once, in any order (BFCL's
    ``_is_subsequence_unordered``)."""
    left = Counter(model)
    missing = []
    for result in expected:
        if left[result]:
            left[result] -= 1
        else:
            missing.append(result)
    return missing


def expected_call_errors(environment: ToolEnvironment, task: Task) -> list[str]:
    """The errors a task's own expected calls raise, played turn by turn from its state."""
    episode = environment.episode(task)
    results = [(call, replay(episode, call)) for turn in task.ground_truth for call in turn]
    return [f"{call} fails: {result.removeprefix(ERROR_PREFIX).strip()}" for call, result in results
            if result.startswith(ERROR_PREFIX)]


# --- tool docs from Python --------------------------------------------------------------------------------


def tool_docs(tools: type) -> list[dict]:
    """BFCL-format docs for the public methods of ``tools`` (its own and inherited), in definition order, from their
    hints and docstrings."""
    functions = {}  # inherited methods are tools too, in the order the classes define them
    for cls in reversed(tools.__mro__[:-1]):
        functions.update((name, value) for name, value in vars(cls).items() if inspect.isfunction(value))
    docs = [_tool_doc(tools.__name__, name, function) for name, function in functions.items()
            if not name.startswith("_")]
    if not docs:
        raise ToolEnvironmentError(f"{tools.__name__} has no public method: each public method is a tool")
    return docs


def _tool_doc(class_name: str, name: str, function) -> dict:
    where = f"{class_name}.{name}"
    docstring = inspect.getdoc(function)
    if not docstring:
        raise ToolEnvironmentError(f"{where} has no docstring: the policy reads it; write a one-line summary and "
                                   "an Args: section with one line per parameter")
    try:
        hints = typing.get_type_hints(function)
    except Exception as error:  # an annotation that names nothing importable from the tool's module
        raise ToolEnvironmentError(f"{where}: its type hints cannot be read ({error}); use types the module "
                                   "imports") from None
    described = _arguments(docstring)
    properties, required = {}, []
    for parameter in list(inspect.signature(function).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolEnvironmentError(f"{where}: *{parameter.name} cannot be documented for the policy; name "
                                       "each parameter")
        if parameter.name not in hints:
            raise ToolEnvironmentError(f"{where}: parameter {parameter.name!r} has no type hint "
                                       f"(e.g. {parameter.name}: str)")
        if parameter.name not in described:
            raise ToolEnvironmentError(f"{where}: parameter {parameter.name!r} is not described; add a line "
                                       f"'{parameter.name}: what it is' under Args: in its docstring")
        spec = {**json_type(hints[parameter.name], f"{where}({parameter.name})"),
                "description": described[parameter.name]}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif _json_literal(parameter.default):  # what the doc can show; any other default stays unstated
            spec["default"] = parameter.default
        properties[parameter.name] = spec
    return {"name": name, "description": _summary(docstring),
            "parameters": {"type": "dict", "properties": properties, "required": required}}


def json_type(hint, where: str) -> dict:
    """A type hint as a BFCL doc type: string, integer, float, boolean, array (with items), dict, and an enum
    for a ``Literal``; ``X | None`` is X."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kept = [argument for argument in arguments if argument is not type(None)]
        if len(kept) == 1:
            return json_type(kept[0], where)
    elif origin is typing.Literal:
        kinds = {type(value) for value in arguments}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALAR_TYPES:
            return {"type": _SCALAR_TYPES[next(iter(kinds))], "enum": list(arguments)}
    elif origin is list or hint is list:
        return {"type": "array", "items": json_type(arguments[0], where)} if arguments else {"type": "array"}
    elif origin is dict:
        return {"type": "dict"}
    elif hint in _SCALAR_TYPES:
        return {"type": _SCALAR_TYPES[hint]}
    raise ToolEnvironmentError(f"{where}: type {hint!r} is not one a tool doc can state; use str, int, float, "
                               "bool, list[...], dict, Literal[...] or X | None")


def _json_literal(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _summary(docstring: str) -> str:
    """The docstring's text before its first section (Args:, Returns:, ...), on one line."""
    lines = []
    for line in docstring.splitlines():
        if _SECTION.match(line):
            break
        lines.append(line.strip())
    return " ".join(line for line in lines if line)


def _arguments(docstring: str) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: {parameter: description} (continuation lines joined)."""
    described: dict[str, str] = {}
    inside, current, indent = False, None, None
    for line in docstring.splitlines():
        if _SECTION.match(line):
            inside = line.strip().rstrip(":") in ("Args", "Arguments", "Parameters")
            current, indent = None, None
            continue
        if not inside or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        match = re.match(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if match and (indent is None or depth <= indent):  # deeper lines continue the parameter above
            current, indent = match.group(1), depth
            described[current] = match.group(2).strip()
        elif current:
            described[current] = f"{described[current]} {line.strip()}".strip()
    return described
