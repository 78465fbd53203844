"""What every training environment gives the SEAL loop: tasks, a fresh episode per rollout, the verdict, turn evidence.

A task is user turns with the right calls for each (an empty list where the turn must be declined), and the tool
docs it shows. An ``Environment`` makes tasks, plays one episode's calls on fresh state, and explains each turn
with executable evidence (``TurnEvidence``): the rest of seal-lite (the step, the labels, the interface, the
store, ``eval``) reads only these. BFCL multi-turn is one environment (seal_lite/envs/bfcl.py); a user's Python
tool class is another (seal_lite/envs/python_tools.py); seal_lite/envs/registry.py finds one by name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from seal_lite.core.types import CallOutcome, TurnEvidence, TurnRecord

# bfcl-eval's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING (a test checks they stay equal): the user message
# of a turn that only reveals tools, as the SEAL release sends it
ADDITIONAL_FUNCTIONS_PROMPT = "{functions}\nI have updated some more functions you can choose from. What about now?"


@dataclass
class Task:
    id: str
    category: str
    turns: list[list[dict]]  # user messages per turn ([] for a turn that only reveals tools)
    functions: list[dict]  # tool docs visible from the first turn
    revealed: dict[int, list[dict]]  # turn index -> tool docs that become visible at that turn
    ground_truth: list[list[str]]  # call strings per turn, in Python call syntax ([] where the turn is declined)
    initial_config: dict  # the state an episode starts from, per tool class
    involved_classes: list[str]  # the tool classes an episode holds
    environment: str = "bfcl"  # the name of the Environment the task belongs to

    @property
    def long_context(self) -> bool:
        return self.category == "long_context"

    def truncated(self, max_turns: int | None) -> Task:
        """The same task cut to its first ``max_turns`` turns (its ground truth cut alike)."""
        if max_turns is None or max_turns >= len(self.turns):
            return self
        return dataclasses.replace(self, turns=self.turns[:max_turns], ground_truth=self.ground_truth[:max_turns])

    def visible_functions(self, turn_index: int) -> list[dict]:
        docs = list(self.functions)
        for index in sorted(self.revealed):
            if index <= turn_index:
                docs.extend(self.revealed[index])
        return docs

    def user_message(self, turn_index: int) -> str:
        """The text of a user turn as the official surface sends it; a turn that only reveals tools gets
        bfcl-eval's additional-function prompt with the revealed docs."""
        messages = self.turns[turn_index]
        if not messages:
            return additional_functions_prompt(json.dumps(self.revealed.get(turn_index, []), ensure_ascii=False))
        return "\n".join(message["content"] for message in messages)


def additional_functions_prompt(functions_text: str) -> str:
    """The user message of a turn that reveals tools: bfcl-eval's additional-function prompt around the revealed
    docs, as the SEAL release sends it (its system message is never re-rendered, so the docs travel here)."""
    return ADDITIONAL_FUNCTIONS_PROMPT.format(functions=functions_text)


class Episode(Protocol):
    """One rollout's live tools, on fresh state."""

    def run(self, model_text: str, turn_index: int, parser: str = "lenient") -> list[CallOutcome]:
        """Parse one model message and execute its calls (never evaluating its text): one outcome per attempt."""
        ...


class Environment(Protocol):
    """Where tasks come from, how an episode plays them, and how a played episode is judged and explained."""

    name: str  # what data.environment names it by, and what its tasks' ``environment`` holds
    categories: tuple[str, ...]  # its task categories, in the order results are shown

    def split_ids(self, split: str, categories: Sequence[str] | None = None) -> list[str]:
        """The ids of ``split`` (train or eval) in ``categories`` (default: all), in a fixed order."""
        ...

    def category_of(self, task_id: str) -> str:
        """A task's category; KeyError, with a message naming what ids look like, for an id it does not have."""
        ...

    def load_tasks(self, task_ids: list[str]) -> list[Task]:
        """Fresh copies of the tasks, in the given order; KeyError naming an unknown id."""
        ...

    def episode(self, task: Task) -> Episode:
        """The tools of one episode of ``task``, in its initial state."""
        ...

    def verdict(self, task: Task, steps_per_turn: list[list[list[str]]]) -> dict:
        """{"valid": bool, "error_type": str | None} for an episode's accepted calls (``TurnRecord.checker_steps``
        per turn): the reward. Turns the episode never reached count as empty."""
        ...

    def irrelevance(self, task: Task, steps_per_turn: list[list[list[str]]]) -> bool:
        """No call in a turn whose ground truth is empty (a metric beside the verdict)."""
        ...

    def turn_evidence(self, task: Task, turns: list[TurnRecord]) -> list[TurnEvidence]:
        """One ``TurnEvidence`` per ground-truth turn: every turn replayed, not only those up to a failure."""
        ...


def every_turn(task: Task, steps_per_turn: list[list[list[str]]]) -> list[list[list[str]]]:
    """Steps for every ground-truth turn: turns the episode never reached count as empty."""
    return list(steps_per_turn) + [[]] * (len(task.ground_truth) - len(steps_per_turn))
