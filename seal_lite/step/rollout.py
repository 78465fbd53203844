"""The multi-turn episode driver: prompts, tool execution, token bookkeeping and loss masks.

``rollout_groups`` plays G episodes of each of several tasks together: a step's tasks x G at once, an
evaluation's or a screen's every task. With transformers, in rounds: every round of model calls is one batched
generation of at most ``rollout.generation_batch_size`` sequences. With paged, llama.cpp and vLLM, continuously
(``generate_continuously``): an episode's next message starts as soon as its last one is applied, while the
others still decode, and at most ``generation_batch_size`` episodes play at once, the next one starting when one
ends. ``on_group`` sees each task's group as soon as its last episode ends.
Every engine shares what those sequences have in common: transformers in one padded batch, llama.cpp in one
KV cache where each shared prefix is read once (``by_shared_prefix`` orders tasks so that neighbours share most),
paged and vLLM in prefix blocks.
Each episode keeps the exact token ids the policy saw, with ``env_mask`` = 1 on tokens the policy generated
and 0 on everything the environment wrote (system prompt, user turns, tool results, chat-template glue):
only model tokens carry loss.

The conversation is the official BFCL surface (docs/method.md §8): a system message (the tool block, plus what
the training interface adds), the task's user turns, and the environment's replies to tool calls as user
messages. No ``tools=`` goes to the chat template: the tool block is already in the system message, so every
model, with a tool template (Qwen) or without one (SmolLM2), sees the same text. The Llama-family formats
(``rollout.parser`` toolace, llama3.1) have the release's own prompt and send executed calls' results under
Llama 3.1's ``ipython`` role (seal_lite/core/llama_formats.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from seal_lite.core import timing
from seal_lite.core.interface import (
    TrainingInterface,
    apply_schema_cues,
    observation,
    observation_role,
    render_view,
    revealed_tools_text,
)
from seal_lite.core.recipe import RolloutConfig
from seal_lite.core.types import CallOutcome, StopReason, Trajectory, TurnRecord
from seal_lite.envs.registry import environment_of
from seal_lite.envs.task import Episode, Task, additional_functions_prompt


class Generator(Protocol):
    """A policy that continues token sequences. Returns only the new ids, ending with a stop token if one
    was produced. A generator that samples with another engine than the trained model (llama.cpp), or through
    another attention kernel (paged), also sets ``sampled_logprobs``: the log-probability of each returned token
    under that engine. One that also has ``generate_continuously`` (seal_lite/engines/llamacpp.py,
    paged_rollouts.py, vllm_rollouts.py) plays whole episodes in one call, through a hook that applies each
    message as it ends; one with ``release`` (vLLM) is told when a step's rollouts are done, to give its memory
    back for the update."""

    tokenizer: object

    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]: ...


class TokenConversation:
    """A chat whose token ids are extended in place, so the policy never re-tokenizes what it generated."""

    def __init__(self, tokenizer, messages: list[dict]):
        self.tokenizer = tokenizer
        self.messages = list(messages)
        self.text = self._render()
        self.ids = self._encode(self.text)
        self.mask = [0] * len(self.ids)
        self.logprobs = [0.0] * len(self.ids)  # the sampling engine's log-probs of generated tokens, else 0
        self.prompt_length = len(self.ids)

    def _render(self) -> str:
        with timing.phase("render"):
            return self.tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, text: str) -> list[int]:
        with timing.phase("render"):
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def add_model_tokens(self, new_ids: list[int], logprobs: list[float] | None = None) -> str:
        """Append generated ids (loss mask 1) and their sampling log-probs if known; return the message text."""
        content = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        self.ids += new_ids
        self.mask += [1] * len(new_ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(new_ids)
        self.text += self.tokenizer.decode(new_ids, skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": content})
        return content

    def add_env_messages(self, messages: list[dict]) -> None:
        """Append environment messages (loss mask 0) as the chat template renders them."""
        self.messages += messages
        full = self._render()
        if full.startswith(self.text):
            delta = full[len(self.text) :]
        else:  # the template re-rendered the last assistant message (e.g. stripped it): resume right after it
            last = self.messages[-len(messages) - 1]["content"]
            if not last or last not in full:
                raise ValueError("the chat template does not extend the conversation it rendered before")
            delta = full[full.rfind(last) + len(last) :]
        new_ids = self._encode(delta)
        self.ids += new_ids
        self.mask += [0] * len(new_ids)
        self.logprobs += [0.0] * len(new_ids)
        self.text = full

    def completion(self) -> tuple[list[int], list[int]]:
        """Ids and mask after the prompt, cut after the last generated token (trailing env text has no loss)."""
        end = max((i for i, bit in enumerate(self.mask) if bit), default=self.prompt_length - 1) + 1
        return self.ids[self.prompt_length : end], self.mask[self.prompt_length : end]


@dataclass
class _Episode:
    task: Task
    interface: TrainingInterface
    group: int  # its task's place in the call
    index: int
    env: Episode
    conversation: TokenConversation
    turns: list[TurnRecord]
    turn: int = 0
    calls_in_turn: int = 0
    model_calls: int = 0
    stop_reason: str | None = None

    def response_tokens(self) -> int:
        """Tokens the model generated so far (the response budget counts these, over all turns)."""
        return sum(self.conversation.mask)


def tool_message(outcomes: list[CallOutcome], interface: TrainingInterface, visible: list[str]) -> dict:
    """The environment's reply to one model message, as the official service sends it: a user message (results
    under the ipython role in the Llama-family formats)."""
    results = [(o.status, o.result) for o in outcomes]
    return {"role": observation_role([status for status, _ in results], interface),
            "content": observation(results, interface, visible)}


def rollout_group(
    task: Task,
    group_size: int,
    generator: Generator,
    rollout: RolloutConfig,
    interface: TrainingInterface,
) -> list[Trajectory]:
    """Play ``group_size`` episodes of ``task``, each on fresh tools, batching model calls."""
    return rollout_groups([(task, interface)], group_size, generator, rollout)[0]


def rollout_groups(
    tasks: list[tuple[Task, TrainingInterface]],
    group_size: int,
    generator: Generator,
    rollout: RolloutConfig,
    on_group: Callable[[list[Trajectory]], None] = lambda group: None,
) -> list[list[Trajectory]]:
    """Play ``group_size`` episodes of each (task, interface); one group of trajectories per task, in order.
    ``on_group(group)`` runs as soon as every episode of a task has ended."""
    episodes = []
    for number, (task, interface) in enumerate(tasks):
        messages = opening_messages(task, interface)
        episodes += [_Episode(task, interface, number, index, environment_of(task).episode(task),
                              TokenConversation(generator.tokenizer, messages), [TurnRecord(user_text(task, 0, interface))])
                     for index in range(group_size)]
    groups = [episodes[start : start + group_size] for start in range(0, len(episodes), group_size)]
    reported = set()

    def played(group: list[_Episode]) -> list[Trajectory]:
        sampled = getattr(generator, "sampled_logprobs", None) is not None
        return [_trajectory(e, sampled) for e in group]

    def report(ended: list[_Episode]) -> None:
        for number in sorted({e.group for e in ended if e.stop_reason is not None} - reported):
            if all(e.stop_reason is not None for e in groups[number]):
                reported.add(number)
                on_group(played(groups[number]))

    for episode in episodes:  # a prompt that leaves no room for one message ends the episode before it starts
        if len(episode.conversation.ids) + rollout.max_new_tokens > rollout.max_context_tokens:
            episode.stop_reason = StopReason.CONTEXT
    report(episodes)
    while active := [e for e in episodes if e.stop_reason is None]:
        if hasattr(generator, "generate_continuously"):
            _play_continuously(active, generator, rollout, report)
        else:
            for chunk in generation_chunks(active, rollout):
                _generate_round(chunk, generator, rollout)
                report(chunk)
    return [played(group) for group in groups]


def by_shared_prefix(tasks: list[Task]) -> list[Task]:
    """``tasks`` with those using the same tool classes next to each other: under BFCL's view their prompts share
    the whole tool block (thousands of tokens), which a batch then reads once."""
    return sorted(tasks, key=lambda task: sorted(task.involved_classes))


def task_batches(tasks: list, group_size: int, generator: Generator, rollout: RolloutConfig) -> list[list]:
    """``tasks`` cut into the ``rollout_groups`` calls of an evaluation or a screen: one call for an engine that
    batches continuously (it starts the next episode as soon as one ends, so no task waits for a batch's
    slowest), else ``generation_batch_size`` sequences' worth of tasks per call, so that results come in as each
    batch ends."""
    if hasattr(generator, "generate_continuously") or not tasks:
        return [tasks] if tasks else []
    per_call = max(1, (rollout.generation_batch_size or len(tasks) * group_size) // group_size)
    return [tasks[start : start + per_call] for start in range(0, len(tasks), per_call)]


def generation_chunks(active: list, rollout: RolloutConfig) -> list[list]:
    """The round's generate calls: at most ``generation_batch_size`` sequences each and, with a
    ``generation_token_budget``, at most that many padded tokens (rows x (longest row + max_new_tokens)), the
    longest sequences together so that short ones are not padded to a long one's width."""
    most = rollout.generation_batch_size or len(active)
    budget = rollout.generation_token_budget
    if budget is None:
        return [active[start : start + most] for start in range(0, len(active), most)]
    chunks, chunk = [], []
    for episode in sorted(active, key=lambda e: len(e.conversation.ids), reverse=True):
        width = len((chunk or [episode])[0].conversation.ids) + rollout.max_new_tokens  # the chunk's first is widest
        if chunk and (len(chunk) == most or (len(chunk) + 1) * width > budget):
            chunks.append(chunk)
            chunk = []
        chunk.append(episode)
    return chunks + [chunk]


