"""The metric names a run writes to its store's ``metrics`` table (one row per step and name), defined once.

Each ``Metric`` is a name, or a pattern with one ``<placeholder>`` such as ``labels/<label>_rate``, with a one-line
description. core/records.py builds a step's metrics under these names, training/grpo.py writes the update's,
console.py reads them, and docs/store.md's metric list is generated from ``METRICS`` (scripts/make_docs.py).
tests/scripted/test_metrics.py checks that a step emits exactly the names listed here.

The namespaces, as CleanRL's ``charts/`` and ``losses/``: ``reward/`` and ``verdict/`` the official verdict,
``grpo/`` the advantages, weights and TRL's update, ``labels/`` and ``rho/`` the diagnosis, ``interface/`` the
training interface, ``sampling/`` and ``screen/`` which tasks were played, ``diagnoser/`` the local model,
``tokens/`` and ``time/`` the cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from seal_lite.core.labels import BASE_UTILITY, EXCLUDED_LABELS

PLACEHOLDER = re.compile(r"<(\w+)>")


@dataclass(frozen=True)
class Metric:
    """A metric's name (or pattern), what it measures, and who writes it: the step, with its rows, or the update,
    after TRL's optimizer steps. ``values``: a pattern's possible values, where they are known in advance."""

    name: str
    description: str
    writer: Literal["step", "update"] = "step"
    values: tuple[str, ...] = ()

    @property
    def is_pattern(self) -> bool:
        return PLACEHOLDER.search(self.name) is not None

    def key(self, value: str) -> str:
        """The pattern's name for one value: ``LABEL_RATE.key("pass") == "labels/pass_rate"``."""
        prefix, _, suffix = PLACEHOLDER.split(self.name, maxsplit=1)
        return f"{prefix}{value}{suffix}"

    def value_of(self, key: str) -> str | None:
        """The placeholder's value in ``key`` if ``key`` is one of this pattern's names, else None."""
        if not self.is_pattern:
            return None
        prefix, _, suffix = PLACEHOLDER.split(self.name, maxsplit=1)
        if not key.startswith(prefix) or not key.endswith(suffix):
            return None
        value = key[len(prefix) : len(key) - len(suffix)]
        return value if value and (not self.values or value in self.values) else None

    def values_in(self, metrics: dict[str, float]) -> dict[str, float]:
        """The entries of ``metrics`` under this pattern, by placeholder value: ``{"pass": 0.5}``."""
        found = {key: self.value_of(key) for key in metrics}
        return {value: metrics[key] for key, value in found.items() if value is not None}


LABELS = tuple(BASE_UTILITY)
COUNTED_LABELS = tuple(label for label in LABELS if label not in EXCLUDED_LABELS)
# the phases of seal_lite/core/timing.py a step can spend time in
PHASES = ("sync", "rescreen", "render", "generate", "prefill", "decode", "environment", "verify")

REWARD_MEAN = Metric("reward/mean", "mean official verdict over the groups the step drew (the `steps` table's "
                     "`reward_mean`)")
REWARD_UPDATE_MEAN = Metric("reward/update_mean", "mean official verdict over the groups the update took: "
                            "`reward/mean` unless `grpo.dynamic_sampling` replaced some")
IRRELEVANCE_PASS_RATE = Metric("verdict/irrelevance_pass_rate", "share of trajectories that made no call where "
                               "the ground truth abstains; never part of the reward")
WEIGHT_MEAN = Metric("grpo/weight_mean", "mean diagnosis weight w over the update's trajectories")
WEIGHT_MIN = Metric("grpo/weight_min", "smallest diagnosis weight w (the `steps` table's `weight_min`)")
WEIGHT_MAX = Metric("grpo/weight_max", "largest diagnosis weight w (the `steps` table's `weight_max`)")
ADVANTAGE_ABS_MEAN = Metric("grpo/advantage_abs_mean", "mean |w·A| over the update's trajectories: 0 when no "
                            "group has a learning signal")
GROUPS_WITH_SIGNAL = Metric("grpo/groups_with_signal", "share of the update's groups with unequal rewards")
GROUPS_ROLLED_OUT = Metric("sampling/groups_rolled_out", "groups played, dynamic sampling's extra ones included")
DRAWN_GROUPS_WITH_SIGNAL = Metric("sampling/drawn_groups_with_signal", "share of the groups the step drew with "
                                  "unequal rewards, before any replacement (the report's signal bars)")
INTERFACE_VERSION = Metric("interface/version", "the training interface version the step rolled out under")
INTERFACE_GUIDELINES = Metric("interface/guidelines", "φ_cap guideline lines in force during the step")
ROLLOUT_SECONDS = Metric("time/rollout_s", "seconds from the start of the step to its store write: rollouts, "
                         "verdicts, diagnosis (the update comes after)")
TOKENS_MODEL = Metric("tokens/model", "tokens the policy wrote in the update's trajectories (the tokens with loss)")
TOKENS_TOTAL = Metric("tokens/total", "prompt and completion tokens of the update's trajectories")
FRONTIER_TASKS = Metric("screen/frontier_tasks", "tasks the step drew from (with `data.rescreen_every`)")
RESCREEN_KEPT = Metric("screen/rescreen_kept", "tasks the re-screen before this step kept on the frontier")
RESCREENED_TASKS = Metric("screen/rescreened_tasks", "tasks the re-screen before this step played")
LABEL_COUNT = Metric("labels/<label>", "turns given this label (docs/method.md §3) in the update's trajectories",
                     values=LABELS)
