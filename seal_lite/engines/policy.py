"""Loading the policy: the one place that chooses between Unsloth, bitsandbytes and plain LoRA.

Three backends, tried in this order by ``policy.backend: auto``:

* ``unsloth``   Unsloth FastLanguageModel, 4-bit QLoRA with its fused kernels (an NVIDIA GPU and the
                ``gpu`` extra). Unsloth patches TRL when imported, so this module is imported, and the policy
                loaded, *before* seal_lite.training.grpo imports trl.
* ``peft-4bit`` transformers + bitsandbytes NF4 + peft LoRA: QLoRA without Unsloth. Chosen by auto only with an
                NVIDIA GPU; requested explicitly it also runs on a CPU (bitsandbytes 0.50 has CPU NF4 kernels),
                which is how the test suite covers the 4-bit path.
* ``peft``      LoRA on a bf16 or fp32 model, any device: the CPU path.

Departures from what the libraries do by default, each needed for correct training:

* trainable (LoRA) parameters stay fp32 (``keep_trainable_fp32``): trl 1.14.2 casts them to bf16 for 4-bit
  models, where most updates at lr 2e-5 round away and fp16's GradScaler refuses them;
* no ``prepare_model_for_kbit_training``: it upcasts embeddings and LM head to fp32 (about 2 GB on 7B) for no
  benefit to a LoRA that does not train them;
* the checkpoint's sampling defaults (Qwen's repetition_penalty 1.05, top_k, top_p) are dropped: rollouts must
  sample from the policy's own distribution at the rollout temperature, the one the loss scores them with;
* the pad token is never a token that ends a turn (Qwen pads with ``<|endoftext|>``, which it also emits):
  Unsloth rebuilds attention masks from the pad id;
* 4-bit layers never take bitsandbytes' CPU inference layout (``keep_4bit_layers_trainable``): on a CPU with
  AVX512_BF16 it repacks NF4 weights in eval mode, and training after that fails.

``choose_backend`` and ``cpu_native_bf16`` are pure, so the choices are tested without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.errors import ModelError
from seal_lite.core.recipe import Recipe
from seal_lite.engines import distributed

# Unsloth's LoRA targets: every linear projection of the decoder blocks (peft's "all-linear" equivalent).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


GPU_LIBRARY = {"unsloth": "unsloth", "peft-4bit": "bitsandbytes"}  # GPU backend -> the library it needs


class PolicyBackendError(ModelError):
    """The requested backend cannot run here; the message says why and what to use instead."""


class AdapterLoadError(ModelError):
    """A saved LoRA adapter does not fit the policy's LoRA: some weight would be left untrained."""


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


def resolve_backend(requested: str, cuda_available: bool, installed: set[str],
                    in_process: bool = True) -> tuple[str, str]:
    """``choose_backend``, then, for unsloth, its import: Unsloth can be installed yet fail to import (a torch or
    driver it does not support). auto then falls back to the next backend and says why; an explicit request
    fails with the import error. ``in_process=False`` tries the import in a child process, so that this one is
    left unpatched (``doctor``: its self-test must run the trainer a peft run gets, not Unsloth's)."""
    backend, reason = choose_backend(requested, cuda_available, installed)
    if backend != "unsloth":
        return backend, reason
    error = _import_unsloth() if in_process else _probe_unsloth()
    if error is None:
        return backend, reason
    failure = f"import unsloth failed ({error})"
    if requested != "auto":
        raise PolicyBackendError(f"policy.backend unsloth: {failure}; `seal-lite doctor` checks torch against the "
                                 "driver, pip install -e '.[gpu]' reinstalls the Unsloth seal-lite pins; or use "
                                 "auto, peft-4bit or peft")
    backend, reason = choose_backend("auto", cuda_available, installed - {"unsloth"})
    return backend, f"auto: {failure}; {reason.removeprefix('auto: ')}"


