"""The records that pass between the layers: what a call, a turn, an episode and a step produced.

Every layer above the core speaks in these types; none of them knows a third-party library. The string enums
name the values a status, a stop reason or a label can take (they compare equal to their strings, which is what
the store keeps).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from seal_lite.core.calls import ToolCall


class _Name(StrEnum):
    """A string with a name: shown, printed in lists and stored exactly as the plain string it equals."""

    __repr__ = str.__repr__


class CallStatus(_Name):
    """What became of one call in a model message."""

    OK = "ok"
    TOOL_ERROR = "tool_error"  # the tool ran and reported an error
    ARGUMENT_ERROR = "argument_error"  # missing, unexpected or mistyped arguments
    PARSE_ERROR = "parse_error"  # the text is not a call
    UNKNOWN_TOOL = "unknown_tool"  # names a tool this turn does not show
    REJECTED = "rejected"  # refused before it ran (the official service's invalid format)


class Label(_Name):
    """A ground-truth turn's failure label (docs/method.md §3), one per turn; the rule is core/labels.py."""

    GT_ERROR = "gt_error"
    SPURIOUS_TOOL_CALL = "spurious_tool_call"
    CORRECT_ABSTENTION = "correct_abstention"
    EMPTY_TURN_MODEL_RESPONSE = "empty_turn_model_response"
    INSTANCE_MISMATCH = "instance_mismatch"
    CHECKER_ERROR = "checker_error"
    STATE_MISMATCH = "state_mismatch"
    RESPONSE_MISMATCH = "response_mismatch"
    PASS = "pass"


# Statuses of an attempted call that never ran: unparseable, naming a tool the turn does not show, or sent in the
# same message as such a call under the strict parser. None of them is a decoded call (docs/method.md §8).
REJECTED = frozenset({CallStatus.PARSE_ERROR, CallStatus.UNKNOWN_TOOL, CallStatus.REJECTED})


class StopReason(_Name):
    """Why an episode ended."""

    DONE = "done"  # every user turn was played
    CALL_BUDGET = "call_budget"  # rollout.max_model_calls
    RESPONSE_BUDGET = "response_budget"  # rollout.max_response_tokens (budget model_tokens)
    CONTEXT = "context"  # the next message would not fit rollout.max_context_tokens


# What the checker gets for a call naming a function that no class of the task has. bfcl-eval's checker, given
# such a call, runs it as a failed call (its executor records "Error during execution: name ... is not
# defined"): the turn is not empty, and nothing changes state. This constant is not a defined name, so the
# checker does exactly that, and no model text (a name like "exit" or "open") ever reaches its eval.
NO_SUCH_FUNCTION_CALL = "seal_lite_no_such_function()"


@dataclass
class TurnEvidence:
    """What replaying one ground-truth turn showed. Filled by the environment adapter."""

    gt_calls: int  # number of ground-truth calls in the turn
    model_calls: int  # calls the model attempted (parsed or not)
    decoded_calls: int  # accepted calls: parsed and visible this turn, run, and seen by the official checker
    failed_unknown_calls: int = 0  # calls to functions the task does not have: never run, yet the checker sees
    # them as failed calls (bfcl-eval's does); they count for the verdict, not for the label
    gt_error: str | None = None
    checker_error: str | None = None
    instances_match: bool = True
    state_match: bool = True
    response_match: bool = True
    parse_errors: int = 0  # unparseable call text
    unknown_tools: int = 0  # calls to tools not visible this turn
    argument_errors: int = 0  # tool errors about missing/unexpected/mistyped arguments
    unrepaired_tool_error: bool = False  # a tool error in the turn was not followed by a successful call
    differences: list[str] = field(default_factory=list)  # human-readable evidence


