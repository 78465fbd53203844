"""The rollout engine a recipe asks for, and how it gets the current policy before each step.

transformers generates with the very model TRL trains (seal_lite/engines/transformers_generate.py); llama.cpp
serves the policy's GGUF plus a LoRA GGUF exported from the trained adapter (seal_lite/engines/llamacpp.py,
seal_lite/engines/gguf_lora.py). Training, evaluation and τ²-bench all get their engine here.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from seal_lite.core.recipe import Recipe
from seal_lite.engines import distributed
from seal_lite.engines.model_sources import resolve_gguf


def rollout_backend(recipe: Recipe) -> str:
    """``rollout.backend`` with auto resolved: llama.cpp on a CPU when the policy comes from a GGUF."""
    if recipe.rollout.backend != "auto":
        return recipe.rollout.backend
    import torch

    from seal_lite.engines.model_sources import REGISTRY

    is_gguf = recipe.policy.model in REGISTRY or recipe.policy.model.endswith(".gguf")
    return "llamacpp" if is_gguf and not torch.cuda.is_available() else "transformers"


@contextlib.contextmanager
def rollout_engine(recipe: Recipe, model, tokenizer, out_dir: Path, mode=None):
    """(generator, sync): who plays the rollouts, and how it gets the current policy before each step.

    transformers generates with the LoRA-wrapped model TRL trains, so it is always current; ``mode`` is the
    policy's generation_mode (None: eval mode). llama.cpp serves the policy's GGUF plus a LoRA GGUF exported from
    the trained adapter before every step.
    """
    if rollout_backend(recipe) == "transformers":
        from seal_lite.engines.transformers_generate import TransformersGenerator

        yield TransformersGenerator(model, tokenizer, mode), lambda step: None
        return
    from seal_lite.engines.gguf_lora import export_lora_gguf
    from seal_lite.engines.llamacpp import LlamaCppGenerator
    from seal_lite.engines.serving import usable_cores

    base = resolve_gguf(recipe.policy.model, "policy.model (rollout.backend llamacpp)")
    sharing = distributed.local_world_size()  # processes on this machine split its cores
    generator = LlamaCppGenerator(base, tokenizer, n_ctx=recipe.rollout.max_context_tokens, seed=recipe.seed,
                                  n_threads=max(1, usable_cores() // sharing) if sharing > 1 else None,
                                  cache_tokens=recipe.rollout.cache_tokens)

    lora = out_dir / ("rollout-lora.gguf" if distributed.world_size() == 1 else f"rollout-lora-{distributed.rank()}.gguf")

    def sync(step: int) -> None:
        generator.load_adapter(str(export_lora_gguf(model, Path(base), lora)))
        generator.reseed(recipe.seed, step)  # a resumed run samples step N exactly as the first attempt did

    try:
        yield generator, sync
    finally:
        generator.close()
