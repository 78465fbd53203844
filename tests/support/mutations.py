"""A deterministic corpus of near-miss trajectories built from BFCL ground truth, to test verdict exactness.

Each mutant is the ground-truth call list of one entry with one edit of a kind a policy makes: a dropped call,
an emptied turn, an altered argument value, a duplicated call, two calls of a turn swapped, a call inserted
from another turn, or a call replaced by a call to a function the task does not have. Inserted calls use only
tools visible at that turn (the environment refuses the others by design, where bfcl-eval's executor would run
them). The same data always yields the same corpus: every random
choice comes from a generator seeded with the entry id and the kind.

    from tests.support.mutations import corpus
    for mutant in corpus(tasks): ...  # mutant.turns: call strings per user turn
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from seal_lite.core.calls import ToolCall, parse_calls
from seal_lite.envs.bfcl import Task


@dataclass(frozen=True)
class Mutant:
    id: str  # "<task id>/<kind>"
    task_id: str
    kind: str
    turns: list[list[str]]  # call strings per user turn


def corpus(tasks: list[Task]) -> list[Mutant]:
    return [mutant for task in tasks for mutant in mutants(task)]


def mutants(task: Task) -> list[Mutant]:
    """One mutant per kind that applies to this task."""
    made = []
    for kind, mutate in KINDS.items():
        rng = random.Random(f"{task.id}/{kind}")
        turns = mutate([list(turn) for turn in task.ground_truth], task, rng)
        if turns is not None and turns != task.ground_truth:
            made.append(Mutant(f"{task.id}/{kind}", task.id, kind, turns))
    return made


def _call_positions(turns: list[list[str]]) -> list[tuple[int, int]]:
    return [(t, c) for t, turn in enumerate(turns) for c in range(len(turn))]


def drop_call(turns, task, rng):
    positions = _call_positions(turns)
    if not positions:
        return None
    t, c = rng.choice(positions)
    del turns[t][c]
    return turns


def drop_turn(turns, task, rng):
    non_empty = [t for t, turn in enumerate(turns) if turn]
    if not non_empty:
        return None
    turns[rng.choice(non_empty)] = []
    return turns


def alter_argument(turns, task, rng):
    positions = [(t, c) for t, c in _call_positions(turns) if _parse(turns[t][c]).arguments]
    if not positions:
        return None
    t, c = rng.choice(positions)
    call = _parse(turns[t][c])
    key = rng.choice(sorted(call.arguments))
    arguments = dict(call.arguments, **{key: altered(call.arguments[key], rng)})
    turns[t][c] = ToolCall(call.name, arguments, call.positional).to_python()
    return turns


def altered(value, rng: random.Random):
    """A different value of the same JSON type, the kind of slip a policy makes."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 10])
    if isinstance(value, float):
        return round(value * 2 + 1, 2)
    if isinstance(value, str):
        return rng.choice([other for other in (value + "_x", value.swapcase(), value[:-1] or "x") if other != value])
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {}
    return "x"


def duplicate_call(turns, task, rng):
    positions = _call_positions(turns)
    if not positions:
        return None
    t, c = rng.choice(positions)
    turns[t].insert(c + 1, turns[t][c])
    return turns


def swap_calls(turns, task, rng):
    candidates = [t for t, turn in enumerate(turns) if len(set(turn)) > 1]
    if not candidates:
        return None
    t = rng.choice(candidates)
    i, j = rng.sample(range(len(turns[t])), 2)
    turns[t][i], turns[t][j] = turns[t][j], turns[t][i]
    return turns


def insert_call(turns, task, rng):
    options = []
    for target in range(len(turns)):
        visible = {doc["name"] for doc in task.visible_functions(target)}
        for source, turn in enumerate(task.ground_truth):
            options += [(target, call) for call in turn if source != target and _parse(call).name in visible]
    if not options:
        return None
    target, call = rng.choice(options)
    turns[target].insert(rng.randint(0, len(turns[target])), call)
    return turns


def unknown_function(turns, task, rng):
    """A call replaced by the same arguments sent to a function no class of the task has (a made-up name)."""
    positions = _call_positions(turns)
    if not positions:
        return None
    t, c = rng.choice(positions)
    call = _parse(turns[t][c])
    known = {doc["name"] for doc in task.visible_functions(len(task.ground_truth))}
    name = next(f"{call.name}{suffix}" for suffix in ("_v2", "_tool", "_api") if f"{call.name}{suffix}" not in known)
    turns[t][c] = ToolCall(name, call.arguments, call.positional).to_python()
    return turns


def _parse(text: str) -> ToolCall:
    (call,) = parse_calls(text).calls
    return call


KINDS: dict[str, Callable] = {
    "drop_call": drop_call,
    "drop_turn": drop_turn,
    "alter_argument": alter_argument,
    "duplicate_call": duplicate_call,
    "swap_calls": swap_calls,
    "insert_call": insert_call,
    "unknown_function": unknown_function,
}
