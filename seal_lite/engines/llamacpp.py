"""The CPU rollout engine: llama.cpp playing rollouts from the policy's GGUF plus its current LoRA.

``LlamaCppGenerator`` is the ``Generator`` of seal_lite/step/rollout.py on a CPU: each trajectory keeps its own
context (and so its cache) between its model calls, and a task's prompt is read once for its G trajectories.
The diagnoser's chat models, in-process or served, are seal_lite/engines/serving.py.
"""

from __future__ import annotations

import time

from seal_lite.core import timing
from seal_lite.engines.serving import BackendError, usable_cores


class LlamaCppGenerator:
    """Rollouts with llama.cpp: the ``Generator`` of seal_lite/step/rollout.py, for the CPU.

    ``tokenizer`` is the same model's Hugging Face tokenizer (a GGUF and the model converted from it share the
    vocabulary). Prefill is what costs on a CPU (an episode's prompt holds thousands of tokens of tool docs), so
    nothing is read twice:

    * one llama.cpp context per trajectory slot, each keeping its own KV cache, so a trajectory's next model call
      only reads what the environment appended since its last one;
    * a task's G trajectories share their prompt: one context reads it, the others copy its KV cache.

    Sampling is done here (softmax of logits / T, numpy), so the log-probability of every sampled token is known
    exactly; ``sampled_logprobs`` holds them for the last ``generate`` call, aligned with its output.
    ``load_adapter`` puts a LoRA GGUF (seal_lite/engines/gguf_lora.py) on top of the base model in every context, in
    place: llama-cpp-python would stop memory-mapping the model if the LoRA were given when loading it.
    """

    batches_tasks = False  # a context per sequence: a batch holds one task's group, whose prompt is shared

    def __init__(self, model_path: str, tokenizer, n_ctx: int = 8192, n_threads: int | None = None, seed: int = 0,
                 lora_path: str | None = None):
        import numpy as np

        self.tokenizer, self.model_path, self.n_ctx = tokenizer, model_path, n_ctx
        self.n_threads = n_threads or usable_cores()
        self.rng = np.random.default_rng(seed)
        self.lora_path = lora_path
        self.contexts: list = []
        self.adapters: list = []  # the LoRA loaded into each context's model, or None
        self.sampled_logprobs: list[list[float]] = []
        vocab = tokenizer.get_vocab()
        self.stop_ids = {token for token in (tokenizer.eos_token_id, vocab.get("<|im_end|>")) if token is not None}

    def reseed(self, *seed: int) -> None:
        import numpy as np

        self.rng = np.random.default_rng(list(seed))

    def load_adapter(self, lora_path: str | None) -> None:
        """Use a new LoRA (the policy after an update) in every context; their caches are dropped."""
        self.lora_path = lora_path
        for slot in range(len(self.contexts)):
            self._apply_adapter(slot)

    def _apply_adapter(self, slot: int) -> None:
        import ctypes

        import llama_cpp
        from llama_cpp._utils import suppress_stdout_stderr

        llm, old = self.contexts[slot], self.adapters[slot]
        adapter = None
        if self.lora_path:
            with suppress_stdout_stderr(disable=False):  # a warning per tensor on a quantized model, every step
                adapter = llama_cpp.llama_adapter_lora_init(llm.model, self.lora_path.encode())
            if not adapter:
                raise BackendError(f"llama.cpp could not load the LoRA {self.lora_path}")
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter) if adapter else None
        scales = (ctypes.c_float * 1)(1.0) if adapter else None
        if llama_cpp.llama_set_adapters_lora(llm.ctx, adapters, 1 if adapter else 0, scales):
            raise BackendError(f"llama.cpp could not apply the LoRA {self.lora_path}")
        if old:
            llama_cpp.llama_adapter_lora_free(old)
        self.adapters[slot] = adapter
        llm.n_tokens = 0  # the cache was computed with the previous weights

    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        from llama_cpp import Llama

        while len(self.contexts) < len(batch):
            llm = Llama(self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads, n_threads_batch=self.n_threads,
                        flash_attn=True, seed=0, verbose=False)
            self.stop_ids.add(llm.token_eos())
            self.contexts.append(llm)
            self.adapters.append(None)
            self._apply_adapter(len(self.contexts) - 1)
        slots = self._assign(batch)
        results, self.sampled_logprobs = [], []
        for ids, slot in zip(batch, slots, strict=True):
            new, logprobs = self._continue(self.contexts[slot], ids, max_new_tokens, temperature)
            results.append(new)
            self.sampled_logprobs.append(logprobs)
        return results

    def _assign(self, batch: list[list[int]]) -> list[int]:
        """Give each sequence the free context whose cache shares the longest prefix with it. Contexts that hold
        less than the prefix all sequences share (a new task's prompt) get it copied from one that read it."""
        free, slots = list(range(len(self.contexts))), []
        for ids in batch:
            best = max(free, key=lambda slot: _common_prefix(self.contexts[slot], ids))
            free.remove(best)
            slots.append(best)
        shared = min(_prefix_length(batch[0], ids) for ids in batch)
        lacking = [slot for slot in slots if _common_prefix(self.contexts[slot], batch[0]) < shared]
        if len(batch) < 2 or shared < 2 or len(lacking) < 2:
            return slots
        with timing.phase("prefill"):
            donor = max(slots, key=lambda slot: _common_prefix(self.contexts[slot], batch[0]))
            if donor in lacking:
                self._read(self.contexts[donor], batch[0][:shared])  # the shared prompt, read once
            for slot in lacking:
                if slot != donor:
                    _copy_cache(self.contexts[donor], self.contexts[slot], shared)
        return slots

    def _read(self, llm, ids: list[int]) -> None:
        """Make ``llm``'s cache hold exactly ``ids``, reading only what it does not already hold."""
        keep = min(_common_prefix(llm, ids), len(ids))
        llm.n_tokens = keep  # Llama.eval (llama.cpp token decoding) drops the cache beyond n_tokens first
        if keep < len(ids):
            llm.eval(ids[keep:])

    def _continue(self, llm, ids: list[int], max_new_tokens: int, temperature: float):
        import llama_cpp
        import numpy as np

        with timing.phase("prefill"):
            self._read(llm, ids[:-1])
            llm.eval(ids[-1:])  # always read the last token, so the logits of the next position are fresh
        started = time.perf_counter()
        n_vocab = llm.n_vocab()
        new, logprobs = [], []
        while True:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            scaled = logits / temperature if temperature > 0 else logits  # temperature 0: greedy
            scaled = scaled - scaled.max()
            cumulative = np.cumsum(np.exp(scaled), dtype=np.float64)
            if temperature > 0:
                token = min(int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")),
                            n_vocab - 1)
            else:
                token = int(np.argmax(scaled))
            logprobs.append(float(scaled[token] - np.log(cumulative[-1])))
            new.append(token)
            if token in self.stop_ids or len(new) >= max_new_tokens:
                break
            llm.eval([token])
        timing.add("decode", time.perf_counter() - started)
        return new, logprobs

    def close(self) -> None:
        import llama_cpp

        for llm, adapter in zip(self.contexts, self.adapters, strict=True):
            if adapter:
                llama_cpp.llama_set_adapters_lora(llm.ctx, None, 0, None)
                llama_cpp.llama_adapter_lora_free(adapter)
            llm.close()
        self.contexts, self.adapters = [], []


def _prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _common_prefix(llm, ids: list[int]) -> int:
    return _prefix_length(llm.input_ids[: llm.n_tokens].tolist(), ids)


def _copy_cache(source, target, n_tokens: int) -> None:
    """Copy the KV cache of ``source``'s first ``n_tokens`` into ``target`` (same model, sequence 0)."""
    import ctypes

    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size(source.ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(source.ctx, buffer, size, 0)
    target._ctx.kv_cache_seq_rm(-1, 0, -1)
    if llama_cpp.llama_state_seq_set_data(target.ctx, buffer, written, 0) != written:
        raise BackendError("llama.cpp could not copy a prompt's cache between contexts")
    target._ctx.kv_cache_seq_rm(-1, n_tokens, -1)  # keep only the shared prefix of the donor's sequence
    target.input_ids[:n_tokens] = source.input_ids[:n_tokens]
    target.n_tokens = n_tokens


