"""Two llama.cpp builds on this CPU, same model, same run: how fast each reads a prompt and decodes one row and eight
rows together (seal_lite/engines/llama_build.py says which builds scripts/setup.sh compiles, and why).

Each build is a folder holding llama-cpp-python (``pip install --no-deps --target DIR WHEEL``; the wheels setup.sh
compiled are in .venv/llama-cpp-wheels/); ``this`` is the one installed in this environment. Every measurement runs
in its own process (llama.cpp is loaded once per process), the builds alternating ``--repeats`` times. Printed:
tokens/s of a ``--prompt-tokens`` prefill, of one row's greedy decode, and of 8 rows decoded together by seal-lite's
engine (LlamaCppGenerator, greedy), then each build's ratios to the first, and whether their greedy tokens agree.

    python benchmarks/llama_builds.py --build generic=/tmp/generic --build this
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def measure(model: str, prompt_tokens: int) -> dict:
    """This process's llama_cpp: prefill, one row's decode, eight rows' decode (tokens/s) and the greedy tokens."""
    import llama_cpp
    from gguf_types import speeds
    from transformers import AutoTokenizer

    from seal_lite.engines.llamacpp import LlamaCppGenerator
    from seal_lite.engines.model_sources import gguf_path, resolve_model

    path = gguf_path(model)
    prefill, decode_one = speeds(path, prompt_tokens, 32, threads=2)  # the script's folder is on sys.path
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model), clean_up_tokenization_spaces=False)
    engine = LlamaCppGenerator(str(path), tokenizer, n_ctx=4096, n_threads=2)
    rows = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Write a Python function number {i} that sorts a list of {i} items. " * 3}],
        add_generation_prompt=True, tokenize=False)) for i in range(8)]
    engine.generate(rows[:1], 4, 0.0)  # the context is made and warm
    started = time.perf_counter()
    out = engine.generate(rows, 48, 0.0)
    decode_eight = sum(map(len, out)) / (time.perf_counter() - started)
    engine.close()
    return {"system": llama_cpp.llama_print_system_info().decode().strip(), "prefill": prefill,
            "decode_one": decode_one, "decode_eight": decode_eight, "tokens": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="append", default=[],
                        help="NAME=DIR, a folder holding llama_cpp; or 'this', the one installed here")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.model, args.prompt_tokens)))
        return
    if not args.build:
        parser.error("name at least one build: --build NAME=DIR or --build this")
    builds = dict(spec.split("=", 1) if "=" in spec else (spec, "") for spec in args.build)
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for _ in range(args.repeats):
        for name, folder in builds.items():
            paths = filter(None, [folder, os.environ.get("PYTHONPATH")])  # "this": the environment's own
            child = subprocess.run([sys.executable, __file__, "--measure", "--model", args.model, "--prompt-tokens",
                                    str(args.prompt_tokens)], capture_output=True, text=True, check=True,
                                   env=os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, paths))})
            runs[name].append(json.loads(child.stdout.splitlines()[-1]))
    first = next(iter(runs.values()))
    for name, measured in runs.items():
        print(f"{name}: {measured[0]['system']}")
        for key in ("prefill", "decode_one", "decode_eight"):
            values = [m[key] for m in measured]
            ratios = [m[key] / f[key] for m, f in zip(measured, first)]
            print(f"  {key:<13} {', '.join(f'{v:.1f}' for v in values)} tokens/s  "
                  f"(x{', x'.join(f'{r:.2f}' for r in ratios)} the first build)")
        print(f"  greedy tokens equal to the first build's: {measured[0]['tokens'] == first[0]['tokens']}")


if __name__ == "__main__":
    main()