LABEL_RATE = Metric("labels/<label>_rate", "this label's share of the countable labels (all but `checker_error` "
                    "and `gt_error`)", values=COUNTED_LABELS)
RHO = Metric("rho/<label>", "the label's utility ρ after the step's closed-loop update (docs/method.md §5)",
             values=COUNTED_LABELS)
PHASE_SECONDS = Metric("time/<phase>_s", "seconds the step spent in a phase: `sync` (exporting the LoRA for "
                       "llama.cpp), `rescreen` (whose rollouts also count in the phases after it), `render`, "
                       "`generate` (prefill + decode + the engine's overhead), `prefill`, `decode`, `environment`, "
                       "`verify`", values=PHASES)
# the diagnoser's metrics, by the StepReport field each one reports (seal_lite/core/types.py)
DIAGNOSER_COUNTS = {
    "turns": Metric("diagnoser/turns", "failed turns handed to the diagnoser"),
    "unique": Metric("diagnoser/unique", "distinct failures among them"),
    "cached": Metric("diagnoser/cached", "failures answered from the store's `diagnoses`"),
    "asked": Metric("diagnoser/asked", "requests sent to the model"),
    "invalid": Metric("diagnoser/invalid", "answers that broke the answer rules"),
    "failed": Metric("diagnoser/failed", "requests with no answer (timeout, server gone)"),
    "redactions": Metric("diagnoser/redactions", "ground-truth values removed from the hints"),
    "restarts": Metric("diagnoser/restarts", "restarts of the diagnoser's server"),
    "skipped": Metric("diagnoser/skipped", "failures not asked about: over `diagnoser.max_per_step`, or after the "
                                           "backend gave up for the step"),
    "seconds": Metric("diagnoser/seconds", "seconds the diagnoser took"),
}
LABEL_AGREEMENT = Metric("diagnoser/label_agreement", "share of valid answers whose label equals the rule label")
STORE_SECONDS = Metric("time/store_s", "seconds the step's store write took")

TRL_LOG = Metric("grpo/<name>", "TRL's own log of the update, averaged over the step's optimizer steps: `loss`, "
                 "`kl`, `grad_norm`, `entropy`, `clip_ratio/…`, `update_skipped` (1: no learning signal, the "
                 "forward and backward passes were skipped), …", writer="update")
LORA_NORM = Metric("grpo/lora_norm", "norm of all LoRA parameters: it moves only when an update changed the "
                   "adapter", writer="update")
LORA_CHANGE = Metric("grpo/lora_change", "norm of the change the step's update made to the LoRA parameters (0: "
                     "the update was skipped or moved nothing)", writer="update")
ENGINE_GAP_MEAN = Metric("grpo/engine/logprob_gap_mean", "llama.cpp or vLLM rollouts: mean |log-prob gap| between "
                         "the rollout engine and the trained model on the generated tokens", writer="update")
ENGINE_GAP_MAX = Metric("grpo/engine/logprob_gap_max", "llama.cpp or vLLM rollouts: the largest such gap",
                        writer="update")
ENGINE_FILTERED_SHARE = Metric("grpo/engine/filtered_share", "llama.cpp or vLLM rollouts: share of the generated tokens "
                               "taken out of the loss (gap over `rollout.max_logprob_gap`)", writer="update")
UPDATE_SECONDS = Metric("time/update_s", "seconds of the policy update after the step's rollouts", writer="update")

METRICS: tuple[Metric, ...] = (
    REWARD_MEAN, REWARD_UPDATE_MEAN, IRRELEVANCE_PASS_RATE,
    WEIGHT_MEAN, WEIGHT_MIN, WEIGHT_MAX, ADVANTAGE_ABS_MEAN, GROUPS_WITH_SIGNAL,
    GROUPS_ROLLED_OUT, DRAWN_GROUPS_WITH_SIGNAL, FRONTIER_TASKS, RESCREEN_KEPT, RESCREENED_TASKS,
    LABEL_COUNT, LABEL_RATE, RHO, INTERFACE_VERSION, INTERFACE_GUIDELINES,
    *DIAGNOSER_COUNTS.values(), LABEL_AGREEMENT,
    TOKENS_MODEL, TOKENS_TOTAL, ROLLOUT_SECONDS, PHASE_SECONDS, STORE_SECONDS,
    TRL_LOG, LORA_NORM, LORA_CHANGE, ENGINE_GAP_MEAN, ENGINE_GAP_MAX, ENGINE_FILTERED_SHARE, UPDATE_SECONDS,
)


def describe(key: str) -> Metric | None:
    """The documented metric ``key`` is, or None: a name first, then a pattern with known values, then TRL's log."""
    exact = [metric for metric in METRICS if metric.name == key]
    patterns = sorted((metric for metric in METRICS if metric.value_of(key) is not None),
                      key=lambda metric: not metric.values)
    return (exact + patterns + [None])[0]
