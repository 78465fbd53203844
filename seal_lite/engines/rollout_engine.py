"""The rollout engine a recipe asks for, and how it gets the current policy before each step.

transformers generates with the very model TRL trains, in rounds (seal_lite/engines/transformers_generate.py) or
continuously on paged attention (seal_lite/engines/paged_rollouts.py); llama.cpp
serves the policy's GGUF plus a LoRA GGUF exported from the trained adapter (seal_lite/engines/llamacpp.py,
seal_lite/engines/gguf_lora.py); vLLM serves the base model plus the trained adapter as saved by peft
(seal_lite/engines/vllm_rollouts.py). Training, evaluation and τ²-bench all get their engine here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from seal_lite.core.memory import paged_live_rows
from seal_lite.core.recipe import Recipe
from seal_lite.engines import distributed
from seal_lite.engines.model_sources import resolve_gguf


def rollout_backend(recipe: Recipe) -> str:
    """``rollout.backend`` with auto resolved (``rollout_choice``)."""
    return rollout_choice(recipe)[0]


def rollout_choice(recipe: Recipe, gpu: bool | None = None) -> tuple[str, str]:
    """(backend, why) for ``rollout.backend``; ``gpu``: whether torch sees a GPU (None: ask torch). auto picks the
    engine measured faster where it runs (docs/rollouts.md): without a GPU, llama.cpp when the policy comes from a
    GGUF, else paged (3.5x generate's speed on the same episodes: benchmarks/rollout_engines.py); on a GPU,
    transformers generate, until a GPU has measured paged and vLLM against it (they run when named)."""
    if recipe.rollout.backend != "auto":
        return recipe.rollout.backend, "rollout.backend"
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    if gpu:
        return "transformers", ("a GPU: token-budgeted generate; paged and vLLM run only when named (rollout.backend "
                                "paged or vllm) until a GPU has measured them")
    from seal_lite.engines.model_sources import REGISTRY

    if recipe.policy.model in REGISTRY or recipe.policy.model.endswith(".gguf"):
        return "llamacpp", "no GPU, and the policy is a GGUF"
    return "paged", "no GPU, and the policy is no GGUF: transformers' continuous batching"


@contextlib.contextmanager
def rollout_engine(recipe: Recipe, model, tokenizer, out_dir: Path, mode=None):
    """(generator, sync): who plays the rollouts, and how it gets the current policy before each step.

    transformers generates with the LoRA-wrapped model TRL trains, so it is always current; ``mode`` is the
    policy's generation_mode (None: eval mode). llama.cpp serves the policy's GGUF plus a LoRA GGUF exported from
    the trained adapter before every step; vLLM the base model plus the adapter as peft saves it.
    """
    backend = rollout_backend(recipe)
    if backend == "transformers":
        from seal_lite.engines.transformers_generate import TransformersGenerator

        yield TransformersGenerator(model, tokenizer, mode), lambda step: None
        return
    if backend == "paged":
        from seal_lite.engines.paged_rollouts import PagedGenerator

        pool = paged_cache_tokens(recipe, model)
        # no more episodes live than the pool holds at full length: more would be evicted and read again
        generator = PagedGenerator(model, tokenizer, cache_tokens=pool, seed=recipe.seed, mode=mode,
                                   max_live=paged_live_rows(pool, recipe.rollout.max_context_tokens,
                                                            recipe.generation_batch()))
        yield generator, lambda step: generator.reseed(recipe.seed, step)  # it plays with the trained model itself
        return
    if backend == "vllm":
        with _vllm_engine(recipe, model, tokenizer, out_dir) as engine:
            yield engine
        return
    from seal_lite.engines.gguf_lora import export_lora_gguf
    from seal_lite.engines.llamacpp import LlamaCppGenerator
    from seal_lite.engines.serving import usable_cores

    base = resolve_gguf(recipe.policy.model, "policy.model (rollout.backend llamacpp)")
    sharing = distributed.local_world_size()  # processes on this machine split its cores
    generator = LlamaCppGenerator(base, tokenizer, n_ctx=recipe.rollout.max_context_tokens, seed=recipe.seed,
                                  n_threads=max(1, usable_cores() // sharing) if sharing > 1 else None,
                                  cache_tokens=recipe.rollout.cache_tokens, live=recipe.generation_batch())

    lora = out_dir / ("rollout-lora.gguf" if distributed.world_size() == 1 else f"rollout-lora-{distributed.rank()}.gguf")

    def sync(step: int) -> None:
        generator.load_adapter(str(export_lora_gguf(model, Path(base), lora)))
        generator.reseed(recipe.seed, step)  # a resumed run samples step N exactly as the first attempt did

    try:
        yield generator, sync
    finally:
        generator.close()


@contextlib.contextmanager
def _vllm_engine(recipe: Recipe, model, tokenizer, out_dir: Path):
    import torch

    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import pick_dtype
    from seal_lite.engines.vllm_rollouts import VllmGenerator

    dtype, _ = pick_dtype(recipe.policy.dtype, torch.cuda.is_available())  # the dtype the policy trains in
    generator = VllmGenerator(resolve_model(recipe.policy.model), tokenizer,
                              max_model_len=recipe.rollout.max_context_tokens, seed=recipe.seed,
                              lora_rank=recipe.policy.lora_r, dtype=str(dtype).removeprefix("torch."),
                              quantized=bool(getattr(model, "is_loaded_in_4bit", False)),
                              cache_tokens=recipe.rollout.cache_tokens, memory_share=recipe.rollout.vllm_memory)
    adapter = out_dir / ("rollout-lora" if distributed.world_size() == 1 else f"rollout-lora-{distributed.rank()}")

    def sync(step: int) -> None:
        model.save_pretrained(str(adapter))  # peft writes the adapter alone: adapter_config.json and its weights
        generator.load_adapter(str(adapter))
        generator.reseed(recipe.seed, step)

    try:
        yield generator, sync
    finally:
        generator.close()


def paged_cache_tokens(recipe: Recipe, model) -> int:
    """The paged engine's KV pool, in tokens: ``rollout.cache_tokens``; else, on a GPU, what the memory model lets
    fit in the memory free once the policy is loaded, 10% of the card left free (``paged_pool_tokens``), else 4 x
    the context. Never less than one context and one prefill pass, so that any sequence fits."""
    import torch

    from seal_lite.core.memory import Shape, paged_pool_tokens
    from seal_lite.engines.paged_rollouts import PREFILL_TOKENS

    rollout = recipe.rollout
    tokens = rollout.cache_tokens or 4 * rollout.max_context_tokens
    if rollout.cache_tokens is None and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        dtype_bytes = torch.finfo(model.dtype).bits // 8
        tokens = paged_pool_tokens(Shape.from_config(model.config), free - 0.1 * total, PREFILL_TOKENS, dtype_bytes)
    return max(tokens, rollout.max_context_tokens + PREFILL_TOKENS)