def _import_unsloth() -> str | None:
    """Import Unsloth here (it patches transformers, peft and trl: before trl's import); None, or why it failed."""
    try:
        import unsloth  # noqa: F401
    except Exception as error:  # whatever Unsloth raises on import, the backend is unusable here
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def _probe_unsloth() -> str | None:
    """``_import_unsloth`` in a child process, which this one never sees patched."""
    import subprocess
    import sys

    probe = ("import sys; from seal_lite.engines.policy import _import_unsloth; error = _import_unsloth(); "
             "print(error or '', end=''); sys.exit(bool(error))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "TimeoutExpired: no answer in 600 s"
    if done.returncode == 0:
        return None
    lines = done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
    return lines[-1]


@dataclass
class Policy:
    model: object
    tokenizer: object
    backend: str
    reason: str
    dtype: object  # the compute dtype: decides TRL's bf16/fp16 mixed precision
    peft_config: object | None  # for TRL to wrap the model; None when the backend already added LoRA
    gradient_checkpointing: bool = False  # for TRL's config on the peft paths (Unsloth applies its own)
    generation_mode: Callable | None = None  # the context rollouts are generated in (None: eval mode)
    max_sequence_width: int | None = None  # the widest padded row the model takes uncut (None: any); Unsloth's
    # forward truncates rows past its max_seq_length, and its loss then reads misaligned positions


def load_policy(model_dir: str, recipe: Recipe) -> Policy:
    """Load ``model_dir`` (a local directory or hub id) with the backend the recipe and the hardware allow."""
    import torch

    from seal_lite.engines.transformers_generate import eval_mode, stop_ids

    installed = installed_backends()
    if distributed.world_size() > 1:  # Unsloth trains on one GPU: several processes load the policy with peft
        installed -= {"unsloth"}
    backend, reason = resolve_backend(recipe.policy.backend, torch.cuda.is_available(), installed)
    checkpointing = recipe.policy.gradient_checkpointing
    if checkpointing is None:
        checkpointing = torch.cuda.is_available()
    dtype, _ = pick_dtype(recipe.policy.dtype, torch.cuda.is_available())
    if backend == "unsloth":
        unsloth_dtype = None if recipe.policy.dtype == "auto" else dtype  # None: Unsloth's own choice
        model, tokenizer = _load_unsloth(model_dir, recipe, checkpointing, unsloth_dtype)
        policy = Policy(model, tokenizer, backend, reason, model.dtype, None, False, _unsloth_generation_mode,
                        model.max_seq_length)
    else:
        model, tokenizer = _load_transformers(model_dir, dtype, quantized=backend == "peft-4bit")
        keep_4bit_layers_trainable(model)
        policy = Policy(model, tokenizer, backend, reason, dtype, lora_config(recipe), checkpointing, eval_mode)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.generation_config = sampling_free(base.generation_config)
    set_pad_token(tokenizer, base, stop_ids(tokenizer, base))
    return policy


def with_adapter(model, adapter: str | Path):
    """``model`` (a policy's) carrying the LoRA weights saved in ``adapter`` (a run's ``adapter/`` or checkpoint).

    A backend that adds its own LoRA (Unsloth) returns a model that is already a PeftModel. Wrapping that in a
    second PeftModel, as ``PeftModel.from_pretrained`` does, loads nothing (the saved keys do not match the doubly
    prefixed ones; peft only warns), so an evaluation would score the base model as the trained one. The weights
    are loaded into the existing adapter instead, and any LoRA weight of the model that the file lacks, or any
    saved weight with no place in the model, is an error."""
    from peft import PeftConfig, PeftModel, get_peft_model, load_peft_weights, set_peft_model_state_dict

    if not isinstance(model, PeftModel):
        model = get_peft_model(model, PeftConfig.from_pretrained(str(adapter)))
    loaded = set_peft_model_state_dict(model, load_peft_weights(str(adapter), device="cpu"))
    missing = [key for key in loaded.missing_keys if "lora_" in key]
    if missing or loaded.unexpected_keys:
        raise AdapterLoadError(
            f"the adapter in {adapter} does not fit the policy's LoRA ({len(missing)} LoRA weights missing, e.g. "
            f"{missing[:2]}; {len(loaded.unexpected_keys)} saved weights with no place, e.g. "
            f"{loaded.unexpected_keys[:2]}): was it trained with the same policy.model, lora_r and targets?")
    return model.eval()


def load_adapted(model_dir: str, adapter: str | Path):
    """(model, tokenizer): ``model_dir`` in its checkpoint's own precision, never 4-bit, carrying the LoRA saved in
    ``adapter`` (``with_adapter``); what ``seal-lite export`` merges or converts. Its generation config is the
    checkpoint's own, which a served model should keep. A QLoRA run's LoRA thus lands on the full-precision base,
    as QLoRA merges do: the policy trained on NF4 weights, so the result differs from it by NF4's rounding."""
    model, tokenizer = _load_transformers(model_dir, "auto", quantized=False)
    return with_adapter(model, adapter), tokenizer


def save_merged(model, tokenizer, out_dir: str | Path) -> None:
    """Fold ``model``'s LoRA into its base weights (peft's ``merge_and_unload``: W + scaling·B·A) and save the plain
    transformers model, with its tokenizer, into ``out_dir``. ``model`` is spent: its layers now hold the merge."""
    merged = model.merge_and_unload()
    merged.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def sampling_free(generation_config):
    """The checkpoint's generation config without its sampling defaults: only token ids and lengths stay.

    transformers 5 fills every generate() argument left unset from the model's generation config, so Qwen's
    repetition_penalty 1.05 (and its top_k 20, top_p 0.8) would shape every rollout: the sampled tokens would
    not come from the distribution the GRPO loss scores them with (softmax(logits / T))."""
    from transformers import GenerationConfig

    kept = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "max_length")
    return GenerationConfig(**{name: getattr(generation_config, name) for name in kept
                               if getattr(generation_config, name, None) is not None})