def _generate_round(active: list[_Episode], generator: Generator, rollout: RolloutConfig) -> None:
    """One model message for each active episode, in one batched generation."""
    with timing.phase("generate"):
        new_ids = generator.generate([e.conversation.ids for e in active], _message_budget(active, rollout),
                                     rollout.temperature)
    logprobs = getattr(generator, "sampled_logprobs", None) or [None] * len(active)
    for episode, ids, token_logprobs in zip(active, new_ids, logprobs, strict=True):
        _advance(episode, ids, token_logprobs, rollout)


def _play_continuously(active: list[_Episode], generator: Generator, rollout: RolloutConfig,
                       report: Callable[[list[_Episode]], None]) -> None:
    """The active episodes to their end in one call of an engine that batches continuously: each episode's next
    message starts as soon as its last one is applied, not when the round's longest message ends, and at most
    ``generation_batch_size`` play at once. ``report`` sees each episode that ends. (An episode the engine could
    not go on with stays active for the next call.)"""
    applying = 0.0

    def on_message(row: int, ids: list[int], logprobs: list[float]) -> tuple[list[int], int] | None:
        nonlocal applying
        started = time.perf_counter()
        episode = active[row]
        _advance(episode, list(ids), list(logprobs), rollout)
        if episode.stop_reason is not None:
            report([episode])
        applying += time.perf_counter() - started
        if episode.stop_reason is not None:
            return None
        return episode.conversation.ids, _message_budget([episode], rollout)

    with timing.phase("generate"):
        generator.generate_continuously([e.conversation.ids for e in active],
                                        [_message_budget([e], rollout) for e in active], rollout.temperature, on_message,
                                        rollout.generation_batch_size)
    timing.add("generate", -applying)  # the episodes' own work (tools, templates) has its own phases


