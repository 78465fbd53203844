"""The policy's LoRA as a llama.cpp adapter GGUF, so CPU rollouts run the original GGUF plus the current adapter.

The file is what llama.cpp's own ``convert_lora_to_gguf.py`` writes: ``general.type = "adapter"``,
``adapter.type = "lora"``, ``adapter.lora.alpha``, and for every LoRA'd weight ``<gguf tensor>.lora_a`` (PyTorch
shape [r, in]) and ``<gguf tensor>.lora_b`` ([out, r]), in f32. llama.cpp (src/llama-adapter.h, ``get_scale``)
multiplies B·A by ``alpha / r`` with r read from B's shape, and by 1 when alpha is 0; we write ``alpha`` so that
this equals peft's ``scaling`` (alpha / r, or alpha / sqrt(r) with rsLoRA), and fold the ratio into B for modules
whose scaling differs from the common one (peft's rank_pattern / alpha_pattern).

Names come from gguf's ``TensorNameMap`` for the base GGUF's architecture. llama.cpp's HF→GGUF converter
permutes the rows of q_proj and k_proj for the llama architecture (``LlamaModel.permute``, rotary pairs
interleaved per head; k with the KV head count), so B of those modules gets the same row permutation; A spans
input features and is untouched. Other architectures are accepted only once we know whether they permute.

This runs after every policy update. Reading the base GGUF's header with ``GGUFReader`` costs seconds (it parses
the whole tokenizer), so what we need from it is read once per file and cached.

``export_merged_gguf`` folds the same tensors into the base GGUF instead (``seal-lite export --to gguf``): each
LoRA'd matrix becomes W + (alpha / r)·B·A, computed in f32 from the de-quantized W in llama.cpp's own layout (so
q/k are already permuted) and written as ``weight_type``; every other tensor and every header field (tokenizer,
chat template) is copied byte for byte. Tensors are written one at a time, so a 7B model never sits in memory.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seal_lite.core.errors import ModelError

ADAPTER_NAME = "default"
# general.architecture -> whether llama.cpp's converter permutes q/k rows (checked against convert_hf_to_gguf.py)
PERMUTES_QK = {"llama": True, "qwen2": False}
# What a merged GGUF's LoRA'd matrices can be written as: the types gguf-py can encode. f16 is llama.cpp's own
# converter's usual output; q8_0 halves it again; anything smaller is llama.cpp's llama-quantize's job.
MERGED_TYPES = ("f16", "f32", "bf16", "q8_0")


class GGUFLoraError(ModelError):
    """The adapter cannot be written for this base GGUF; the message names the module or tensor."""


@dataclass(frozen=True)
class BaseGGUF:
    """What the export needs from the base GGUF's header."""

    arch: str
    block_count: int
    head_count: int
    head_count_kv: int
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape in ggml order (ne: [in, out] for a matrix)


def export_lora_gguf(peft_model, base_gguf: Path, out_path: Path) -> Path:
    """Write ``peft_model``'s current "default" LoRA as a llama.cpp LoRA GGUF for ``base_gguf``; return ``out_path``.

    The file is written next to ``out_path`` and renamed over it, so a reader never sees half a file.
    """
    import gguf

    base = read_base_gguf(Path(base_gguf))
    tensors, alpha = lora_tensors(peft_model, base)
    with _written_in_place_of(Path(out_path)) as partial:
        writer = gguf.GGUFWriter(partial, base.arch)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, array in tensors:
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(out_path)