def set_pad_token(tokenizer, model, stops: set[int]) -> None:
    """Pad with a token the model never ends a turn with. Unsloth rebuilds attention masks from the pad id, so
    a pad token that is also a stop token the model emits (Qwen's ``<|endoftext|>``) would hide real tokens.

    Order: the tokenizer's own pad token if it is not a stop token; else a special token named like a pad
    (Qwen's ``<|fim_pad|>``); else any other special token that is not a stop token and not in the chat template;
    else, for a tokenizer without a spare special token, the old pad or eos, which the peft paths tolerate:
    they build every mask from lengths."""
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id not in stops:
        return
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    candidates = [token.content for index, token in sorted(tokenizer.added_tokens_decoder.items())
                  if token.special and index not in stops and token.content not in template]
    named = [token for token in candidates if "pad" in token.lower()]
    tokenizer.pad_token = (named or candidates or [tokenizer.pad_token or tokenizer.eos_token])[0]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.pad_token_id = tokenizer.pad_token_id


@contextlib.contextmanager
def _unsloth_generation_mode(model):
    """Unsloth's own switches, as its RL trainers' generation sets them (unsloth/models/rl.py,
    ``unsloth_unwrap_model_for_generation``): for_inference turns on its fast generation path (model.eval() leaves
    its training kernels and checkpointing on); inside ``rl_generation`` its decode step replays CUDA graphs, which
    plain ``generate`` never does (Unsloth 2026.10.9 captures them for Llama and Qwen3 models; a Qwen2.5 policy
    decodes eagerly still); afterwards ``release_for_training`` frees the graphs and their decode buffers (an
    optimizer step would invalidate them anyway) and for_training restores the training kernels for the update."""
    from unsloth import FastLanguageModel
    from unsloth.models import _decode_graphs

    was_training = model.training
    FastLanguageModel.for_inference(model)
    try:
        with _decode_graphs.rl_generation():
            yield
    finally:
        _decode_graphs.release_for_training(model)
        if was_training:
            FastLanguageModel.for_training(model)


# CPU flags (Linux /proc/cpuinfo) under which torch computes bf16 matmuls natively (oneDNN); elsewhere bf16 is
# emulated: on an AVX2 EPYC SmolLM2's forward took 14.3 s in bf16 against 2.9 s in fp32 (issue 15).
NATIVE_BF16_FLAGS = {"avx512_bf16": "AVX512_BF16", "amx_bf16": "AMX"}


def cpu_native_bf16(cpuinfo: str | None = None) -> tuple[bool, str]:
    """(native, reason): whether this CPU computes bf16 natively, from the flags in ``cpuinfo`` (default: read
    /proc/cpuinfo)."""
    from seal_lite.engines.llama_build import cpu_flags

    flags = cpu_flags(cpuinfo)
    if flags is None:
        return False, "the CPU's flags are unknown here (no /proc/cpuinfo)"
    found = [name for flag, name in NATIVE_BF16_FLAGS.items() if flag in flags]
    if found:
        return True, f"the CPU has {' and '.join(found)}"
    return False, "the CPU has neither AVX512_BF16 nor AMX: bf16 would be emulated, several times slower than fp32"