def _message_budget(episodes: list[_Episode], rollout: RolloutConfig) -> int:
    """The most tokens the episodes' next message may have. An episode's token cap is checked after each message,
    so a message never starts past it; a batch of episodes gets the largest of their budgets."""
    if (cap := rollout.episode_token_cap()) is None:
        return rollout.max_new_tokens
    return min(rollout.max_new_tokens, max(cap - e.response_tokens() for e in episodes))


def _trajectory(e: _Episode, sampled: bool) -> Trajectory:
    completion_ids, env_mask = e.conversation.completion()
    start = e.conversation.prompt_length
    return Trajectory(
        task_id=e.task.id,
        group_index=e.index,
        prompt_ids=e.conversation.ids[: e.conversation.prompt_length],
        completion_ids=completion_ids,
        env_mask=env_mask,
        messages=e.conversation.messages,
        turns=e.turns,
        num_model_calls=e.model_calls,
        stop_reason=e.stop_reason,
        sampled_logprobs=e.conversation.logprobs[start : start + len(completion_ids)] if sampled else None,
    )


def opening_messages(task: Task, interface: TrainingInterface) -> list[dict]:
    """What the policy reads before its first message: the system message of ``interface`` and the first turn."""
    view = render_view(task.visible_functions(0), interface)
    return [{"role": "system", "content": view.system_prompt},
            {"role": "user", "content": view.first_user_message(user_text(task, 0, interface))}]


