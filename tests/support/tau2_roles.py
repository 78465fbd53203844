"""τ²-bench's harness checked without a model: reference agents, and the predicates that pick the tasks they prove.

``OracleAgent`` replays the task's ground-truth actions (asking the user to do the user's ones) and states the
facts the task wants communicated; ``SilentAgent`` never does anything. Both play against ``ScriptedUser``, which
performs the user's ground-truth actions only when the agent has asked for them. ``oracle_roles`` and
``silent_roles`` hand them to ``seal_lite.envs.tau2_bench.play_task``: tests/scripted/test_tau2.py uses them to show
the verdict is reachable (1) and not free (0).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from seal_lite.envs import tau2_bench  # noqa: F401 (first: it quiets litellm and loguru before tau2 is imported)

# isort: split
from tau2.agent.base import LocalAgent
from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
from tau2.data_model.tasks import RewardType, Task
from tau2.environment.toolkit import ToolType
from tau2.registry import registry
from tau2.user.base import STOP, UserState
from tau2.user.user_simulator import UserSimulator


def reward_needs_the_user(task: Task) -> bool:
    """Whether the verdict depends on the user's own actions on their device (telecom's environment assertions)."""
    return any(action.requestor == "user" for action in task.evaluation_criteria.actions or [])


def changes_state(domain: str, task: Task) -> bool:
    """Whether the ground truth writes to the domain's database or the user's device: only then does doing
    nothing fail the DB and environment checks."""
    writes = _write_tools(domain)
    return any((action.requestor, action.name) in writes for action in task.evaluation_criteria.actions or [])


@functools.cache
def _write_tools(domain: str) -> frozenset[tuple[str, str]]:
    """(requestor, tool name) of the domain's tools that write (building an environment loads its database)."""
    environment = registry.get_env_constructor(domain)()
    return frozenset((requestor, name) for requestor, tools in (("assistant", environment.tools),
                                                                ("user", environment.user_tools))
                     if tools is not None for name in tools.get_tools() if tools.tool_type(name) == ToolType.WRITE)


def decided_by_actions(task: Task) -> bool:
    """Whether the verdict is fully decided by actions and resulting state: its basis is the DB, environment
    assertions or the actions, and no fact has to be said to the user."""
    criteria = task.evaluation_criteria
    return criteria is not None and RewardType.NL_ASSERTION not in criteria.reward_basis \
        and not criteria.communicate_info and bool(criteria.actions)


@dataclass
class _Script:
    """The task's ground-truth actions, shared by the oracle agent and the scripted user: who acts next."""

    task: Task
    position: int = 0
    asked: bool = False  # the agent has asked the user to do the user's next actions

    @property
    def actions(self) -> list:
        return self.task.evaluation_criteria.actions or []

    def next_requestor(self) -> str | None:
        return self.actions[self.position].requestor if self.position < len(self.actions) else None

    def take(self, requestor: str) -> ToolCall:
        action = self.actions[self.position]
        self.position += 1
        return ToolCall(id=f"{requestor}_{action.action_id}", name=action.name, arguments=dict(action.arguments),
                        requestor=requestor)


class OracleAgent(LocalAgent):
    """Replays the ground truth: its own actions as tool calls, the user's as requests, then states every fact the
    task wants communicated. An upper bound for the harness, not a policy."""

    def __init__(self, tools, domain_policy: str, script: _Script):
        super().__init__(tools=tools, domain_policy=domain_policy)
        self.script = script

    def get_init_state(self, message_history=None):
        return None

    def generate_next_message(self, message, state):
        script = self.script
        if script.next_requestor() == "assistant":
            return AssistantMessage(role="assistant", tool_calls=[script.take("assistant")]), state
        if script.next_requestor() == "user":
            script.asked = True
            action = script.actions[script.position]
            return AssistantMessage(role="assistant", content=f"Please do this on your device: {action.name} "
                                                              f"{json.dumps(action.arguments)}"), state
        facts = script.task.evaluation_criteria.communicate_info or []
        return AssistantMessage(role="assistant", content=" ".join(["All done.", *facts])), state

    def set_seed(self, seed: int) -> None:
        pass


class SilentAgent(LocalAgent):
    """Does nothing: answers every message without acting. The lower bound of the harness."""

    def get_init_state(self, message_history=None):
        return None

    def generate_next_message(self, message, state):
        return AssistantMessage(role="assistant", content="I am sorry, I cannot help with that."), state

    def set_seed(self, seed: int) -> None:
        pass


class ScriptedUser(UserSimulator):
    """A user without a model: performs the user's ground-truth actions when the agent asks for them, says it is
    done when the agent has nothing left to do, and gives up after ``patience`` messages that bring nothing."""

    def __init__(self, script: _Script, patience: int = 3):
        super().__init__(tools=None, instructions=None)
        self.script, self.patience, self.idle = script, patience, 0

    @property
    def system_prompt(self) -> str:
        return ""

    def _generate_next_message(self, message, state: UserState):
        script = self.script
        if script.asked and script.next_requestor() == "user":
            answer = UserMessage(role="user", tool_calls=[script.take("user")])
        elif script.asked:  # the user's part is done: hand back to the agent
            script.asked = False
            answer = UserMessage(role="user", content="I did that. What next?")
        elif script.next_requestor() is None and isinstance(message, AssistantMessage) and script.position:
            answer = UserMessage(role="user", content=f"Thank you. {STOP}")
        else:
            self.idle += 1
            text = "Please help me with my request." if self.idle < self.patience else f"Never mind. {STOP}"
            answer = UserMessage(role="user", content=text)
        state.messages.append(answer)
        return answer, state

    def set_seed(self, seed: int) -> None:
        pass


def oracle_roles(environment, task: Task):
    script = _Script(task)
    return OracleAgent(environment.get_tools(), environment.get_policy(), script), ScriptedUser(script)


def silent_roles(environment, task: Task):
    return SilentAgent(environment.get_tools(), environment.get_policy()), ScriptedUser(_Script(task))
