"""Rollout generation with transformers ``generate`` on the policy being trained (base + LoRA).

Batched with left padding; each returned sequence is cut right after its first stop token.
"""

from __future__ import annotations

import time

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from seal_lite import profile


class TransformersGenerator:
    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = sorted(_stop_ids(tokenizer, model))

    @torch.no_grad()
    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        pad = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=self.model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=self.model.device)
        was_training = self.model.training
        self.model.eval()
        first_token = _FirstCall()
        started = time.perf_counter()
        try:
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
        finally:
            self.model.train(was_training)
        prefill_end = first_token.at or time.perf_counter()
        profile.add("prefill", prefill_end - started)  # reading the prompts, up to the first token's logits
        profile.add("decode", time.perf_counter() - prefill_end)
        return [self._cut(row[width:].tolist()) for row in output]

    def _cut(self, ids: list[int]) -> list[int]:
        for position, token in enumerate(ids):
            if token in self.stop_ids:
                return ids[: position + 1]
        return ids


class _FirstCall(LogitsProcessor):
    """Notes when the first logits arrive: the end of the prompt's forward pass."""

    at: float | None = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def _stop_ids(tokenizer, model) -> set[int]:
    stops = set()
    for source in (tokenizer.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(source, int):
            stops.add(source)
        elif source:
            stops.update(source)
    im_end = tokenizer.get_vocab().get("<|im_end|>")
    if im_end is not None:
        stops.add(im_end)
    return stops