def turn_text(tokenizer, task: Task, turn: int, interface: TrainingInterface) -> str:
    """The exact text the policy reads at the start of user turn ``turn``, as its chat template renders it: the
    whole opening for turn 0, else what that turn's user message adds to the conversation (the model's earlier
    messages are whatever it wrote, so they are not shown)."""
    opening = opening_messages(task, interface)
    if turn == 0:
        return TokenConversation(tokenizer, opening).text
    before = opening + [{"role": "assistant", "content": "..."}]
    after = before + [{"role": "user", "content": user_text(task, turn, interface)}]
    earlier = tokenizer.apply_chat_template(before, tokenize=False)
    return tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True).removeprefix(earlier)


def user_text(task: Task, turn: int, interface: TrainingInterface) -> str:
    """A user turn under ``interface``: the task's own text, or for a miss_func turn that reveals tools,
    bfcl-eval's additional-function prompt with the revealed docs in the interface's format (and cues)."""
    if turn in task.revealed and not task.turns[turn]:
        docs = apply_schema_cues(task.revealed[turn]) if interface.schema_cues else task.revealed[turn]
        return additional_functions_prompt(revealed_tools_text(docs, interface.tool_format))
    return task.user_message(turn)


def _advance(e: _Episode, ids: list[int], logprobs: list[float] | None, rollout: RolloutConfig):
    """Apply one model message to an episode: execute its calls, then continue the turn or open the next."""
    task, interface = e.task, e.interface
    content = e.conversation.add_model_tokens(ids, logprobs)
    e.model_calls += 1
    e.calls_in_turn += 1
    with timing.phase("environment"):
        outcomes = e.env.run(content, e.turn, rollout.parser)
    if outcomes:
        e.turns[e.turn].outcomes_per_step.append(outcomes)
    visible = [doc["name"] for doc in task.visible_functions(e.turn)]
    pending = [tool_message(outcomes, interface, visible)] if outcomes else []
    unfinished = bool(outcomes) or e.turn + 1 < len(task.turns)
    if e.model_calls >= rollout.max_model_calls:
        e.stop_reason = StopReason.CALL_BUDGET if unfinished else StopReason.DONE
        return
    if (cap := rollout.episode_token_cap()) is not None and e.response_tokens() >= cap:
        e.stop_reason = StopReason.RESPONSE_BUDGET if unfinished else StopReason.DONE
        return
    if not outcomes or (rollout.max_calls_per_turn is not None and e.calls_in_turn >= rollout.max_calls_per_turn):
        e.turn += 1
        e.calls_in_turn = 0
        if e.turn >= len(task.turns):
            e.stop_reason = StopReason.DONE
            return
        user = user_text(task, e.turn, interface)
        e.turns.append(TurnRecord(user))
        pending.append({"role": "user", "content": user})
    e.conversation.add_env_messages(pending)
    if len(e.conversation.ids) + rollout.max_new_tokens > rollout.max_context_tokens:
        e.stop_reason = StopReason.CONTEXT
