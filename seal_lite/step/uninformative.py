"""Turns that any accepted call passes: BFCL tasks whose verdict cannot tell the skill from a guess.

Some ground-truth turns leave the environment as they found it and return what any look at it would.
``multi_turn_base_142``'s first turn asks to add ZETA to a watchlist that already holds it: BFCL's state and
response checks pass ``add_to_watchlist(stock='Zeta Corp')``, and even ``get_watchlist()``, as they pass the right
call. A screen that keeps such a task trains "make a call", not the skill, and a held-out set that holds it scores
luck. The frontier screen leaves these tasks out (seal_lite/runs/tasks.py).

Both tests are executable, the earlier turns played by their ground truth:

* ``any_call_turns``: the turn passes with one call of another tool instead of its ground truth. Every tool of
  the task that takes no required argument is tried (those are calls any model can make correctly); a turn that
  only an unrelated call with arguments would pass is not found.
* ``argument_blind_turns``: the turn passes with every argument of its ground-truth calls replaced by a wrong value
  of the same type: the verdict checks the tool but not what the user asked of it (``ls(a=False)`` for "show the
  hidden files too" in a folder without any). Reported, not excluded: the tool is still the model's choice.
"""

from __future__ import annotations

from seal_lite.core.calls import ToolCall, parse_calls
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.envs.registry import replay_calls
from seal_lite.envs.task import Task
from seal_lite.step.verifier import diagnose_episode

WRONG_TEXT = "seal-lite-wrong-value"


def passes_with(task: Task, index: int, calls: list[str]) -> bool:
    """Whether turn ``index`` passes when a model sends ``calls`` (BFCL call strings) in it, the turns before it
    played by their ground truth."""
    upto = task.truncated(index + 1)
    played = [[truth] for truth in task.ground_truth[:index]] + [[calls]]
    return diagnose_episode(upto, replay_calls(upto, played)).labels[index] in SUCCESS_LABELS


def any_call_turns(task: Task) -> list[int]:
    """The turns with ground-truth calls that a single call of another argument-free tool passes."""
    found = []
    for index, truth in enumerate(task.ground_truth):
        if not truth:
            continue  # an abstention turn: BFCL's verdict skips it, whatever the model does
        own = {call.name for text in truth for call in parse_calls(text).calls}
        others = [doc["name"] for doc in task.visible_functions(index)
                  if doc["name"] not in own and not doc.get("parameters", {}).get("required")]
        if any(passes_with(task, index, [f"{name}()"]) for name in others):
            found.append(index)
    return found


def wrong_value(value):
    """A value of the same JSON type that no ground truth uses."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7919
    if isinstance(value, float):
        return value + 7919.5
    if isinstance(value, str):
        return WRONG_TEXT
    if isinstance(value, list):
        return [wrong_value(item) for item in value] or [WRONG_TEXT]
    if isinstance(value, dict):
        return {key: wrong_value(item) for key, item in value.items()} or {WRONG_TEXT: WRONG_TEXT}
    return WRONG_TEXT  # None


def with_wrong_arguments(calls: list[str]) -> list[str] | None:
    """The ground-truth call strings with every argument wrong, or None when none of them takes an argument."""
    parsed = [call for text in calls for call in parse_calls(text).calls]
    if not any(call.arguments or call.positional for call in parsed):
        return None
    return [ToolCall(call.name, {key: wrong_value(value) for key, value in call.arguments.items()},
                     tuple(wrong_value(value) for value in call.positional)).to_python() for call in parsed]


def argument_blind_turns(task: Task) -> list[int]:
    """The turns that pass with every argument of their ground-truth calls wrong."""
    return [index for index, truth in enumerate(task.ground_truth)
            if (wrong := with_wrong_arguments(truth)) is not None and passes_with(task, index, wrong)]