def pick_dtype(name: str, cuda_available: bool = False, cpuinfo: str | None = None):
    """(dtype, reason) for ``policy.dtype``."""
    import torch

    if name == "float32":
        return torch.float32, "requested in the recipe"
    if name == "bfloat16":
        return torch.bfloat16, "requested in the recipe"
    if name == "float16":
        return torch.float16, "requested in the recipe"
    if cuda_available:
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.float16, "auto: the GPU has no native bf16 (before Ampere, e.g. a T4)"
        return torch.bfloat16, "auto: the GPU computes bf16 natively"
    native, why = cpu_native_bf16(cpuinfo)
    return (torch.bfloat16 if native else torch.float32), f"auto: {why}"


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
    device_map = {"": distributed.local_rank()} if torch.cuda.is_available() else {"": "cpu"}  # one GPU per process
    if not quantized:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device_map), tokenizer
    # Not peft's prepare_model_for_kbit_training: it upcasts every non-4-bit weight (embeddings, LM head, norms)
    # to fp32, about 2 GB more on 7B, and the LoRA never trains them. Freezing and input gradients for
    # checkpointing are done by peft and TRL.
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization, dtype=dtype,
                                                 device_map=device_map)
    return model, tokenizer


def keep_trainable_fp32(model) -> int:
    """Cast every trainable parameter back to fp32; returns how many were not. trl 1.14.2 casts them to bf16 for
    4-bit models (GRPOTrainer.__init__, "When using QLoRA"): at lr 2e-5 most LoRA updates then round away (257
    of 8192 lora_A entries moved in two updates, against all in fp32), and fp16's GradScaler refuses to unscale
    fp16 gradients. The optimizer is created later, in train(), so it sees the fp32 tensors."""
    import torch

    cast = 0
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
            cast += 1
    return cast


def keep_4bit_layers_trainable(model) -> None:
    """Keep every bitsandbytes NF4 layer in its training layout.

    bitsandbytes 0.50.2's ``Linear4bit.forward``, on a CPU where it detects AVX512_BF16, repacks the weight into a
    CPU inference layout (``_convert_weight_packed_for_cpu``) the first time it runs in eval mode on an input
    without grad, and nothing converts it back when training resumes. A policy samples its rollouts in eval mode
    and then trains, so without this guard the update fails (``result += bias`` under autograd on q/k/v, or a
    shape error in dequantization). Undoing the repack instead would not give back the same weights: the packed
    layout keeps the block scales in bf16, and the inverse re-quantizes them (a "best-effort" inverse). Keeping
    the training layout also means rollouts are sampled by the same kernel that scores them in the loss."""
    for module in model.modules():
        if _is_bnb_linear4bit(module):
            module.support_avx512bf16_for_cpu = False  # the only switch forward() reads before repacking


def packed_for_cpu_inference(model) -> int:
    """NF4 layers whose weight bitsandbytes has repacked into its CPU inference layout (0 for a trainable policy)."""
    return sum(_is_bnb_linear4bit(module) and bool(getattr(module.weight.quant_state, "packing_format_for_cpu", False))
               for module in model.modules())


def _is_bnb_linear4bit(module) -> bool:
    # bitsandbytes' class only: peft's LoRA wrapper around each of them is called Linear4bit too
    return type(module).__name__ == "Linear4bit" and type(module).__module__.startswith("bitsandbytes")


def count_linear4bit(model) -> int:
    """Layers that compute with bitsandbytes NF4 weights (0 for a model that is not 4-bit)."""
    return sum(_is_bnb_linear4bit(module) for module in model.modules())


def unsloth_max_seq_length(max_context_tokens: int, max_position_embeddings: int) -> int:
    """Unsloth's ``max_seq_length`` for a run: the widest row TRL can hand it. TRL pads every row of a step to the
    longest prompt plus the longest completion, and each trajectory is at most ``max_context_tokens`` long, so a
    row is at most twice that. Capped at the model's own window: past it Unsloth would rescale RoPE, training a
    different model (a wider row is then refused, see ``SealGRPOTrainer``)."""
    return min(2 * max_context_tokens, max_position_embeddings)


def _load_unsloth(model_dir: str, recipe: Recipe, checkpointing: bool, dtype=None):
    from transformers import AutoConfig
    from unsloth import FastLanguageModel  # first: it patches transformers, peft and trl

    window = AutoConfig.from_pretrained(model_dir).max_position_embeddings
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model_dir,
        max_seq_length=unsloth_max_seq_length(recipe.rollout.max_context_tokens, window),
        load_in_4bit=True,
        dtype=dtype,  # None (auto): Unsloth picks bf16, or fp16 where the GPU lacks bf16
        # the model named, not Unsloth's pre-quantized mirror of it (its mapper swaps Qwen/... for unsloth/...-bnb-4bit,
        # which fails offline and trains another base than the store records)
        use_exact_model_name=True,
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