@dataclass
class CallOutcome:
    call: ToolCall | None  # None when the text could not be parsed
    result: str
    status: CallStatus
    canonical: str = ""  # the call as dispatched, in BFCL python form (tools may later mutate argument lists)
    exists: bool = True  # the call names a method of the task's classes (visible this turn or not)

    @property
    def executed(self) -> bool:
        return self.status not in REJECTED

    @property
    def shown(self) -> str:
        """The call as text for people (and the store)."""
        return self.canonical or (self.call.to_python() if self.call else "(unparseable)")

    @property
    def checker_call(self) -> str | None:
        """The call string the official checker gets: the dispatched call; NO_SUCH_FUNCTION_CALL for a call to a
        function the task does not have, which bfcl-eval's checker would run as a failed call; None for a call
        that was rejected otherwise (unparseable, or naming a tool of the task that this turn does not show:
        bfcl-eval's executor would run that one, the environment does not). The verdict is the checker's on
        these calls; labels count accepted calls only (``TurnEvidence.decoded_calls``), as in the SEAL release."""
        if self.executed:
            return self.canonical
        return NO_SUCH_FUNCTION_CALL if self.status == CallStatus.UNKNOWN_TOOL and not self.exists else None


@dataclass
class TurnRecord:
    """What happened in one user turn of an episode."""

    user_text: str
    outcomes_per_step: list[list[CallOutcome]] = field(default_factory=list)

    @property
    def outcomes(self) -> list[CallOutcome]:
        return [outcome for step in self.outcomes_per_step for outcome in step]

    def checker_steps(self) -> list[list[str]]:
        """Call strings per model step as the official checker gets them (see ``CallOutcome.checker_call``)."""
        steps = [[o.checker_call for o in step if o.checker_call is not None] for step in self.outcomes_per_step]
        return [step for step in steps if step]


@dataclass
class TurnDiagnosis:
    label: str
    cause: str | None
    evidence: TurnEvidence


@dataclass
class EpisodeDiagnosis:
    valid: bool  # the official verdict: the reward
    error_type: str | None  # the official checker's reason when not valid
    irrelevance_valid: bool  # no call where the ground truth abstains (reported, never part of the verdict)
    turns: list[TurnDiagnosis]

    @property
    def labels(self) -> list[str]:
        return [turn.label for turn in self.turns]

    @property
    def causes(self) -> list[str | None]:
        return [turn.cause for turn in self.turns]


@dataclass
class Trajectory:
    task_id: str
    group_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]  # aligned with completion_ids; 1 = generated by the policy
    messages: list[dict]
    turns: list[TurnRecord]
    num_model_calls: int = 0
    stop_reason: str = StopReason.DONE
    sampled_logprobs: list[float] | None = None  # aligned with completion_ids (0 on env tokens); llama.cpp only

    def steps_per_turn(self) -> list[list[list[str]]]:
        return [turn.checker_steps() for turn in self.turns]


@dataclass
class Explanation:
    """The diagnoser's record for one failure, as stored in the ``diagnoses`` table."""

    key: str
    model: str
    status: str  # ok | invalid | failed (no answer: timeout, server gone)
    label: str | None = None
    cause: str | None = None
    culprit_call_index: int | None = None
    explanation: str | None = None
    recovery_hint: str | None = None
    redactions: int = 0
    seconds: float = 0.0
    error: str | None = None

    def row(self) -> dict:
        return dict(vars(self))


@dataclass
class StepReport:
    turns: int = 0  # failed turns handed in
    unique: int = 0  # distinct failures among them
    cached: int = 0  # answered from the store
    asked: int = 0  # requests sent to the model
    invalid: int = 0
    failed: int = 0
    redactions: int = 0
    restarts: int = 0
    skipped: int = 0  # over max_per_step, or after the backend gave up for this step
    seconds: float = 0.0
    new: list[Explanation] = field(default_factory=list)  # to write to the store



