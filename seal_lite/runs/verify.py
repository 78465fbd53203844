"""The ``seal-lite verify`` contract: call lists produced by any system, scored and labelled line by line.

One JSON object per input line, one result per line, in input order, optionally spread over worker processes.

Input line:  {"id": "multi_turn_base_0", "turns": [["cd(folder='document')", "ls()"], [], ...]}
    One entry per user turn. A turn is a list of call strings in BFCL python form (one model step), or a
    list of such lists (several steps, as in BFCL result files).
Output line: {"id", "valid", "labels", "causes", "error", "irrelevance_valid"}
    ``valid`` is bfcl-eval's official multi-turn verdict; ``labels``/``causes`` have one entry per ground-truth
    turn; ``irrelevance_valid`` is the check the official runner skips (it never changes ``valid``). A line
    that cannot be scored has ``valid: null`` and says why in ``error``; the other lines go on.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from seal_lite.core.errors import ConfigError
from seal_lite.envs.bfcl import load_tasks
from seal_lite.envs.registry import replay_calls
from seal_lite.step.verifier import diagnose_episode


class InputError(ConfigError):
    """A line that cannot be scored; the message says what to fix."""


def read_line(line: str) -> tuple[str, list[list[str | list[str]]]]:
    """Validate one input line; returns (task id, turns) or raises InputError."""
    try:
        record = json.loads(line)
    except ValueError as error:
        raise InputError(f"not valid JSON ({error})") from None
    if not isinstance(record, dict):
        raise InputError('expected an object like {"id": "multi_turn_base_0", "turns": [[...], ...]}')
    task_id, turns = record.get("id"), record.get("turns")
    if not isinstance(task_id, str):
        raise InputError('"id" must be a BFCL multi-turn id string, like "multi_turn_base_0"')
    if not isinstance(turns, list):
        raise InputError('"turns" must be a list with one list of call strings per user turn')
    for index, turn in enumerate(turns):
        if isinstance(turn, list) and all(isinstance(item, str) for item in turn):
            continue
        if isinstance(turn, list) and all(isinstance(step, list) and all(isinstance(c, str) for c in step) for step in turn):
            continue
        raise InputError(f"turn {index} must be a list of call strings, or a list of such lists (one per step)")
    return task_id, turns


def verify_line(line: str, line_number: int = 1) -> dict:
    """Score one input line; never raises."""
    task_id = None
    try:
        task_id, turns = read_line(line)
        try:
            (task,) = load_tasks([task_id])
        except KeyError as error:
            raise InputError(error.args[0]) from None
        if len(turns) != len(task.ground_truth):
            raise InputError(f"{task_id} has {len(task.ground_truth)} user turns, the line has {len(turns)}; "
                             "give one list of calls per user turn ([] for a turn without calls)")
        steps = [[turn] if turn and isinstance(turn[0], str) else turn for turn in turns]  # flat = one step
        diagnosis = diagnose_episode(task, replay_calls(task, steps))
    except InputError as error:
        return _error_record(task_id, f"line {line_number}: {error}")
    except Exception as error:  # a bug must cost one line, not the file
        return _error_record(task_id, f"line {line_number}: internal error {type(error).__name__}: {error}")
    return {"id": task_id, "valid": diagnosis.valid, "labels": diagnosis.labels, "causes": diagnosis.causes,
            "error": None, "irrelevance_valid": diagnosis.irrelevance_valid}


def _error_record(task_id, message: str) -> dict:
    return {"id": task_id, "valid": None, "labels": [], "causes": [], "error": message, "irrelevance_valid": None}


def verify_lines(lines: Iterable[str], workers: int = 1) -> Iterator[dict]:
    """Score JSONL lines in order; blank lines are skipped. ``workers`` > 1 uses that many processes.

    Episodes share nothing (fresh API instances, a unique checker cache key each), so the workers give the
    same results as one process.
    """
    numbered = [(line, number) for number, line in enumerate(lines, start=1) if line.strip()]
    if workers <= 1:
        yield from (verify_line(line, number) for line, number in numbered)
        return
    # spawn, not fork: the caller may hold threads (torch, tokenizers) that fork would copy half-way.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        texts, numbers = zip(*numbered) if numbered else ((), ())
        yield from pool.map(verify_line, texts, numbers, chunksize=8)
