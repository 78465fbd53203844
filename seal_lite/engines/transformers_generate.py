"""Rollout generation with transformers ``generate`` on the policy being trained (base + LoRA).

Batched with left padding; each returned sequence is cut right after its first stop token. Sampling is plain
softmax(logits / T): the model's generation config carries no sampling defaults (``policy.sampling_free``) and
top-k/top-p are off, so the rollouts come from the distribution the GRPO loss scores them with.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from seal_lite.core import timing


@contextlib.contextmanager
def eval_mode(model):
    """Generation with dropout off; the training mode comes back afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class TransformersGenerator:
    """``mode(model)`` is the context generation runs in: the policy's ``generation_mode`` (Unsloth's
    for_inference, whose patched ``generate`` is Unsloth's fast generation), by default eval mode (no dropout)."""

    def __init__(self, model, tokenizer, mode: Callable | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.mode = mode or eval_mode
        self.stop_ids = sorted(stop_ids(tokenizer, model))

    def release(self) -> None:
        """The step's rollouts are done: hand their KV caches back to the card for the update."""
        release_cached_memory()

    @torch.no_grad()
    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=self.model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=self.model.device)
        first_token = _FirstCall()
        started = time.perf_counter()
        with self.mode(self.model):
            output = self.model.generate(
                logits_processor=LogitsProcessorList([first_token]),
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,  # 0: greedy
                top_k=0,
                top_p=1.0,
                eos_token_id=self.stop_ids,
                pad_token_id=pad,
            )
        prefill_end = first_token.at or time.perf_counter()
        timing.add("prefill", prefill_end - started)  # reading the prompts, up to the first token's logits
        timing.add("decode", time.perf_counter() - prefill_end)
        return [self._cut(row[width:].tolist()) for row in output]

    def _cut(self, ids: list[int]) -> list[int]:
        for position, token in enumerate(ids):
            if token in self.stop_ids:
                return ids[: position + 1]
        return ids


def release_cached_memory() -> None:
    """Give the memory of tensors no longer used back to the card. PyTorch keeps freed blocks cached for itself, so
    the rollouts' KV caches would stay taken as far as the driver (``mem_get_info``) and anything sized from it
    can tell. A no-op without CUDA."""
    gc.collect()  # tensors held only by reference cycles
    torch.cuda.empty_cache()


class _FirstCall(LogitsProcessor):
    """Notes when the first logits arrive: the end of the prompt's forward pass."""

    at: float | None = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def stop_ids(tokenizer, model=None) -> set[int]:
    """Every token that ends a model turn: the tokenizer's and the model's eos ids (when ``model`` is given; the
    other engines have the tokenizer alone), ChatML's <|im_end|> and Llama 3's <|eot_id|> and <|eom_id|> (a Llama
    tokenizer may name <|end_of_text|> its eos)."""
    stops = set()
    model_eos = model.generation_config.eos_token_id if model is not None else None
    for source in (tokenizer.eos_token_id, model_eos):
        if isinstance(source, int):
            stops.add(source)
        elif source:
            stops.update(source)
    vocabulary = tokenizer.get_vocab()
    stops.update(vocabulary[token] for token in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>") if token in vocabulary)
    return stops