@dataclass
class RolloutBatch:
    """What one SEAL step hands the policy update, one entry per trajectory in TRL's prompt order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    env_mask: list[list[int]]
    rewards: list[float]
    advantages: list[float]  # already multiplied by the diagnosis weights
    sampled_logprobs: list[list[float]] | None = None  # the rollout engine's, when it is not the trained model
    step_signal: bool | None = None  # several processes: whether any advantage of the whole step is non-zero

    @classmethod
    def from_trajectories(cls, trajectories: list[Trajectory], rewards: list[float], advantages: list[float],
                          step_signal: bool | None = None, trained_tokens: int | None = None) -> RolloutBatch:
        """The batch of ``trajectories`` (in TRL's prompt order) with their rewards and final advantages; the
        sampling engine's log-probs go along when every trajectory has them. ``step_signal``: whether the step
        (all processes' batches) has any non-zero advantage, when this batch is only a part of it.
        ``trained_tokens``: each completion cut to its first that many tokens, environment tokens counted
        (``rollout.budget: release``); the rewards stay the whole episode's."""
        if not len(trajectories) == len(rewards) == len(advantages):
            raise ValueError(f"{len(trajectories)} trajectories, {len(rewards)} rewards and {len(advantages)} "
                             "advantages: give one of each per trajectory")
        window = slice(0, trained_tokens)
        return cls(
            prompt_ids=[t.prompt_ids for t in trajectories],
            completion_ids=[t.completion_ids[window] for t in trajectories],
            env_mask=[t.env_mask[window] for t in trajectories],
            rewards=list(rewards),
            advantages=list(advantages),
            sampled_logprobs=([t.sampled_logprobs[window] for t in trajectories]
                              if all(t.sampled_logprobs is not None for t in trajectories) else None),
            step_signal=step_signal,
        )


class Progress(Protocol):
    def screen_started(self, step: int, num_tasks: int) -> None: ...
    def task_screened(self, task_id: str, passes: int, samples: int) -> None: ...
    def tasks_excluded(self, task_ids: list[str], reason: str) -> None: ...  # left out of the screen
    def run_started(self, resumed_after: int, setup: str) -> None: ...
    def step_started(self, step: int, num_tasks: int) -> None: ...
    def task_done(self, task_id: str, rewards: list[float]) -> None: ...
    def step_finished(self, step: int, metrics: dict[str, float]) -> None: ...
    def validation_started(self, step: int, num_tasks: int) -> None: ...
    def task_validated(self, result) -> None: ...  # a held-out task's TaskResult (seal_lite/runs/evaluate_bfcl.py)
    def validated(self, step: int, score: dict[str, float], best: tuple[int, float]) -> None: ...


class NoProgress:
    def screen_started(self, step, num_tasks): pass
    def task_screened(self, task_id, passes, samples): pass
    def tasks_excluded(self, task_ids, reason): pass
    def run_started(self, resumed_after, setup): pass
    def step_started(self, step, num_tasks): pass
    def task_done(self, task_id, rewards): pass
    def step_finished(self, step, metrics): pass
    def validation_started(self, step, num_tasks): pass
    def task_validated(self, result): pass
    def validated(self, step, score, best): pass


@dataclass
class FailureStatistics:
    """C_t: label counts and the rewards of the trajectories they occurred in, for this epoch and in total."""

    window_counts: Counter = field(default_factory=Counter)
    window_reward_sums: defaultdict = field(default_factory=lambda: defaultdict(float))
    total_counts: Counter = field(default_factory=Counter)

    def add(self, labels: list[str], reward: float) -> None:
        for label in labels:
            self.window_counts[label] += 1
            self.window_reward_sums[label] += reward
            self.total_counts[label] += 1

    def window_mean_reward(self) -> dict[str, float]:
        return {label: self.window_reward_sums[label] / n for label, n in self.window_counts.items()}

    def reset_window(self) -> None:
        self.window_counts.clear()
        self.window_reward_sums.clear()

    def to_dict(self) -> dict:
        return {"window_counts": dict(self.window_counts), "window_reward_sums": dict(self.window_reward_sums),
                "total_counts": dict(self.total_counts)}

    @classmethod
    def from_dict(cls, data: dict) -> FailureStatistics:
        return cls(Counter(data["window_counts"]), defaultdict(float, data["window_reward_sums"]),
                   Counter(data["total_counts"]))