def export_merged_gguf(peft_model, base_gguf: Path, out_path: Path, weight_type: str = "f16") -> Path:
    """Write ``base_gguf`` with ``peft_model``'s "default" LoRA merged into it, as one GGUF llama.cpp runs without
    an adapter; the LoRA'd matrices are written as ``weight_type`` (one of ``MERGED_TYPES``), all else as it is in
    ``base_gguf``. Written next to ``out_path`` and renamed over it; returns ``out_path``."""
    import gguf

    if weight_type not in MERGED_TYPES:
        raise GGUFLoraError(f"weight type {weight_type!r}: use one of {', '.join(MERGED_TYPES)}")
    qtype = gguf.GGMLQuantizationType[weight_type.upper()]
    base = read_base_gguf(Path(base_gguf))
    tensors, alpha = lora_tensors(peft_model, base)
    arrays = dict(tensors)
    pairs = {name.removesuffix(".lora_a"): (arrays[name], arrays[name.removesuffix("_a") + "_b"])
             for name in arrays if name.endswith(".lora_a")}  # base tensor name -> (A, B)
    reader = gguf.GGUFReader(str(base_gguf))

    def merged(tensor) -> np.ndarray:
        a, b = pairs[tensor.name]
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(b.shape[0], a.shape[1])
        scale = np.float32(llama_scale(alpha, a.shape[0]))
        try:
            return gguf.quants.quantize(weight + scale * (b @ a), qtype)
        except gguf.quants.QuantError as error:  # q8_0 needs rows of a multiple of 32 values
            raise GGUFLoraError(f"{tensor.name}: {error}; choose f16 instead") from None

    with _written_in_place_of(Path(out_path)) as partial:
        writer = gguf.GGUFWriter(partial, base.arch)
        for field in reader.fields.values():  # the header as it is (tokenizer, chat template), but the file type
            if field.name.startswith("GGUF.") or field.name in (gguf.Keys.General.ARCHITECTURE,
                                                                  gguf.Keys.General.FILE_TYPE):
                continue
            kind = field.types[0]
            writer.add_key_value(field.name, field.contents(), kind,
                                 sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if weight_type == "f32" else
                             gguf.LlamaFileType[f"MOSTLY_{weight_type.upper()}"])
        for tensor in reader.tensors:  # the layout first, then the data one tensor at a time
            if tensor.name in pairs:  # described by its bytes per row, which every type has
                stored = gguf.quants.quant_shape_to_byte_shape((int(tensor.shape[1]), int(tensor.shape[0])), qtype)
                writer.add_tensor_info(tensor.name, stored, np.dtype(np.uint8), int(np.prod(stored)), raw_dtype=qtype)
            else:
                writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                                       raw_dtype=tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            data = merged(tensor) if tensor.name in pairs else tensor.data
            writer.write_tensor_data(data, tensor_endianess=reader.endianess)
        writer.close()
    return Path(out_path)


@contextlib.contextmanager
def _written_in_place_of(out_path: Path):
    """A temporary path beside ``out_path`` to write, renamed over ``out_path`` when the block ends without an
    error (removed when it fails): a reader never sees half a file."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".partial", dir=out_path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(partial, 0o666 & ~umask)  # mkstemp's file is private (0600); give the mode open() would: exports are shared
    try:
        yield partial
        os.replace(partial, out_path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def llama_scale(alpha: float, rank: int) -> float:
    """The factor llama.cpp multiplies a LoRA's B·A by (src/llama-adapter.h, ``get_scale``): alpha / r, or 1
    when the file's alpha is 0."""
    return alpha / rank if alpha else 1.0


