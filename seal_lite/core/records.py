"""A SEAL step as store rows and metrics: pure functions from what the step computed to what it records.

``step_records`` runs once per step (seal_lite/step/algorithm.py) and returns the ``steps`` row, the
``trajectories`` and ``turns`` rows, the step's metrics (named in core/metrics.py), the diagnoser's new answers
and the ``interface_versions`` row of an interface the step evolved; ``Store.save_step`` writes them in one
transaction. docs/store.md describes every column and metric.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from seal_lite.core import metrics as m
from seal_lite.core.advantages import share_with_signal
from seal_lite.core.interface import SCHEMA_CUE_LINE, TaskView, TrainingInterface
from seal_lite.core.labels import EXCLUDED_LABELS
from seal_lite.core.recipe import InterfaceConfig, Recipe
from seal_lite.core.types import EpisodeDiagnosis, Explanation, FailureStatistics, StepReport, Trajectory


def rewards(diagnoses: Iterable[EpisodeDiagnosis]) -> list[float]:
    """The reward of each episode: its official verdict, 1.0 or 0.0."""
    return [1.0 if diagnosis.valid else 0.0 for diagnosis in diagnoses]


@dataclass
class Scored:
    """The trajectories the update takes and what the step computed for each, in the same order."""

    trajectories: list[Trajectory]
    diagnoses: list[EpisodeDiagnosis]
    answers: list[dict[int, Explanation]]  # the diagnoser's answers, by turn index
    labels: list[list[str]]  # the labels that count: the rule's, or the diagnoser's where it is the authority
    advantages: list[float]  # A_j
    weights: list[float]  # w_j
    weighted: list[float]  # w_j * A_j, what the update uses


@dataclass
class StepRecords:
    """One step's rows for ``Store.save_step``, and its metrics by name."""

    step: dict
    trajectories: list[dict]
    turns: list[dict]
    metrics: dict[str, float]
    diagnoses: list[dict]  # the diagnoser's answers new to the store
    interface_version: dict | None  # the version the step evolved, if it did


def step_records(*, step: int, started: float, rollout_seconds: float, phase_seconds: dict[str, float],
                 tasks: Mapping[str, TaskView], scored: Scored, drawn: list[list[float]], rolled_out: int,
                 recipe: Recipe, interface: TrainingInterface, version: int,
                 evolved: tuple[TrainingInterface, int] | None, statistics: FailureStatistics,
                 utilities: dict[str, float], frontier: list[str], rescreened: tuple[int, int] | None,
                 report: StepReport | None) -> StepRecords:
    """Everything the store keeps of step ``step``: ``drawn`` holds the rewards of the groups the step drew (before
    dynamic sampling replaced any), ``interface`` and ``version`` the interface it rolled out under, ``evolved``
    the next one (or None), ``rescreened`` a re-screen's (tasks kept, tasks screened) before the step."""
    trajectories = [trajectory_row(step, trajectory, reward, advantage, weight, weighted, version)
                    for trajectory, reward, advantage, weight, weighted in zip(
                        scored.trajectories, rewards(scored.diagnoses), scored.advantages, scored.weights,
                        scored.weighted)]
    turns = [row for trajectory, diagnosis, answers in zip(scored.trajectories, scored.diagnoses, scored.answers)
             for row in turn_rows(step, tasks[trajectory.task_id], trajectory, diagnosis, answers)]
    metrics = step_metrics(scored, trajectories, recipe.rollout.num_generations, drawn, rolled_out, interface, version,
                           rollout_seconds)
    if recipe.data.rescreen_every:
        metrics[m.FRONTIER_TASKS.name] = len(frontier)
    if rescreened:
        metrics[m.RESCREEN_KEPT.name], metrics[m.RESCREENED_TASKS.name] = rescreened
    metrics |= label_metrics(scored.labels)
    metrics |= {m.RHO.key(label): value for label, value in utilities.items()}
    metrics |= {m.PHASE_SECONDS.key(name): seconds for name, seconds in phase_seconds.items()}
    if report is not None:
        metrics |= diagnoser_metrics(report, scored)
    step_row = {
        "step": step,
        "started_at": started,
        "reward_mean": metrics[m.REWARD_MEAN.name],
        "weight_min": metrics[m.WEIGHT_MIN.name],
        "weight_max": metrics[m.WEIGHT_MAX.name],
        "interface_version": version,
        "num_trajectories": len(trajectories),
    }
    version_record = None
    if evolved:
        version_record = version_row(version=evolved[1], parent=version, step=step, interface=evolved[0],
                                     previous=interface, config=recipe.interface, statistics=statistics)
    return StepRecords(step_row, trajectories, turns, metrics, [answer.row() for answer in report.new] if report else [],
                       version_record)


