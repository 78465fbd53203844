"""Is another GGUF weight type a faster rollout engine on a CPU? Prefill and decode speed of the policy's GGUF
(Qwen2.5-Coder-0.5B, Q4_K_M as shipped) against copies requantized by llama.cpp, same machine, same run.

Each type is read by llama-cpp-python with the threads of a rollout, then times one prefill of ``--prompt-tokens``
tokens and ``--decode-tokens`` greedy decode steps. Prints tokens/s and the ratio to the shipped type. A
requantized type also moves the rollout policy away from the model torch trains (F16 only by fp16 rounding),
which widens the log-prob gap the update filters on.

    python benchmarks/gguf_types.py
    python benchmarks/gguf_types.py --keep /tmp/gguf-types   # then: llamacpp_streams.py --part rows --gguf /tmp/gguf-types/Q4_0.gguf
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import time
from pathlib import Path

import llama_cpp

from seal_lite.engines.model_sources import gguf_path

TYPES = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
         "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}


def requantized(source: Path, ftype: int, target: Path) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not write {target}")
    return target


def speeds(path: Path, prompt_tokens: int, decode_tokens: int, threads: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one read of ``path``."""
    llm = llama_cpp.Llama(str(path), n_ctx=prompt_tokens + decode_tokens + 64, n_threads=threads, n_batch=512,
                          verbose=False)
    tokens = llm.tokenize(("def f(x):\n    return x * 2\n" * prompt_tokens).encode())[:prompt_tokens]
    started = time.perf_counter()
    llm.eval(tokens)
    prefill = prompt_tokens / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(decode_tokens):
        llm.eval([llm.sample(temp=0.0)])
    return prefill, decode_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="a folder to keep the requantized copies in (TYPE.gguf), e.g. for "
                        "llamacpp_streams.py --gguf")
    args = parser.parse_args()
    shipped = gguf_path(args.model)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        Path(folder).mkdir(parents=True, exist_ok=True)
        paths = {"Q4_K_M (shipped)": shipped}
        paths |= {name: requantized(shipped, ftype, Path(folder) / f"{name}.gguf") for name, ftype in TYPES.items()}
        figures = {name: speeds(path, args.prompt_tokens, args.decode_tokens, args.threads)
                   for name, path in paths.items()}
    base_prefill, base_decode = figures["Q4_K_M (shipped)"]
    print(f"| type | prefill tokens/s ({args.prompt_tokens}) | x shipped | decode tokens/s | x shipped |")
    print("|---|---|---|---|---|")
    for name, (prefill, decode) in figures.items():
        print(f"| {name} | {prefill:.0f} | {prefill / base_prefill:.2f} | {decode:.1f} | {decode / base_decode:.2f} |")


if __name__ == "__main__":
    main()
