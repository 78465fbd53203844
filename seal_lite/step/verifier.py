"""Whole episodes: the official verdict, the irrelevance metric, and one label per ground-truth turn.

``diagnose_episode`` is what the SEAL step calls for every rollout (steps 4 and 5 of docs/method.md §2); the
``seal-lite verify`` contract over it for any system's call lists is seal_lite/runs/verify.py.
"""

from __future__ import annotations

from seal_lite.core.labels import label_turn
from seal_lite.core.types import EpisodeDiagnosis, TurnDiagnosis, TurnRecord
from seal_lite.envs.registry import environment_of
from seal_lite.envs.task import Task


def diagnose_episode(task: Task, records: list[TurnRecord]) -> EpisodeDiagnosis:
    """Score one episode with its environment's verdict (on BFCL, the official checker) and label each of its
    ground-truth turns."""
    environment = environment_of(task)
    steps = [record.checker_steps() for record in records]
    verdict = environment.verdict(task, steps)
    turns = [TurnDiagnosis(*label_turn(evidence), evidence) for evidence in environment.turn_evidence(task, records)]
    return EpisodeDiagnosis(
        valid=bool(verdict["valid"]),
        error_type=verdict.get("error_type"),
        irrelevance_valid=environment.irrelevance(task, steps),
        turns=turns,
    )
