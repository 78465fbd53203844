"""What a run costs on a card, before renting one: the memory model's fit and the hours, by arithmetic.

Pure arithmetic from the model's shape (``memory.Shape``), the recipe and a card class's datasheet: how many padded
tokens a generate call may hold there (the memory model, seal_lite/core/memory.py, checked against measured peaks:
docs/gpu.md), the update's peak (an estimate: ``update_peak_bytes``), and the seconds of each step's prefill, decode
and update from the FLOPs and bytes they move at the speeds of ``Speed``, which are ASSUMPTIONS until a GPU has
measured them. Episode sizes are measured on the BFCL data (``MEASURED_EPISODES``) or the recipe's whole budget.
``seal-lite recipe RECIPE --card NAME`` prints ``card_plan`` for one card; scripts/paper_comparison.py --plan prints
the paper comparison's cost on every card with the same functions. Three rollout engines are priced: transformers'
generate in rounds (``rollout_cost``), vLLM (``vllm_rollout_cost``) and transformers' continuous batching on paged
attention (``paged_rollout_cost``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from seal_lite.core.memory import (
    CUDA_CONTEXT,
    GIB,
    NF4_BYTES,
    Shape,
    generate_peak,
    paged_live_rows,
    paged_pool_tokens,
    resident_bytes,
    rollout_token_budget,
    vllm_cache_tokens,
    vllm_share,
)


class Episode(NamedTuple):
    """One episode's mean size, in tokens: the opening it reads (system message, tool block, first request), its
    model messages, what they write in all, and what the environment sends back in all (results, later turns)."""

    opening: float
    messages: float
    model_tokens: float
    env_tokens: float

    def length(self) -> float:
        return self.opening + self.model_tokens + self.env_tokens

    def rounds(self) -> list[tuple[float, float]]:
        """(share of the episodes still playing, prompt width) at each round of model messages: round k reads the
        opening and k messages with what answered them. A fractional last round is played by that share."""
        per_message = (self.model_tokens + self.env_tokens) / self.messages
        return [(min(1.0, self.messages - k), self.opening + k * per_message) for k in range(math.ceil(self.messages))]


# The ground truth's episodes under the official view, Qwen2.5's tokenizer (``--episodes``; measured 2026-12-03):
# per task, the opening, the later user turns, the ground truth's calls as <tool_call> blocks (one a message) and
# their results as <tool_response> messages, with the chat template's tokens; means over the split's 400 tasks.
MEASURED_EPISODES = {
    "train": {"opening": 4946.0, "user_turns": 191.6, "call_tokens": 226.6, "result_tokens": 2843.6, "calls": 5.71,
              "turns": 4.16},
    "eval": {"opening": 5221.6, "user_turns": 191.4, "call_tokens": 230.8, "result_tokens": 2182.1, "calls": 5.85,
             "turns": 4.18},
}
ANSWER_TOKENS = 40  # ASSUMPTION: the text answer that ends each user turn (not in the data)


def ground_truth_episode(measured: dict) -> Episode:
    """An episode that plays like the ground truth: its calls one a message, then a text answer each turn."""
    return Episode(opening=measured["opening"], messages=measured["calls"] + measured["turns"],
                   model_tokens=measured["call_tokens"] + ANSWER_TOKENS * measured["turns"],
                   env_tokens=measured["user_turns"] + measured["result_tokens"])


def budget_episode(rollout, opening: float) -> Episode:
    """An episode that spends its whole budget: every model call, every response token, the context filled."""
    model = rollout.episode_token_cap() or rollout.max_model_calls * rollout.max_new_tokens
    model = min(model, rollout.max_context_tokens - opening)
    return Episode(opening, rollout.max_model_calls, model, max(0.0, rollout.max_context_tokens - opening - model))


def episode_cases(rollout, speed: Speed, split: str = "train") -> dict[str, tuple[Episode, int]]:
    """The two sizes of episode a plan prices, each with the decode steps of one generate call: like the ground
    truth's on ``split`` (a call decodes its longest message, ``speed.longest_message``), and spending the whole
    budget (every message its ``max_new_tokens``)."""
    measured = MEASURED_EPISODES[split]
    return {"like the ground truth": (ground_truth_episode(measured),
                                      min(speed.longest_message, rollout.max_new_tokens)),
            "whole budget": (budget_episode(rollout, measured["opening"]), rollout.max_new_tokens)}


class Card(NamedTuple):
    """A GPU of one card class of docs/gpu.md: its memory, 16-bit dense tensor TFLOP/s and memory TB/s (the
    vendors' datasheets), whether ``rollout.backend: vllm`` can play rollouts there (Ampere or newer) and whether
    it computes bf16 (Ampere or newer; before, ``policy.dtype: auto`` is fp16)."""

    name: str
    memory_gb: float
    tflops: float
    bandwidth: float
    vllm: bool = True
    bf16: bool = True


CARDS = (Card("A100 80GB", 80, 312, 2.04), Card("H100 80GB SXM", 80, 989, 3.35), Card("L40S", 48, 362, 0.864),
         Card("RTX 4090", 24, 165, 1.01), Card("T4", 15, 65, 0.32, vllm=False, bf16=False))


class Speed(NamedTuple):
    """What share of a card's peak each phase reaches: ASSUMPTIONS, none measured on a GPU here."""

    prefill_mfu: float = 0.4  # a batched prefill of thousands of tokens a row: compute-bound
    update_mfu: float = 0.3  # the update: one trajectory a pass (Unsloth), NF4 weights dequantized, checkpointing
    bandwidth_share: float = 0.6  # a decode step reads the weights and the rows' KV cache
    decode_floor_s: float = 0.03  # the least one decode step of a 28-layer model takes in generate (kernel
    # launches, Python); the one GPU timing on record (ARCHITECTURE.md: Unsloth 7B, 4 x 128 new tokens on an H200,
    # about 7.5 s a step with its update) bounds it by 0.059 s
    longest_message: int = 256  # a generate call decodes until its longest message ends (a budget episode: its cap)
    vllm_decode_floor_s: float = 0.012  # the least one vLLM decode step takes (CUDA graphs, no Python per token)
    paged_decode_floor_s: float = 0.03  # the least one step of the paged engine takes: generate's floor, as its
    # steps are as many kernel launches with Python around them (prepare, forward, update; no CUDA graphs); not
    # measured on a GPU


# The paged engine's constants (core imports no engine): they mirror seal_lite/engines/paged_rollouts.py's
PAGED_BLOCK_SIZE = 32  # paged_rollouts.BLOCK_SIZE: only complete blocks of this many tokens are shared
PAGED_PREFILL_TOKENS = 2048  # paged_rollouts.PREFILL_TOKENS: the most tokens one forward pass reads


LOGPROB_CHUNK = 1024  # positions whose fp32 logits (and their gradient) Unsloth's loss holds at once
HOLD_SHARE = 0.5  # training/shared_prefix.HOLD_SHARE: the share of the free memory kept suffix graphs may take


def forward_flops(shape, width: float) -> float:
    """One forward pass over ``width`` tokens without the LM head: 2 FLOPs per weight and token in the projections,
    and causal attention, 2 x width^2 x heads x head_dim per layer."""
    return 2 * shape.linear_params() * width + 2 * shape.layers * shape.heads * shape.head_dim * width**2


def weight_bytes(shape) -> float:
    """What a decode step reads besides the cache: the NF4 projections and the 16-bit LM head."""
    return shape.linear_params() * NF4_BYTES + shape.vocab * shape.hidden * 2


def kv_bytes(shape) -> int:
    """The 16-bit KV cache of one token."""
    return shape.kv_bytes_per_token(2)


def rollout_cost(shape, card: Card, episode: Episode, trajectories: int, rows_cap: int, budget: int | None,
                 new_tokens: int, decode_steps: int, speed: Speed) -> dict:
    """Seconds of prefill and decode for ``trajectories`` episodes played in lockstep rounds: each round's model
    messages in generate calls of at most ``rows_cap`` rows and ``budget`` padded tokens (rows x (width + new
    tokens), as seal_lite.step.rollout.generation_chunks cuts them); each call reads its rows' whole context again
    (no cache across calls) and decodes ``decode_steps`` steps."""
    prefill_tokens = prefill_flops = decode = 0.0
    for share, width in episode.rounds():
        active = trajectories * share
        prefill_tokens += active * width
        prefill_flops += active * forward_flops(shape, width)
        rows = min(rows_cap, budget // (width + new_tokens)) if budget else rows_cap
        rows = max(1, min(rows, math.ceil(active)))
        step = max(speed.decode_floor_s, (weight_bytes(shape) + rows * (width + decode_steps / 2) * kv_bytes(shape))
                   / (card.bandwidth * 1e12 * speed.bandwidth_share))
        decode += math.ceil(active / rows) * decode_steps * step
    return {"prefill_tokens": prefill_tokens, "prefill": prefill_flops / (card.tflops * 1e12 * speed.prefill_mfu),
            "decode": decode}


def vllm_rollout_cost(shape, card: Card, episode: Episode, trajectories: int, group_size: int, cache_tokens: int,
                      speed: Speed) -> dict:
    """Seconds of prefill and decode for ``trajectories`` episodes on vLLM (seal_lite/engines/vllm_rollouts.py):
    prefix caching reads each task's opening once for its group and then only what the environment appends (an
    episode's own messages are in its cache already), each appended token attending to the episode's mean width;
    continuous batching decodes as many episodes at once as the KV cache holds at their full length, and no
    episode waits for another's message."""
    tasks = trajectories / group_size
    mean_width = episode.opening + (episode.model_tokens + episode.env_tokens) / 2
    attention = 4 * shape.layers * shape.heads * shape.head_dim  # FLOPs per token and per token it attends to
    prefill_flops = (tasks * forward_flops(shape, episode.opening)
                     + trajectories * episode.env_tokens * (2 * shape.linear_params() + attention * mean_width))
    rows = max(1, min(trajectories, math.floor(cache_tokens / episode.length())))
    step = max(speed.vllm_decode_floor_s, (weight_bytes(shape) + rows * mean_width * kv_bytes(shape))
               / (card.bandwidth * 1e12 * speed.bandwidth_share))
    return {"prefill_tokens": tasks * episode.opening + trajectories * episode.env_tokens,
            "prefill": prefill_flops / (card.tflops * 1e12 * speed.prefill_mfu),
            "decode": trajectories * episode.model_tokens / rows * step, "rows": rows}


def paged_pass_flops(shape, queries: float, keys: float) -> float:
    """One forward pass of the paged engine on SDPA: the projections of ``queries`` tokens, each attending to all
    ``keys`` the pass reads (2 x 2 FLOPs a head dimension: scores and values)."""
    return queries * (2 * shape.linear_params() + 4 * shape.layers * shape.heads * shape.head_dim * keys)


def paged_rollout_cost(shape, card: Card, episode: Episode, trajectories: int, group_size: int, pool_tokens: int,
                       max_context_tokens: int, rows_cap: int | None, speed: Speed) -> dict:
    """Seconds of prefill and decode for ``trajectories`` episodes on transformers' continuous batching on paged
    attention (``rollout.backend: paged``, seal_lite/engines/paged_rollouts.py), an ESTIMATE priced for torch's SDPA
    (no flash attention: the T4 has none, and seal-lite installs none). Its prefix blocks read each task's opening
    once for its group, then per episode what the environment appends and, at each model message, the tokens after
    its last complete block again (``PAGED_BLOCK_SIZE`` / 2 on average). It decodes continuously, as many episodes
    at once as the engine lets live (``paged_live_rows``: its pool at the full context, at most ``rows_cap``): R
    rows of the mean width W.

    SDPA attends every query of a forward pass to every key the pass reads, with a dense block-diagonal mask
    (transformers/integrations/sdpa_paged.py), so a decode step computes R x (R x W) query-key pairs, quadratic in
    R, and moves the weights and, per key read, its keys and values 3 + 2 x heads / kv_heads times: read out of
    the pool, written gathered, read by ``repeat_kv``, written once for every attention head and read so by SDPA
    (with as many KV heads as heads, SDPA's ``.contiguous()`` makes the same copy). The mask, R x R x W, is smaller
    by far and left out. Each prefill token is priced as attending to R x W keys as well, by its FLOPs alone (a
    pass of ``PAGED_PREFILL_TOKENS`` queries moves the bytes of a decode step, which its FLOPs outweigh on every
    card here): an estimate, since the keys of a pass depend on which rows share it. A decode step takes the
    longest of the floor, its bytes and its FLOPs."""
    tasks = trajectories / group_size
    mean_width = episode.opening + (episode.model_tokens + episode.env_tokens) / 2
    rows = min(trajectories, paged_live_rows(pool_tokens, max_context_tokens, rows_cap))
    keys = rows * mean_width  # what each forward pass reads, and each of its queries attends to
    prefill_tokens = tasks * episode.opening + trajectories * (episode.env_tokens
                                                               + episode.messages * PAGED_BLOCK_SIZE / 2)
    moved = kv_bytes(shape) * (3 + 2 * shape.heads / shape.kv_heads)  # a key's bytes read and written a step
    step_bytes = weight_bytes(shape) + keys * moved
    step = max(speed.paged_decode_floor_s, step_bytes / (card.bandwidth * 1e12 * speed.bandwidth_share),
               paged_pass_flops(shape, rows, keys) / (card.tflops * 1e12 * speed.prefill_mfu))
    return {"prefill_tokens": prefill_tokens,
            "prefill": paged_pass_flops(shape, prefill_tokens, keys) / (card.tflops * 1e12 * speed.prefill_mfu),
            "decode": trajectories * episode.model_tokens / rows * step, "rows": rows}


def card_vllm(recipe, shape, card: Card) -> tuple[float, int]:
    """(rollout.vllm_memory, KV cache tokens) on ``card``: the largest share that leaves the trainer its resident
    memory and 10% of the card during rollouts (vLLM sleeps during the update), by the memory model."""
    share = vllm_share(shape, card.memory_gb * GIB, 2, True, recipe.policy.lora_r)
    return share, vllm_cache_tokens(shape, card.memory_gb * GIB, share, 2, True, recipe.policy.lora_r)


def card_paged(recipe, shape, card: Card) -> int:
    """Tokens of the paged engine's KV pool on ``card``: what the memory model lets fit beside the 4-bit policy and
    the CUDA context with 10% of the card left free (``paged_pool_tokens``, as seal_lite/engines/rollout_engine.py
    sizes it on a GPU). 0: not even one forward pass fits."""
    available = 0.9 * card.memory_gb * GIB - CUDA_CONTEXT - resident_bytes(shape, 2, True, recipe.policy.lora_r)
    return paged_pool_tokens(shape, available, PAGED_PREFILL_TOKENS, 2)


def suffix_flops(shape, width: float, prefix: float) -> float:
    """One forward pass over ``width`` tokens that attend to ``prefix`` keys computed before them and causally to
    their own (``forward_flops`` without the LM head when ``prefix`` is 0)."""
    return 2 * shape.linear_params() * width + 2 * shape.layers * shape.heads * shape.head_dim * (
        width**2 + 2 * width * prefix)


def update_cost(shape, card: Card, episode: Episode, trajectories: int, context: int, passes: int,
                speed: Speed, recompute: int = 1, group: int = 1, epochs: int = 1, kept: bool = False) -> dict:
    """Seconds of the update over ``trajectories`` trajectories (at most ``context`` tokens each): ``passes``
    forward-sized passes over each trained token (``update_passes``), ``recompute`` of them the checkpointed layers'
    (no logits). ``group`` 1: each trajectory read whole in every pass, the LM head over its whole completion in every
    pass but the recomputes (TRL's and Unsloth's scoring). ``group`` G: each group's opening read once a pass and
    each trajectory's completion against it, the LM head only where a model token is scored, and, unless the
    suffixes' graphs are ``kept`` (``suffixes_kept``), one more pass over the completions in each of the ``epochs``
    PPO epochs: the checkpointed suffix's recompute (training/shared_prefix.py). The head is then counted in every
    pass, its chunks' recompute included: a bound."""
    length = min(episode.length(), context)
    completion = length - episode.opening
    head_flops = 2 * shape.vocab * shape.hidden
    if group == 1:
        flops = trajectories * (passes * forward_flops(shape, length) + head_flops * completion * (passes - recompute))
        read = trajectories * length
    else:
        suffix_passes = passes + (0 if kept else epochs)
        scored = min(episode.model_tokens, completion)
        flops = (trajectories / group * passes * forward_flops(shape, episode.opening)
                 + trajectories * suffix_passes * (suffix_flops(shape, completion, episode.opening)
                                                   + head_flops * scored))
        read = trajectories / group * episode.opening + trajectories * completion
    return {"trained_tokens": trajectories * length, "read_tokens": read,
            "update": flops / (card.tflops * 1e12 * speed.update_mfu)}


def shares_prefix(recipe) -> bool:
    """Whether the recipe's update computes each group's opening once: ``grpo.shared_prefix`` on a peft backend
    (training/grpo.py's rule; one process). Unsloth's trainer scores one trajectory a pass, and ``auto`` is priced as
    Unsloth, which it picks on a GPU where ``.[gpu]`` installed it."""
    return recipe.grpo.shared_prefix and recipe.policy.backend in ("peft", "peft-4bit")


def update_group(recipe) -> int:
    """Trajectories that share one pass over their opening in the update: with ``shares_prefix`` a group, or as much
    of it as a micro-batch holds; else 1."""
    return min(recipe.rollout.num_generations, recipe.micro_batch(True)) if shares_prefix(recipe) else 1


def kept_suffix_bytes(recipe, shape, episode: Episode, context: int) -> float:
    """What a group's suffix graphs hold when kept for the backward pass (training/shared_prefix.py ``held_bytes``:
    each decoder layer's 16-bit input), for episodes like ``episode`` of at most ``context`` tokens."""
    suffix = min(episode.length(), context) - episode.opening
    return update_group(recipe) * shape.layers * suffix * shape.hidden * 2


def kept_graph_bytes(recipe, shape, episode: Episode, context: int) -> float:
    """All that a group's kept suffix graphs hold: their layers' inputs (``kept_suffix_bytes``, all the trainer counts
    against its budget) and, per suffix, what its graph keeps outside them: the bool mask of its queries against the
    opening's keys and its own, which every layer's checkpoint holds (a byte a query-key pair), and the final
    RMSNorm's fp32 input and 16-bit output, saved for its backward (6 bytes a hidden unit)."""
    length = min(episode.length(), context)
    suffix = length - episode.opening
    return kept_suffix_bytes(recipe, shape, episode, context) + update_group(recipe) * suffix * (length
                                                                                               + 6 * shape.hidden)


def suffixes_kept(recipe, shape, card: Card, episode: Episode, context: int) -> bool:
    """Whether the update keeps its suffixes' graphs instead of recomputing them on ``card``: with the shared
    prefix and gradient checkpointing (on with a GPU unless the recipe says otherwise), when a group's fit in
    ``HOLD_SHARE`` of what the 4-bit policy and the CUDA context leave free (training/shared_prefix.py
    ``hold_budget``, which reads the free memory when scoring starts)."""
    if not shares_prefix(recipe) or recipe.policy.gradient_checkpointing is False:
        return False
    free = card.memory_gb * GIB - CUDA_CONTEXT - resident_bytes(shape, 2, True, recipe.policy.lora_r)
    return kept_suffix_bytes(recipe, shape, episode, context) <= HOLD_SHARE * free


def trained_length(rollout, episode: Episode) -> float:
    """The most tokens of one trajectory the update reads: its context, and with ``rollout.budget: release`` the
    prompt and the first ``max_response_tokens`` after it."""
    if (trained := rollout.trained_tokens()) is not None:
        return min(rollout.max_context_tokens, episode.opening + trained)
    return rollout.max_context_tokens


def update_passes(recipe) -> int:
    """Forward-sized passes of the update over each trained token. In each PPO epoch (grpo.num_iterations): the
    forward, the backward (input gradients only, the frozen weights need none of their own: as much as a forward)
    and, with gradient checkpointing, the recompute (``recompute_passes``). Once a step: the reference's forward
    when beta > 0, and TRL's pass without gradient that scores the old log-probs, which trl 1.14.2 runs when
    gradient_accumulation_steps is no multiple of steps_per_generation x num_iterations (grpo_trainer.py:2704),
    that is when a step's rollouts serve more than one optimizer step (grpo.mini_batches or num_iterations > 1)."""
    grpo = recipe.grpo
    old_logprobs = grpo.mini_batches * grpo.num_iterations > 1
    return grpo.num_iterations * 2 + recompute_passes(recipe) + (grpo.beta > 0) + old_logprobs


def recompute_passes(recipe) -> int:
    """The update's passes that recompute checkpointed layers (no logits): one per PPO epoch, with checkpointing."""
    return recipe.grpo.num_iterations * bool(recipe.policy.gradient_checkpointing)


def card_budget(recipe, shape, card: Card) -> int:
    """Padded tokens one generate call may hold on ``card`` by the memory model (the smaller engine's, at the
    recipe's own new tokens a message), never more than the recipe's own budget."""
    rollout = recipe.rollout
    fits = min(rollout_token_budget(shape, card.memory_gb * GIB, rollout.max_context_tokens, rollout.max_new_tokens, 2, engine,
                                    quantized=True, lora_rank=recipe.policy.lora_r)
               for engine in ("unsloth", "peft"))
    return min(fits, rollout.generation_token_budget or fits)


ENGINES = ("generate", "vllm", "paged")


def engine_cost(recipe, shape, card: Card, episode: Episode, trajectories: int, group_size: int, speed: Speed,
                decode_steps: int, engine: str) -> dict:
    """Seconds of prefill and decode for ``trajectories`` episodes in groups of ``group_size`` on ``engine``
    (``ENGINES``), sized for ``card`` as the recipe sizes it there: generate's calls by ``card_budget``, vLLM's
    cache by ``card_vllm``, the paged engine's pool by ``card_paged``."""
    if engine == "vllm":
        return vllm_rollout_cost(shape, card, episode, trajectories, group_size, card_vllm(recipe, shape, card)[1],
                                 speed)
    if engine == "paged":
        return paged_rollout_cost(shape, card, episode, trajectories, group_size, card_paged(recipe, shape, card),
                                  recipe.rollout.max_context_tokens, recipe.generation_batch(), speed)
    if engine != "generate":
        raise ValueError(f"no cost model for the rollout engine {engine!r}; there are {', '.join(ENGINES)}")
    return rollout_cost(shape, card, episode, trajectories, recipe.generation_batch(), card_budget(recipe, shape, card),
                        recipe.rollout.max_new_tokens, decode_steps, speed)


def run_cost(recipe, shape, card: Card, episode: Episode, speed: Speed, decode_steps: int,
             engine: str = "generate", held_out: Episode | None = None) -> dict:
    """One training run: per step, tasks x G episodes rolled out (``engine``: generate, vllm or paged) and the
    update over them; all its steps; and its validations (recipe section ``validation``), each a greedy evaluation of
    the held-out slice with episodes like ``held_out`` (default: like the training's)."""
    trajectories = recipe.grpo.tasks_per_step * recipe.rollout.num_generations
    budget = card_budget(recipe, shape, card)
    rollout = engine_cost(recipe, shape, card, episode, trajectories, recipe.rollout.num_generations, speed,
                          decode_steps, engine)
    context = trained_length(recipe.rollout, episode)
    update = update_cost(shape, card, episode, trajectories, context, update_passes(recipe), speed,
                         recompute_passes(recipe), update_group(recipe), recipe.grpo.num_iterations,
                         suffixes_kept(recipe, shape, card, episode, context))
    step = {**rollout, **update, "generated_tokens": trajectories * episode.model_tokens}
    step.pop("rows", None)
    steps, validations = recipe.grpo.steps, recipe.validation.count(recipe.grpo.steps)
    validation = evaluation_cost(recipe, shape, card, held_out or episode, speed, decode_steps,
                                 recipe.validation.slice_size(), engine) if validations else {"hours": 0.0}
    return {"steps": steps, "trajectories": steps * trajectories, "budget": budget,
            **{key: steps * value for key, value in step.items()},
            "validations": validations, "validation": validations * validation["hours"] * 3600,
            "hours": steps * (rollout["prefill"] + rollout["decode"] + update["update"]) / 3600
            + validations * validation["hours"]}


def evaluation_cost(recipe, shape, card: Card, episode: Episode, speed: Speed, decode_steps: int,
                    tasks: int = 400, engine: str = "generate") -> dict:
    """One model's greedy evaluation: ``tasks`` episodes, batched as the recipe batches them, no update. One
    episode a task: tasks share no prefix in this estimate (vllm, paged)."""
    cost = engine_cost(recipe, shape, card, episode, tasks, 1, speed, decode_steps, engine)
    return {**cost, "hours": (cost["prefill"] + cost["decode"]) / 3600}


# ---- one recipe on one card: what `seal-lite recipe RECIPE --card NAME` prints ------------------------------------

def card_key(card: Card) -> str:
    """The name ``--card`` takes: the card's name in lower case, words joined by hyphens (``rtx-4090``)."""
    return card.name.lower().replace(" ", "-")


def update_peak_bytes(shape: Shape, width: int, dtype_bytes: int, lora_rank: int, shared: bool = False,
                      opening: float = 0) -> int:
    """An ESTIMATE (no GPU has measured it; the memory model does not cover the update) of the update's peak for
    one trajectory of ``width`` tokens a pass on either 4-bit backend (QLoRA, gradient checkpointing, log-probs in
    chunks): what the backward pass holds throughout, the resident part, the CUDA context and each layer's
    checkpointed input, and the largest of what one moment adds to it, as autograd runs one step at a time: the LM
    head's backward (one chunk's fp32 logits with their gradient, beside the final RMSNorm's saves, which no
    checkpoint covers: its fp32 input and its output) or a recomputed layer's backward (its MLP's three intermediates
    and four hidden-sized tensors). benchmarks/gpu_memory.py ``estimate`` adds the two moments instead: a bound.

    ``shared``: the update scores each group with its opening computed once (``shares_prefix``; the same terms, since
    a pass holds the prefix's layers and one suffix's), and also holds the opening's keys and values for the
    suffixes' backward (at most the whole width's). A suffix pass, of the width less the ``opening`` (0: the whole
    width, a bound), attends to the opening's keys as well, so transformers gives it a bool mask, queries x keys,
    which every layer's checkpoint holds. In each layer's forward and its recompute, SDPA takes the keys and values
    repeated to every head and turns that mask into a 16-bit additive one, padded to its mem-efficient kernel's
    alignment (two more 16-bit query-key tensors); the layer's backward holds the padded one and the repeated keys
    and values beside its MLP's intermediates."""
    checkpointed = shape.layers * width * shape.hidden * dtype_bytes
    held = resident_bytes(shape, dtype_bytes, True, lora_rank) + CUDA_CONTEXT + checkpointed
    head = LOGPROB_CHUNK * shape.vocab * 4 * 2 + width * shape.hidden * (4 + dtype_bytes)
    layer = width * (3 * shape.intermediate + 4 * shape.hidden) * dtype_bytes
    attention = 0
    if shared:
        pairs = (width - opening) * width  # a suffix's queries x the keys it reads
        repeated = width * 2 * shape.heads * shape.head_dim * dtype_bytes
        held += kv_bytes(shape) * width + pairs
        layer += pairs * dtype_bytes + repeated
        attention = pairs * 2 * dtype_bytes + repeated
    return int(held + max(head, layer, attention))


def card_memory(recipe, shape: Shape, card: Card) -> dict:
    """``recipe``'s memory on ``card``: its rollouts' widest generate call by the memory model (rows of the full
    context at the recipe's token budget) against the card with 10% left free, the budget that fits
    (``rollout_token_budget``), the paged engine's pool and the episodes it lets live (``paged_live_rows``), and the
    update's estimated peak on trajectories of the full context, with the suffix graphs it keeps where it keeps them
    (for episodes like the ground truth's and for those that spend the whole budget, whose opening is the measured
    one). The engine is the policy backend's; ``auto`` counts both GPU backends (Unsloth where it is installed, else
    bitsandbytes and peft), so what it finds fits either. The rollouts are vLLM's with ``rollout.backend: vllm``
    where the card runs it, the paged engine's with ``rollout.backend: paged`` (its pool fits when it holds one
    context and one prefill pass: less, and the engine takes that much anyway), else generate's. What `seal-lite
    run` checks against the GPU it finds (seal_lite/runs/preflight.py ``fit_problems``)."""
    rollout, backend = recipe.rollout, recipe.policy.backend
    engines = {"unsloth": ["unsloth"], "auto": ["unsloth", "peft"]}.get(backend, ["peft"])
    quantized, card_bytes = backend != "peft", card.memory_gb * GIB
    fits = min(rollout_token_budget(shape, card_bytes, rollout.max_context_tokens, rollout.max_new_tokens, 2, engine,
                                    quantized=quantized, lora_rank=recipe.policy.lora_r) for engine in engines)
    budget = rollout.generation_token_budget or recipe.generation_batch() * rollout.max_context_tokens
    rows = max(1, min(recipe.generation_batch(), budget // rollout.max_context_tokens))
    resident = resident_bytes(shape, 2, quantized, recipe.policy.lora_r) + CUDA_CONTEXT
    call = resident + max(generate_peak(shape, rows, rollout.max_context_tokens - rollout.max_new_tokens,
                                        rollout.max_new_tokens, 2, engine) for engine in engines)
    cases = {case: episode for case, (episode, _) in episode_cases(rollout, Speed()).items()}
    update = update_peak_bytes(shape, rollout.max_context_tokens, 2, recipe.policy.lora_r, shares_prefix(recipe),
                               cases["whole budget"].opening)
    kept = [kept_graph_bytes(recipe, shape, episode, trained_length(rollout, episode)) for episode in cases.values()
            if suffixes_kept(recipe, shape, card, episode, trained_length(rollout, episode))]
    update += max(kept, default=0.0)  # the group's other suffixes' graphs on top of one trajectory's
    pool = card_paged(recipe, shape, card)
    return {"card": card, "engines": engines, "rows": rows, "budget": budget, "fitting_budget": fits,
            "call_gb": call / GIB, "update_gb": update / GIB, "shared_prefix": shares_prefix(recipe),
            "call_fits": call <= 0.9 * card_bytes, "update_fits": update <= 0.9 * card_bytes,
            "rollouts": {"vllm": "vllm" if card.vllm else "generate", "paged": "paged"}.get(rollout.backend,
                                                                                           "generate"),
            "pool_tokens": pool, "live_rows": paged_live_rows(pool, rollout.max_context_tokens,
                                                              recipe.generation_batch()),
            "pool_fits": pool >= rollout.max_context_tokens + PAGED_PREFILL_TOKENS}


def card_plan(recipe, shape: Shape, card: Card, speed: Speed = Speed()) -> dict:
    """``recipe`` on ``card``: its memory there (``card_memory``), and the hours of a step and of the run, on the
    rollout engine ``card_memory`` names, for episodes like the ground truth's (measured on the BFCL data under the
    official view) and for episodes that spend the whole budget."""
    memory = card_memory(recipe, shape, card)
    rollout, steps = recipe.rollout, recipe.grpo.steps
    hours = {}
    held_out = episode_cases(rollout, speed, recipe.validation.split)
    for case, (episode, decode_steps) in episode_cases(rollout, speed).items():
        run = run_cost(recipe, shape, card, episode, speed, decode_steps, memory["rollouts"], held_out[case][0])
        validation = run["validation"] / 3600
        context = trained_length(rollout, episode)
        hours[case] = {"step": (run["hours"] - validation) / steps, "run": run["hours"], "validation": validation,
                       "validations": run["validations"], "update_share": run["update"] / 3600 / run["hours"],
                       "suffixes_kept": suffixes_kept(recipe, shape, card, episode, context)}
    return {**memory, "hours": hours}
