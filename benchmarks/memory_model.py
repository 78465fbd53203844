"""The memory model (seal_lite/core/memory.py) against measured peaks on this CPU, and its table for GPU cards.

    python benchmarks/memory_model.py --cpu-check          # measured vs modelled generate peaks
    python benchmarks/memory_model.py --table              # rollout token budgets of the GPU recipes' models

The CPU check builds randomly initialised 2-layer models of two real widths (Qwen2.5-0.5B's and SmolLM2-135M's),
and the first again with peft's LoRA on every projection (the model's "peft" engine, as the peft backends generate),
runs one left-padded transformers ``generate`` per rows x width, and reads the process's peak resident memory
above what it held before (Linux: /proc/self/clear_refs resets the peak). glibc is told to hand every large
block back to the system at once (MALLOC_MMAP_THRESHOLD_), so the resident size follows what torch allocates;
the script re-executes itself with that set. One JSON line per case: measured, modelled, their ratio.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from seal_lite.core.memory import GIB, KNOWN_SHAPES, Shape, generate_peak, rollout_token_budget

CPU_SHAPES = {  # real widths, 2 layers (the peak of one call does not grow with depth except through the KV cache)
    "qwen2.5-0.5b-width": Shape(2, 896, 4864, 14, 2, 64, 151936, True),
    "smollm2-135m-width": Shape(2, 576, 1536, 9, 3, 64, 49152, True),
    "narrow": Shape(2, 64, 128, 1, 1, 64, 1024, True),  # so narrow that the padded prefill's mask is nearly all
}
CPU_CASES = [(1, 1024), (4, 512), (2, 2048), (8, 1024), (4, 2048)]  # (rows, width)
NARROW_CASES = [(2, 2048), (2, 4096), (4, 4096)]
LORA_CASES = [(4, 512), (2, 2048), (4, 2048)]  # Qwen2.5-0.5B's widths through peft's LoRA, as the peft backends run
NEW_TOKENS = 4
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reexec_with_malloc_settings() -> None:
    """Run this script again with MALLOC set, unless it is: glibc reads it only when the process starts."""
    if any(os.environ.get(key) != value for key, value in MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC})


def measured_peak(call) -> int:
    """Peak resident bytes during ``call()`` above the resident bytes before it."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from the current size
    before = _status("VmRSS")
    call()
    return _status("VmHWM") - before


def cpu_check(dtype_name: str, cases=CPU_CASES) -> list[dict]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    dtype = getattr(torch, dtype_name)
    rows_out = []
    runs = [(name, shape, False, NARROW_CASES if name == "narrow" else cases) for name, shape in CPU_SHAPES.items()]
    runs.append(("qwen2.5-0.5b-width", CPU_SHAPES["qwen2.5-0.5b-width"], True, LORA_CASES))
    for name, shape, lora, shape_cases in runs:
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                             num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                             num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                             max_position_embeddings=32768, tie_word_embeddings=shape.tied_embeddings)
        model = Qwen2ForCausalLM(config).to(dtype).eval()
        if lora:  # as seal-lite's lora_config: every projection, the adapter in fp32 whatever the model's dtype
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")).eval()
        _generate(model, 1, 16)  # warm-up: the first call's one-off allocations are not the generate peak
        for rows, width in shape_cases:
            peak = measured_peak(functools.partial(_generate, model, rows, width))
            model_peak = generate_peak(shape, rows, width, NEW_TOKENS, dtype.itemsize, "peft" if lora else "transformers")
            rows_out.append({"shape": name + ("+lora" if lora else ""), "dtype": dtype_name, "rows": rows, "width": width,
                             "measured_mib": round(peak / 2**20, 1), "model_mib": round(model_peak / 2**20, 1),
                             "ratio": round(model_peak / peak, 3)})
            print(json.dumps(rows_out[-1]), flush=True)
        del model
    return rows_out


def _generate(model, rows: int, width: int) -> None:
    """One left-padded generate call: every row but the first is half padding, so the prefill needs its mask."""
    import torch

    ids = torch.randint(1, 1000, (rows, width))
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[1:, : width // 2] = 0
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                       do_sample=False, pad_token_id=0)


def table(cards_gb=(15, 24, 48, 80), contexts=(8192, 16384), new_tokens=512, lora_rank=16) -> list[dict]:
    """Rollout token budgets (and rows of the widest context) per card, model, engine and context."""
    out = []
    for model, shape in KNOWN_SHAPES.items():
        for engine in ("unsloth", "peft"):  # a run's rollouts on each GPU backend
            for context in contexts:
                for card in cards_gb:
                    dtype_bytes = 2
                    budget = rollout_token_budget(shape, card * GIB, context, new_tokens, dtype_bytes, engine,
                                                  quantized=True, lora_rank=lora_rank)
                    out.append({"model": model, "engine": engine, "context": context, "card_gb": card,
                                "token_budget": budget, "rows_at_full_context": budget // context})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-check", action="store_true", help="measure generate peaks on this CPU")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--table", action="store_true", help="print the GPU cards' token budgets")
    args = parser.parse_args()
    if args.cpu_check:
        reexec_with_malloc_settings()
        rows = cpu_check(args.dtype)
        ratios = [row["ratio"] for row in rows]
        print(f"model / measured: {min(ratios):.2f} to {max(ratios):.2f} over {len(rows)} cases ({args.dtype})")
    if args.table:
        for row in table():
            print(json.dumps(row))


if __name__ == "__main__":
    main()
