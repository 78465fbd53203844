"""``seal-lite export``: a run's trained LoRA in the forms other tools serve (docs/export.md).

* ``merged``: a Hugging Face model directory, the base model with the LoRA folded in (peft's ``merge_and_unload``),
  in the base checkpoint's own precision (fp32 for a model de-quantized from a pip GGUF), with its tokenizer and
  chat template. transformers and vLLM load it.
* ``lora-gguf``: the LoRA as a llama.cpp adapter GGUF, the very file the CPU rollouts load after every update
  (seal_lite/engines/gguf_lora.py), for the run's base GGUF: ``llama-server -m BASE.gguf --lora lora.gguf``.
* ``gguf``: one GGUF with the LoRA merged in, which llama.cpp runs without an adapter.

Why the merged GGUF is the base GGUF with its LoRA'd matrices replaced, and not a conversion of the merged
directory: llama.cpp's converter (convert_hf_to_gguf.py, with its tables of architectures and tokenizer hashes) is
in no pip package. llama-cpp-python ships the compiled library and its bindings, and the ``gguf`` package the file
format, so seal-lite cannot run the converter offline. It needs none: LoRA changes only the linear matrices of the
decoder blocks, so everything else (tokenizer, chat template, embeddings, norms, their quantization) is the base
GGUF's, copied byte for byte. That is exactly what the policy trained on, since its safetensors base was
de-quantized from that file (seal_lite/engines/model_sources.py), and what its llama.cpp rollouts ran. A policy
from a hub id or a model directory has no GGUF: convert it once with llama.cpp's converter and pass it as
``base_gguf``. Both GGUF kinds need that file (a LoRA GGUF only fits the base it was written for).

The output type, which the user chooses with ``gguf_type`` (``--gguf-type``): the replaced matrices are f16 by
default (what llama.cpp's converter writes), f32 (the merge to the bit, twice the size), bf16, or q8_0 (about half
of f16). The other tensors keep the base file's types: the pip SmolLM2 is Q4_1, Qwen2.5-Coder-0.5B mostly Q5_0. For
a smaller file, run llama.cpp's ``llama-quantize`` on the result.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.errors import ConfigError, RunError
from seal_lite.core.recipe import Recipe, load_recipe
from seal_lite.engines.store import Store

KINDS = ("merged", "gguf", "lora-gguf")
DEFAULT_GGUF_TYPE = "f16"


@dataclass(frozen=True)
class Export:
    """What ``export_run`` wrote, and from what."""

    kind: str
    path: Path
    adapter: Path  # the run's LoRA it came from: RUN/adapter or a step's checkpoint
    base_model: str  # the recipe's policy.model
    base_gguf: Path | None  # the GGUF it was made for (the two GGUF kinds)

    def serve_command(self) -> str:
        """One command that serves it over an OpenAI-compatible API (docs/export.md has the others)."""
        if self.kind == "merged":
            return f"vllm serve {shlex.quote(str(self.path))}"
        if self.kind == "gguf":
            return f"python -m llama_cpp.server --model {shlex.quote(str(self.path))}"
        return (f"python -m llama_cpp.server --model {shlex.quote(str(self.base_gguf))} "
                f"--lora_path {shlex.quote(str(self.path))}")


def export_run(run_dir: Path, kind: str, output: Path | None = None, *, step: int | None = None, best: bool = False,
               base_gguf: Path | None = None, gguf_type: str | None = None, overwrite: bool = False) -> Export:
    """Write the run's newest trained LoRA (``step``: that step's checkpoint; ``best``: the best validation
    checkpoint) as ``kind``, to ``output`` (default under RUN/export/). Every problem with the request is raised before
    a model loads."""
    if kind not in KINDS:
        raise ConfigError(f"--to {kind!r}: use one of {', '.join(KINDS)}")
    if best and step is not None:
        raise ConfigError("--best and --step name two adapters; export one of them")
    if gguf_type is not None and kind != "gguf":
        raise ConfigError(f"--gguf-type is the type of a merged GGUF's matrices; --to {kind} has none")
    if base_gguf is not None and kind == "merged":
        raise ConfigError("--base-gguf is for the GGUF kinds; --to merged starts from the run's policy.model")
    gguf_type = gguf_type or DEFAULT_GGUF_TYPE
    store = Store.open_readonly(Path(run_dir) / "seal.db")
    recipe = _run_recipe(store, run_dir)
    adapter = _adapter(store, Path(run_dir), step, recipe.validation.metric if best else None)
    out = Path(output) if output else default_out(Path(run_dir), kind, "best" if best else step, gguf_type)
    _check_out(out, kind, overwrite)
    if kind != "merged":
        base_gguf = Path(base_gguf) if base_gguf else policy_gguf(recipe)

    from seal_lite.engines.gguf_lora import export_lora_gguf, export_merged_gguf
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_adapted, save_merged

    model, tokenizer = load_adapted(resolve_model(recipe.policy.model), adapter)
    if kind == "merged":
        _write_directory(out, lambda partial: save_merged(model, tokenizer, partial))
    elif kind == "gguf":
        export_merged_gguf(model, base_gguf, out, gguf_type)
    else:
        export_lora_gguf(model, base_gguf, out)
    return Export(kind, out, adapter, recipe.policy.model, base_gguf)


def default_out(run_dir: Path, kind: str, step: int | str | None, gguf_type: str) -> Path:
    """RUN/export/merged, RUN/export/merged-<type>.gguf or RUN/export/lora.gguf (under step-N/ for a checkpoint,
    best/ for the best validation checkpoint)."""
    name = {"merged": "merged", "gguf": f"merged-{gguf_type}.gguf", "lora-gguf": "lora.gguf"}[kind]
    folder = "best" if step == "best" else f"step-{step}" if step is not None else ""
    return run_dir / "export" / folder / name


def policy_gguf(recipe: Recipe) -> Path:
    """The run's policy as a GGUF file: a registry model's pip GGUF, or the .gguf path it was given."""
    from seal_lite.engines.model_sources import REGISTRY, resolve_gguf

    model = recipe.policy.model
    if model not in REGISTRY and not model.endswith(".gguf"):
        raise ConfigError(f"the run's policy.model {model!r} is no GGUF: pass --base-gguf FILE, the same model "
                          "converted with llama.cpp's convert_hf_to_gguf.py (or export --to merged)")
    return Path(resolve_gguf(model, "the run's policy.model"))


def _run_recipe(store: Store, run_dir: Path) -> Recipe:
    try:
        return load_recipe(None, json.loads(store.run()["recipe"]))
    except LookupError:
        raise RunError(f"{run_dir} holds no run yet; export after its first step") from None


def _adapter(store: Store, run_dir: Path, step: int | None, best_by: str | None = None) -> Path:
    """The LoRA directory to export: the run's newest adapter, the checkpoint of ``step``, or with ``best_by`` (the
    recipe's validation.metric) the best validation checkpoint."""
    from seal_lite.runs.evaluate_bfcl import best_adapter, trained_adapters

    if best_by:
        return best_adapter(store, run_dir, best_by)[1]
    [(_, adapter)] = trained_adapters(store, run_dir, () if step is None else (step,))
    if not (adapter / "adapter_config.json").is_file():
        raise RunError(f"{adapter} holds no saved LoRA (adapter_config.json); was it moved or pruned?")
    return adapter


def _check_out(out: Path, kind: str, overwrite: bool) -> None:
    writes = "directory" if kind == "merged" else "file"
    if out.exists() and not overwrite:
        raise RunError(f"{out} already exists; choose another --output or pass --overwrite")
    if out.exists() and out.is_dir() != (writes == "directory"):
        raise RunError(f"{out} is a {'directory' if out.is_dir() else 'file'}, and --to {kind} writes a {writes}; "
                       "choose another --output")


def _write_directory(out: Path, write) -> None:
    """``write(partial)`` into a directory beside ``out``, which then takes its place: an export that fails
    leaves nothing, and --overwrite replaces the old one only once the new one is complete."""
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
