"""The BFCL multi-turn environment: tasks, a live episode, the official verdict, turn evidence.

This is the only module that imports ``bfcl_eval``. Three things happen here:

* ``load_tasks`` reads the real BFCL v3 multi-turn entries (shipped as BFCL_v4_multi_turn_*) with their tool
  docs and ground truth.
* ``episode`` holds fresh API instances for one episode, played by seal_lite/envs/tools.py's ``ToolEpisode``
  (model text is never evaluated).
* ``official_verdict`` runs bfcl-eval's own ``multi_turn_checker``, and ``turn_evidence`` replays the same
  calls turn by turn to explain every ground-truth turn. Both hand bfcl-eval only canonical call strings that
  seal-lite built from parsed literals (``ToolCall.to_python``), because bfcl-eval ``eval``s them.

``BFCL`` is all of it as an ``Environment`` (seal_lite/envs/task.py), the one ``data.environment: bfcl`` names.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path

from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, PROMPT_PATH
from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    MULTI_TURN_FUNC_DOC_FILE_MAPPING,
    STATELESS_CLASSES,
)
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

from seal_lite.core.types import TurnEvidence, TurnRecord
from seal_lite.envs.task import Task, every_turn
from seal_lite.envs.tools import ERROR_PREFIX, ToolEpisode, call_evidence

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")


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


def episode(task: Task) -> ToolEpisode:
    """Fresh BFCL API instances for one episode of ``task``."""
    return ToolEpisode(task, _new_instances(task))


# --- verdict and evidence ---------------------------------------------------------------------------------


def official_verdict(task: Task, steps_per_turn: list[list[list[str]]]) -> dict:
    """bfcl-eval's multi-turn verdict for checker call strings grouped per turn and per model step.

    Turns the episode never reached (it ran out of budget) count as empty, as in the official runner.
    Every check uses a fresh, unique model name so no state is shared through bfcl-eval's module-level
    instance cache, and that cache is emptied afterwards.
    """
    steps_per_turn = every_turn(task, steps_per_turn)
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
    steps_per_turn = every_turn(task, steps_per_turn)
    return checker.multi_turn_irrelevance_checker(steps_per_turn, task.ground_truth)["valid"]


def _forget_instances(model_name: str) -> None:
    cache = vars(multi_turn_utils)
    for key in [key for key in cache if key.startswith(model_name)]:
        del cache[key]


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
            evidence = call_evidence(len(gt_calls), outcomes)
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


class BfclEnvironment:
    """BFCL multi-turn as an ``Environment``: SEAL's train and eval splits of its four categories."""

    name = "bfcl"
    categories = CATEGORIES

    def split_ids(self, split: str, categories: Sequence[str] | None = None) -> list[str]:
        return split_ids(split, categories or CATEGORIES)

    def category_of(self, task_id: str) -> str:
        return category_of(task_id)

    def load_tasks(self, task_ids: list[str]) -> list[Task]:
        return load_tasks(task_ids)

    def episode(self, task: Task) -> ToolEpisode:
        return episode(task)

    def verdict(self, task: Task, steps_per_turn: list[list[list[str]]]) -> dict:
        return official_verdict(task, steps_per_turn)

    def irrelevance(self, task: Task, steps_per_turn: list[list[list[str]]]) -> bool:
        return official_irrelevance(task, steps_per_turn)

    def turn_evidence(self, task: Task, turns: list[TurnRecord]) -> list[TurnEvidence]:
        return turn_evidence(task, turns)


BFCL = BfclEnvironment()
