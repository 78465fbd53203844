"""Loading the policy: the one place that chooses between Unsloth, bitsandbytes and plain LoRA.

Three backends, tried in this order by ``policy.backend: auto``:

* ``unsloth``   Unsloth FastLanguageModel, 4-bit QLoRA with its fused kernels (an NVIDIA GPU and the
                ``gpu`` extra). Unsloth patches TRL when imported, so this module is imported, and the policy
                loaded, *before* seal_lite.training.grpo imports trl.
* ``peft-4bit`` transformers + bitsandbytes NF4 + peft LoRA: QLoRA without Unsloth. Chosen by auto only with an
                NVIDIA GPU; requested explicitly it also runs on a CPU (bitsandbytes 0.50 has CPU NF4 kernels),
                which is how the test suite covers the 4-bit path.
* ``peft``      LoRA on a bf16 or fp32 model, any device: the CPU path.

``choose_backend`` is pure, so the choice is tested without a GPU.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from seal_lite.recipe import Recipe

# Unsloth's LoRA targets: every linear projection of the decoder blocks (peft's "all-linear" equivalent).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


GPU_LIBRARY = {"unsloth": "unsloth", "peft-4bit": "bitsandbytes"}  # GPU backend -> the library it needs


class PolicyBackendError(RuntimeError):
    """The requested backend cannot run here; the message says why and what to use instead."""


def installed_backends() -> set[str]:
    """Which optional training libraries are importable (found without importing them: unsloth needs a GPU)."""
    return {name for name in ("unsloth", "bitsandbytes") if importlib.util.find_spec(name) is not None}


def choose_backend(requested: str, cuda_available: bool, installed: set[str]) -> tuple[str, str]:
    """(backend, reason) for ``policy.backend``; raises PolicyBackendError when the request cannot be met."""
    if requested in GPU_LIBRARY:
        library = GPU_LIBRARY[requested]
        if requested == "unsloth" and not cuda_available:  # without a GPU Unsloth silently becomes plain peft
            raise PolicyBackendError(f"policy.backend {requested} needs an NVIDIA GPU (none is visible to torch); "
                                     "use auto, peft-4bit or peft")
        if library not in installed:
            raise PolicyBackendError(f"policy.backend {requested} needs {library}: pip install -e '.[gpu]' "
                                     "(or use auto)")
        if not cuda_available:
            return requested, "requested in the recipe; NF4 on the CPU (bitsandbytes' CPU kernels)"
        return requested, "requested in the recipe"
    if requested == "peft":
        return "peft", "requested in the recipe"
    if cuda_available and "unsloth" in installed:
        return "unsloth", "auto: a GPU and Unsloth are available"
    if cuda_available and "bitsandbytes" in installed:
        return "peft-4bit", "auto: a GPU and bitsandbytes are available (no Unsloth)"
    if cuda_available:
        return "peft", "auto: a GPU without Unsloth or bitsandbytes (pip install -e '.[gpu]' for 4-bit)"
    return "peft", "auto: no GPU, LoRA on the CPU"


@dataclass
class Policy:
    model: object
    tokenizer: object
    backend: str
    reason: str
    dtype: object  # the compute dtype: decides TRL's bf16/fp16 mixed precision
    peft_config: object | None  # for TRL to wrap the model; None when the backend already added LoRA


def load_policy(model_dir: str, recipe: Recipe) -> Policy:
    """Load ``model_dir`` (a local directory or hub id) with the backend the recipe and the hardware allow."""
    import torch

    backend, reason = choose_backend(recipe.policy.backend, torch.cuda.is_available(), installed_backends())
    checkpointing = recipe.policy.gradient_checkpointing
    if checkpointing is None:
        checkpointing = torch.cuda.is_available()
    dtype = pick_dtype(recipe.policy.dtype, torch.cuda.is_available())
    if backend == "unsloth":
        model, tokenizer = _load_unsloth(model_dir, recipe, checkpointing)
        dtype, peft_config = model.dtype, None
    else:
        model, tokenizer = _load_transformers(model_dir, dtype, quantized=backend == "peft-4bit")
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()  # LoRA-only training: checkpointed inputs must carry grad
        peft_config = lora_config(recipe)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Policy(model, tokenizer, backend, reason, dtype, peft_config)


def pick_dtype(name: str, cuda_available: bool = False):
    import torch

    if name == "float32":
        return torch.float32
    if name == "auto" and cuda_available and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16  # a T4 has no bf16
    return torch.bfloat16  # ~1.7x faster than float32 on CPU, native on recent GPUs


def lora_config(recipe: Recipe):
    from peft import LoraConfig

    return LoraConfig(
        r=recipe.policy.lora_r,
        lora_alpha=recipe.policy.lora_alpha,
        lora_dropout=recipe.policy.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def _load_transformers(model_dir: str, dtype, quantized: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # the run shows its own progress; keep the terminal readable
    transformers_logging.disable_progress_bar()
    # clean-up of tokenization spaces corrupts BPE text (and warns); decode exactly what was generated
    tokenizer = AutoTokenizer.from_pretrained(model_dir, clean_up_tokenization_spaces=False)
    device_map = {"": 0} if torch.cuda.is_available() else {"": "cpu"}
    if not quantized:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device_map), tokenizer
    from peft import prepare_model_for_kbit_training

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization, dtype=dtype,
                                                 device_map=device_map)
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False), tokenizer


def _load_unsloth(model_dir: str, recipe: Recipe, checkpointing: bool):
    from unsloth import FastLanguageModel  # first: it patches transformers, peft and trl

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_dir,
        max_seq_length=recipe.rollout.max_context_tokens,
        load_in_4bit=True,
        dtype=None,  # Unsloth picks bf16, or fp16 where the GPU lacks bf16
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=recipe.policy.lora_r,
        lora_alpha=recipe.policy.lora_alpha,
        lora_dropout=recipe.policy.lora_dropout,
        target_modules=LORA_TARGETS,
        use_gradient_checkpointing="unsloth" if checkpointing else False,
        random_state=recipe.seed,
    )
    return model, tokenizer


def count_linear4bit(model) -> int:
    """Layers that compute with bitsandbytes NF4 weights (0 for a model that is not 4-bit)."""
    # bitsandbytes' class only: peft's LoRA wrapper around each of them is called Linear4bit too
    return sum(type(module).__name__ == "Linear4bit" and type(module).__module__.startswith("bitsandbytes")
               for module in model.modules())