def lora_tensors(peft_model, base: BaseGGUF) -> tuple[list[tuple[str, np.ndarray]], float]:
    """The (name, f32 array) pairs of the adapter file and the alpha to write, for ``base``."""
    import gguf
    import torch
    from peft.tuners.lora import LoraLayer

    if base.arch not in PERMUTES_QK:
        known = ", ".join(sorted(PERMUTES_QK))
        raise GGUFLoraError(f"LoRA export to GGUF is not set up for architecture {base.arch!r} (known: {known})")
    arch_enum = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}[base.arch]
    name_map = gguf.get_tensor_name_map(arch_enum, base.block_count)

    layers = []  # (peft module name, gguf tensor name, A, B, peft scaling)
    with torch.no_grad():
        for module_name, module in peft_model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            if ADAPTER_NAME in getattr(module, "lora_embedding_A", {}):
                raise GGUFLoraError(f"{module_name}: LoRA on embeddings is not exported to GGUF (linear layers only)")
            if ADAPTER_NAME not in module.lora_A:
                continue
            if not isinstance(module.lora_A[ADAPTER_NAME], torch.nn.Linear):
                raise GGUFLoraError(f"{module_name}: only LoRA on linear layers can be exported to GGUF")
            if module.use_dora.get(ADAPTER_NAME):
                raise GGUFLoraError(f"{module_name}: DoRA adapters cannot run in llama.cpp")
            if module.lora_B[ADAPTER_NAME].bias is not None:
                raise GGUFLoraError(f"{module_name}: LoRA with a bias (lora_bias) cannot run in llama.cpp")
            hf_name = module_name.removeprefix("base_model.model.")
            gguf_name = name_map.get_name(hf_name + ".weight", try_suffixes=(".weight",))
            if gguf_name is None or gguf_name not in base.shapes:
                raise GGUFLoraError(
                    f"LoRA'd module {hf_name} has no tensor in the base GGUF"
                    + (f" (expected {gguf_name})" if gguf_name else f" (no {base.arch} GGUF name for {hf_name}.weight)")
                )
            a = module.lora_A[ADAPTER_NAME].weight.detach().to(device="cpu", dtype=torch.float32).numpy()
            b = module.lora_B[ADAPTER_NAME].weight.detach().to(device="cpu", dtype=torch.float32).numpy()
            if base.shapes[gguf_name] != (a.shape[1], b.shape[0]):
                raise GGUFLoraError(
                    f"{hf_name}: LoRA maps {a.shape[1]} -> {b.shape[0]} features but {gguf_name} in the base GGUF "
                    f"is {base.shapes[gguf_name][0]} -> {base.shapes[gguf_name][1]} (wrong base model?)"
                )
            layers.append((hf_name, gguf_name, a, b, float(module.scaling[ADAPTER_NAME])))
    if not layers:
        raise GGUFLoraError(f"the model has no LoRA adapter named {ADAPTER_NAME!r}")

    # One alpha for the file: llama.cpp scales each module by alpha / r (1 when alpha is 0).
    alpha = layers[0][4] * layers[0][2].shape[0]
    tensors = []
    for _hf_name, gguf_name, a, b, scaling in layers:
        applied = llama_scale(alpha, a.shape[0])
        if not np.isclose(applied, scaling, rtol=1e-6, atol=0.0):
            b = b * np.float32(scaling / applied)
        if PERMUTES_QK[base.arch] and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = base.head_count if gguf_name.endswith("attn_q.weight") else base.head_count_kv
            b = permute_rows(b, heads)
        tensors.append((gguf_name + ".lora_a", np.ascontiguousarray(a)))
        tensors.append((gguf_name + ".lora_b", np.ascontiguousarray(b, dtype=np.float32)))
    return tensors, float(alpha)


def permute_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: per head, rows [x0..x_{d/2}, y0..] become interleaved pairs."""
    if weights.shape[0] % (2 * n_head):
        raise GGUFLoraError(f"{weights.shape[0]} rows do not split into {n_head} heads of rotary pairs")
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def read_base_gguf(path: Path) -> BaseGGUF:
    """The header facts of a base GGUF (cached per file version: GGUFReader takes seconds)."""
    stat = path.stat()
    return _read_base_gguf(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_base_gguf(path: str, size: int, mtime_ns: int) -> BaseGGUF:
    import gguf

    reader = gguf.GGUFReader(path)

    def field(key: str):
        if key not in reader.fields:
            raise GGUFLoraError(f"{path}: the GGUF header has no {key}")
        return reader.fields[key].contents()

    arch = field("general.architecture")
    head_count = int(field(f"{arch}.attention.head_count"))
    kv_key = f"{arch}.attention.head_count_kv"
    return BaseGGUF(
        arch=arch,
        block_count=int(field(f"{arch}.block_count")),
        head_count=head_count,
        head_count_kv=int(field(kv_key)) if kv_key in reader.fields else head_count,
        shapes={tensor.name: tuple(int(n) for n in tensor.shape) for tensor in reader.tensors},
    )