def step_metrics(scored: Scored, trajectories: list[dict], group_size: int, drawn: list[list[float]],
                 rolled_out: int, interface: TrainingInterface, version: int,
                 rollout_seconds: float) -> dict[str, float]:
    """The metrics every step has: rewards, weights, advantages, learning signal, interface and tokens."""
    update_rewards = rewards(scored.diagnoses)
    groups = [update_rewards[start : start + group_size] for start in range(0, len(update_rewards), group_size)]
    weights, diagnoses = scored.weights, scored.diagnoses
    return {
        m.REWARD_MEAN.name: sum(map(sum, drawn)) / sum(map(len, drawn)),
        m.REWARD_UPDATE_MEAN.name: sum(update_rewards) / len(update_rewards),
        m.IRRELEVANCE_PASS_RATE.name: sum(d.irrelevance_valid for d in diagnoses) / len(diagnoses),
        m.WEIGHT_MEAN.name: sum(weights) / len(weights),
        m.WEIGHT_MIN.name: min(weights),
        m.WEIGHT_MAX.name: max(weights),
        m.ADVANTAGE_ABS_MEAN.name: sum(abs(a) for a in scored.weighted) / len(scored.weighted),
        m.GROUPS_WITH_SIGNAL.name: share_with_signal(groups),
        m.GROUPS_ROLLED_OUT.name: rolled_out,
        m.DRAWN_GROUPS_WITH_SIGNAL.name: share_with_signal(drawn),
        m.INTERFACE_VERSION.name: version,
        m.INTERFACE_GUIDELINES.name: len(interface.guidelines),
        m.ROLLOUT_SECONDS.name: rollout_seconds,
        m.TOKENS_MODEL.name: sum(row["num_model_tokens"] for row in trajectories),
        m.TOKENS_TOTAL.name: sum(row["num_tokens"] for row in trajectories),
    }


def label_metrics(labels: list[list[str]]) -> dict[str, float]:
    """Each label's count, and each countable label's share of the countable labels."""
    counts = Counter(label for trajectory_labels in labels for label in trajectory_labels)
    counted = sum(n for label, n in counts.items() if label not in EXCLUDED_LABELS) or 1
    return ({m.LABEL_COUNT.key(label): n for label, n in counts.items()}
            | {m.LABEL_RATE.key(label): n / counted for label, n in counts.items() if label not in EXCLUDED_LABELS})


def diagnoser_metrics(report: StepReport, scored: Scored) -> dict[str, float]:
    """What the diagnoser did this step, and how often its label agrees with the rule label."""
    metrics = {metric.name: float(getattr(report, field)) for field, metric in m.DIAGNOSER_COUNTS.items()}
    pairs = [(answer.label, diagnosis.labels[index]) for diagnosis, answers in zip(scored.diagnoses, scored.answers)
             for index, answer in answers.items() if answer.status == "ok"]
    if pairs:
        metrics[m.LABEL_AGREEMENT.name] = sum(model == rule for model, rule in pairs) / len(pairs)
    return metrics


def trajectory_id(step: int, trajectory: Trajectory) -> str:
    return f"s{step}-{trajectory.task_id}-g{trajectory.group_index}"


def trajectory_row(step: int, trajectory: Trajectory, reward: float, advantage: float, weight: float,
                   weighted: float, version: int) -> dict:
    return {
        "id": trajectory_id(step, trajectory),
        "step": step,
        "task_id": trajectory.task_id,
        "group_index": trajectory.group_index,
        "reward": reward,
        "advantage": advantage,
        "weight": weight,
        "weighted_advantage": weighted,
        "num_model_calls": trajectory.num_model_calls,
        "num_tokens": len(trajectory.prompt_ids) + len(trajectory.completion_ids),
        "num_model_tokens": sum(trajectory.env_mask),
        "stop_reason": trajectory.stop_reason,
        "interface_version": version,
        "messages": trajectory.messages,
    }


def turn_rows(step: int, task: TaskView, trajectory: Trajectory, diagnosis: EpisodeDiagnosis,
              answers: dict[int, Explanation]) -> list[dict]:
    """One row per ground-truth turn: what the model did, the ground truth, the label and its evidence."""
    rows = []
    for index, turn in enumerate(diagnosis.turns):
        record = trajectory.turns[index] if index < len(trajectory.turns) else None
        outcomes = record.outcomes if record else []
        rows.append({
            "trajectory_id": trajectory_id(step, trajectory),
            "turn_index": index,
            "user_text": record.user_text if record else task.user_message(index),
            "model_calls": [o.shown for o in outcomes],
            "results": [o.result[:500] for o in outcomes],
            "gt_calls": task.ground_truth[index],
            "label": turn.label,
            "cause": turn.cause,
            "diagnosis_key": answers[index].key if index in answers else None,
            "evidence": {"differences": turn.evidence.differences, "gt_error": turn.evidence.gt_error,
                         "checker_error": turn.evidence.checker_error, "statuses": [o.status for o in outcomes]},
        })
    return rows


def version_row(*, version: int, parent: int | None, step: int, interface: TrainingInterface,
                previous: TrainingInterface, config: InterfaceConfig, statistics: FailureStatistics) -> dict:
    """The ``interface_versions`` row of ``interface``, which followed ``previous`` after step ``step`` (the first
    version: parent None, step 0, ``previous`` itself); the reason names the guideline lines that changed."""
    added = [line for line in interface.guidelines if line not in previous.guidelines]
    removed = [line for line in previous.guidelines if line not in interface.guidelines]
    reason = "; ".join([f"guideline added: {line}" for line in added] +
                       [f"guideline removed: {line}" for line in removed]) or "initial training interface"
    window = {"counts": dict(statistics.window_counts),
              "mean_rewards": statistics.window_mean_reward()} if parent else {}
    return {
        "version": version, "parent": parent, "step": step, "reason": reason,
        "components": {"schema_cues": config.schema_cues, "recovery_feedback": config.recovery_feedback,
                       "capability_hints": config.capability_hints, "hints": config.hints,
                       "tool_format": config.tool_format, "call_format": interface.call_format},
        "system_prompt_cues": SCHEMA_CUE_LINE if config.schema_cues else "",
        "guidelines": list(interface.guidelines),
        "statistics": window,
    }
