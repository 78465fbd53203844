"""An episode's tools as Python objects: parsed calls dispatched to their methods, and what a turn's calls showed.

Both environments play calls here (BFCL's API classes, seal_lite/envs/bfcl.py; a user's tool class,
seal_lite/envs/python_tools.py). ``ToolEpisode`` dispatches a parsed ``ToolCall`` by ``getattr`` to a public
method of the episode's instances that the current turn shows: model text is never evaluated. Its answers read as
the SEAL release's BFCL service writes them (docs/method.md §8): a result as bfcl-eval's executor formats it, an
error as "Error during execution: ...", a rejected message as "[ERROR] Invalid tool call format: ...".
"""

from __future__ import annotations

import copy
import inspect
import json

from seal_lite.core.calls import ToolCall, parse_calls, rejects_whole_message
from seal_lite.core.types import NO_SUCH_FUNCTION_CALL, CallOutcome, CallStatus, TurnEvidence
from seal_lite.envs.task import Task

ERROR_PREFIX = "Error during execution:"
INVALID_FORMAT = "[ERROR] Invalid tool call format:"  # the official service's reply to a rejected message


def public_methods(instance: object) -> dict[str, object]:
    """The tools an instance offers: its bound methods whose names do not start with "_"."""
    return {name: method for name, method in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_")}


class ToolEpisode:
    """One episode's tool instances; dispatches only to the tools visible in the current turn."""

    def __init__(self, task: Task, instances: dict[str, object]):
        self.task = task
        self.instances = instances
        self._methods = {name: method for instance in instances.values()
                         for name, method in public_methods(instance).items()}

    @property
    def tool_names(self) -> list[str]:
        return list(self._methods)

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
        try:  # a copy: tools may keep and later mutate list arguments (BFCL's post_tweet keeps its mentions)
            value = method(**copy.deepcopy(call.arguments))
        except TypeError as error:
            return CallOutcome(call, f"{ERROR_PREFIX} {error}", CallStatus.ARGUMENT_ERROR, canonical)
        except Exception as error:  # the tool's own failure is feedback for the agent, not a crash
            return CallOutcome(call, f"{ERROR_PREFIX} {error}", CallStatus.TOOL_ERROR, canonical)
        status = CallStatus.TOOL_ERROR if isinstance(value, dict) and "error" in value else CallStatus.OK
        return CallOutcome(call, format_result(value), status, canonical)


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


def format_result(value) -> str:
    """Format a tool's return value exactly as bfcl-eval's executor does."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def call_evidence(gt_calls: int, outcomes: list[CallOutcome]) -> TurnEvidence:
    """What a turn's attempted calls show before any state is compared: how many were made, accepted, rejected
    (and why), and whether a tool error went unrepaired."""
    return TurnEvidence(
        gt_calls=gt_calls,
        model_calls=len(outcomes),
        decoded_calls=sum(o.executed for o in outcomes),
        failed_unknown_calls=sum(o.checker_call == NO_SUCH_FUNCTION_CALL for o in outcomes),
        parse_errors=sum(o.status == CallStatus.PARSE_ERROR for o in outcomes),
        unknown_tools=sum(o.status in (CallStatus.UNKNOWN_TOOL, CallStatus.REJECTED) for o in outcomes),
        argument_errors=sum(o.status == CallStatus.ARGUMENT_ERROR for o in outcomes),
        unrepaired_tool_error=_unrepaired_error(outcomes),
    )


def _unrepaired_error(outcomes: list[CallOutcome]) -> bool:
    """A tool or argument error that no later successful call in the same turn followed."""
    errors = (CallStatus.TOOL_ERROR, CallStatus.ARGUMENT_ERROR)
    last_error = max((i for i, o in enumerate(outcomes) if o.status in errors), default=None)
    if last_error is None:
        return False
    return not any(o.status == CallStatus.OK for o in outcomes[last_error + 1 :])
