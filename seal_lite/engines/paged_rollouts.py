"""Rollouts through transformers' continuous batching on paged attention (``rollout.backend: paged``).

``PagedGenerator`` is the ``Generator`` of seal_lite/step/rollout.py. It plays with the very model TRL trains
(peft's LoRA on a 16-bit or bitsandbytes 4-bit base): transformers 5.17's continuous-batching processor
(``transformers/generation/continuous_batching/``) calls the model's own forward with a paged attention, so nothing
is copied, exported or synced after an update, and it runs wherever transformers does, a T4 or a CPU included.

* **Continuous batching** (``generate_continuously``): when a message ends, the driver's hook runs its tool calls
  and the episode's next request joins the running batch; no episode waits for a round's longest message, and
  prompts are read in chunks of ``PREFILL_TOKENS`` beside the decoding rows instead of one padded batch.
* **Prefix blocks**: the KV cache is a pool of ``BLOCK_SIZE``-token blocks, each complete block keyed by the hash of
  every token up to its end. A request finds the blocks of its prefix that any earlier request computed. A
  group's opening is read once: an episode whose opening shares at least half its tokens with one being read (its
  group's, or a task's with the same tool block) waits until that one is read, then starts from its blocks
  (``_play``). An episode's next message reads only what came after its last complete block: what the
  environment appended, and at most ``BLOCK_SIZE`` - 1 tokens again.
* **Never across an update**: the key holds the tokens, not the weights. The pool lives for one call (a step's
  rollouts, an evaluation's batch), so no block computed before an update is found after it. ``release`` (the
  step calls it once its rollouts are done) hands the pool's memory back to the card: when a call ends the pool
  only goes back to PyTorch's allocator cache, which the update's ``hold_budget`` sees as used.
* **Its attention is seal-lite's choice**, ``paged|sdpa``, whatever is installed: given plain ``sdpa``,
  transformers swaps in FlashAttention when flash-attn (or ``kernels``) is present, which fails on a T4 and, on
  Ampere+, turns on CUDA graphs and FA2's paged decode, whose 256-token block rule rejects these 32-token blocks.
* **Driven from this thread**, step by step (prepare, forward, update) as vLLM's ``engine.step()`` is, not by
  transformers' background thread: the batches are the same whatever the timing, so a call samples alike when
  reseeded (``reseed``: torch's generator is set from (seed, step, call) around the call and restored after it).
* **Its log-probs**: log softmax(logits / T) of each sampled token (top-k, top-p and the model's generation
  defaults off), which ``sampled_logprobs`` hands to the update's engine comparison (``rollout.max_logprob_gap``):
  the same weights through another attention kernel agree to rounding.

Unsloth's policies replace the attention forwards with their own, which would bypass the paged attention: the
recipe check refuses this backend with ``policy.backend: unsloth`` (docs/rollouts.md).
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable

import numpy as np
import torch

from seal_lite.engines.continuous import ContinuousGenerator
from seal_lite.engines.transformers_generate import eval_mode, release_cached_memory, stop_ids

BLOCK_SIZE = 32  # tokens a KV block holds: a message re-reads at most this many - 1 tokens of what came before it
PREFILL_TOKENS = 2048  # the most tokens one forward pass reads (new prompts' chunks and the decoding rows together)


class PagedGenerator(ContinuousGenerator):
    """Rollouts with transformers' continuous batching on ``model`` (the trained policy, peft-wrapped or not).

    ``cache_tokens``: the KV pool's size in tokens, allocated when a call starts and freed when it ends
    (``paged_cache_tokens`` sizes it from the memory model); ``mode(model)`` the context generation runs in (by
    default eval mode: no dropout); ``max_live``: the most episodes a call keeps live (``paged_live_rows``: as many
    as the pool holds at full length; more would be evicted and read again)."""

    def __init__(self, model, tokenizer, *, cache_tokens: int, seed: int = 0, mode: Callable | None = None,
                 max_live: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.mode = mode or eval_mode
        self.cache_tokens = cache_tokens
        self.max_live = max_live  # episodes live at once, at most, whatever a call asks (None: as asked)
        self.stop_ids = sorted(stop_ids(tokenizer, model))
        self.seed: tuple[int, ...] = (seed,)
        self.calls = 0
        self.sampled_logprobs: list[list[float]] = []
        self.prompt_tokens = 0  # prompt tokens of all requests so far, and those found in the prefix blocks
        self.cached_tokens = 0

    def reseed(self, *seed: int) -> None:
        """Seed the coming calls' sampling by ``seed`` (the run's seed and step): a resumed run samples alike."""
        self.seed, self.calls = tuple(seed), 0

    def release(self) -> None:
        """Hand the last call's KV pool back to the card (the step's rollouts are done; the update comes next):
        once ``_play`` has returned nothing refers to the pool, but PyTorch keeps its blocks cached."""
        release_cached_memory()

    @torch.no_grad()
    def _play(self, batch, budgets, temperature, on_message, max_live=None) -> list[tuple[list[int], list[float]]]:
        self.calls += 1
        last: list[tuple[list[int], list[float]]] = [([], [])] * len(batch)
        messages = [0] * len(batch)
        waiting = list(enumerate(zip(batch, budgets, strict=True)))[::-1]  # popped from the end: row 0 first
        live: dict[str, int] = {}  # request id: row
        reading: dict[str, list[int]] = {}  # an opening being read (request id: its prompt), until it has a token
        seed = int(np.random.SeedSequence([*self.seed, self.calls]).generate_state(1)[0])
        with self.mode(self.model), _continuous_batching(self.model, temperature, self.stop_ids, self.cache_tokens,
                                                         seed) as (manager, processor):

            def request(row: int, ids: list[int], budget: int) -> None:
                request_id = f"{row}-{messages[row]}"
                manager.add_request(list(ids), request_id=request_id, max_new_tokens=max(1, budget),
                                    eos_token_id=self.stop_ids)
                live[request_id] = row
                if messages[row] == 0:  # an opening: the rows that share most of it wait until it is read
                    reading[request_id] = ids

            def start_waiting() -> None:
                held = []
                while waiting and len(live) < min(max_live or len(batch), self.max_live or len(batch)):
                    row, (ids, budget) = waiting.pop()
                    if any(_shares_half(ids, other) for other in reading.values()):
                        held.append((row, (ids, budget)))  # its group's opening, or the same tool block: wait
                        continue
                    request(row, ids, budget)
                waiting.extend(held[::-1])

            start_waiting()
            while processor.prepare_next_batch():
                processor._generation_step(manager.model)
                processor.update_batch()
                for output in _finished(manager):
                    if output.error is not None:
                        raise RuntimeError(f"transformers' continuous batching failed a request: {output.error}")
                    row = live.pop(output.request_id)
                    ids, logprobs = list(output.generated_tokens), list(output.logprobs)
                    self.prompt_tokens += len(output.prompt_ids)
                    last[row] = (ids, logprobs)
                    follow = on_message(row, ids, logprobs) if on_message else None
                    if follow is not None:
                        messages[row] += 1
                        request(row, *follow)
                for request_id in list(reading):  # an opening is read once its request has a token
                    state = processor.scheduler.active_requests.get(request_id)
                    if request_id not in live or (state is not None and state.generated_len() > 0):
                        del reading[request_id]
                start_waiting()
            self.cached_tokens += processor.cache._total_prefix_length
        return last


def _shares_half(ids: list[int], other: list[int]) -> bool:
    """Whether ``other`` starts with at least the first half of ``ids`` (a slice comparison: every waiting row is
    checked against every opening being read, at each step with a free slot)."""
    half = -(-len(ids) // 2)
    return ids[:half] == other[:half]


def _finished(manager) -> list:
    """The outputs of the requests that ended in the last step (the processor delivers only finished ones)."""
    outputs = []
    with contextlib.suppress(queue.Empty):
        while True:
            outputs.append(manager.output_router.output_queue.get_nowait())
    return outputs


@contextlib.contextmanager
def _continuous_batching(model, temperature: float, stops: list[int], cache_tokens: int, seed: int):
    """(manager, processor) of one call: transformers' continuous batching on ``model``'s own forward, with a KV
    pool of ``cache_tokens`` and torch's generator seeded by ``seed``; afterwards the pool is freed, the model has
    its own attention back and torch's generator its state."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    transformers_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    attention = transformers_model.config._attn_implementation
    # paged from the start: transformers would otherwise replace sdpa by FlashAttention where installed
    transformers_model.set_attn_implementation(paged_attention(attention))
    # no top-k or top-p: transformers 5's defaults are None, and the model's own generation config is not read
    sampling = GenerationConfig(do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                eos_token_id=stops)
    config = ContinuousBatchingConfig(
        block_size=BLOCK_SIZE, num_blocks=-(-cache_tokens // BLOCK_SIZE), max_batch_tokens=PREFILL_TOKENS,
        return_logprobs=True, seed=seed,
        use_async_batching=False,  # driven step by step from this thread (its batches do not depend on timing)
        disable_nccl_graph_mixing=False,  # no tensor parallelism: nothing to set in NCCL's environment
    )
    devices = [transformers_model.device] if transformers_model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the trainer's own random state is not touched
        manager = transformers_model.init_continuous_batching(generation_config=sampling,
                                                              continuous_batching_config=config)
        try:
            yield manager, manager._create_batch_processor()  # seeds torch's generator with ``seed``
        finally:
            manager.batch_processor = None
            transformers_model.set_attn_implementation(attention)  # paged attention only while the call plays


def paged_attention(attention: str | None) -> str:
    """The paged attention a call plays with for a model loaded with ``attention``: the same kernel behind
    transformers' paged cache (``paged|sdpa`` for sdpa, the default), never a FlashAttention it was not given."""
    attention = attention or "sdpa"
    return attention if attention.startswith("paged|") else f"paged|{attention}"
