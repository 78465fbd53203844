"""The llama.cpp engine with a KV stream per sequence against the same engine with one shared (unified) cache,
same build, same run.

``unified`` is ``seal_lite/engines/llamacpp.py`` as it was at ``--unified`` (git; 6dfcc00, the last engine with one
shared cache and a side context for long reads), ``streams`` the engine now. Parts:

* ``decode``: no engine, llama.cpp alone. One ``--prompt-tokens`` prompt read, copied to 8 sequences as distinct
  cells, and 32 tokens of each decoded together: in a unified cache (each row's attention also scans the others'
  cells), in a unified cache where the 8 share the prompt's cells, in 8 streams, and in streams with a gap (two
  runs of consecutive streams). Printed: tokens/s of each, and of one sequence alone.
* ``eval``: the first ``--tasks`` held-out tasks under BFCL's view, greedy, the smoke recipe's budgets with
  Qwen2.5-Coder-0.5B, 8 live. ``screen``: the first ``--tasks`` base training tasks x 4 samples under cpu-learn's
  rollouts, 8 live. Printed for each variant: wall seconds, tokens read, tokens generated, tasks solved, and the
  llama_decode calls and the runs of consecutive streams in them (llama.cpp computes each run on its own).

    python benchmarks/llamacpp_streams.py --part decode --prompt-tokens 4000
    python benchmarks/llamacpp_streams.py --part screen --tasks 16 --repeats 2
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np
from llamacpp_batching import baseline_engine  # benchmarks/, beside this script

from seal_lite.core.interface import TrainingInterface, evaluation_interface
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.llamacpp import LlamaCppGenerator
from seal_lite.engines.model_sources import gguf_path, resolve_model
from seal_lite.envs.bfcl import load_tasks, split_ids
from seal_lite.runs.evaluate_bfcl import evaluation_rollout
from seal_lite.step.rollout import by_shared_prefix, rollout_groups
from seal_lite.step.verifier import diagnose_episode

ROOT = Path(__file__).resolve().parent.parent
BATCH = 512


def decode_rates(model: str, prompt_tokens: int) -> dict:
    import llama_cpp
    from llama_cpp._logger import set_verbose

    llama_cpp.llama_backend_init()
    set_verbose(False)  # llama.cpp's own log lines (a context's every setting) stay off the terminal
    weights = llama_cpp.llama_model_load_from_file(model.encode(), llama_cpp.llama_model_default_params())
    batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
    draw = np.random.default_rng(0)  # ordinary tokens, no special ones
    prompt = [int(t) for t in draw.integers(1000, 30000, prompt_tokens)]

    def context(unified: bool, sequences: int):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = sequences * (prompt_tokens + BATCH)
        params.n_batch, params.n_ubatch, params.n_seq_max, params.kv_unified = BATCH, BATCH, sequences, unified
        params.n_threads = params.n_threads_batch = 2
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        return llama_cpp.llama_init_from_model(weights, params)

    def run(ctx, tokens: list[tuple[int, int, int]], logits: bool) -> None:  # (sequence, position, token)
        batch.n_tokens = len(tokens)
        for i, (seq, pos, token) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = token, pos, 1, seq
            batch.logits[i] = logits
        assert llama_cpp.llama_decode(ctx, batch) == 0

    def read(ctx) -> None:
        for start in range(0, prompt_tokens, BATCH):
            run(ctx, [(0, start + i, t) for i, t in enumerate(prompt[start : start + BATCH])], logits=False)

    def rate(ctx, rows: list[int]) -> float:
        started = time.perf_counter()
        for step in range(32):
            run(ctx, [(seq, prompt_tokens + step, int(draw.integers(1000, 30000))) for seq in rows], logits=True)
        tokens_per_s = 32 * len(rows) / (time.perf_counter() - started)
        memory = llama_cpp.llama_get_memory(ctx)
        for seq in rows:
            llama_cpp.llama_memory_seq_rm(memory, seq, prompt_tokens, -1)
        return tokens_per_s

    def distinct_copies(ctx) -> None:  # the prompt's cells copied, not shared: 8 sequences of distinct cells
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        data = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, data, size, 0)
        for seq in range(1, 8):
            assert llama_cpp.llama_state_seq_set_data(ctx, data, written, seq) > 0

    rates = {}
    try:
        for name in ("one row", "unified", "unified, cells shared", "streams"):
            ctx = context(unified=name != "streams", sequences=1 if name == "one row" else 8)
            read(ctx)
            memory = llama_cpp.llama_get_memory(ctx)
            if name == "unified":
                distinct_copies(ctx)
            elif name != "one row":
                for seq in range(1, 8):  # in a unified cache the cells are shared; between streams, copied
                    llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
            rates[name] = rate(ctx, [0] if name == "one row" else list(range(8)))
            if name == "streams":
                rates["streams, two runs (one gap)"] = rate(ctx, [0, 1, 2, 3, 5, 6, 7])
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_model_free(weights)
    return rates


def setup(part: str, count: int):
    """(recipe, rollout, ordered tasks, interface, samples per task) of the part."""
    if part == "eval":
        recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"policy.model": "qwen2.5-coder-0.5b"})
        rollout = evaluation_rollout(recipe.rollout)
        ids, interface, samples = split_ids("eval")[:count], evaluation_interface("official"), 1
    else:
        recipe = load_recipe(ROOT / "recipes" / "cpu-learn.yaml", {"data.screen": 4})
        rollout = recipe.rollout
        ids = [task_id for task_id in split_ids("train") if task_id.startswith("multi_turn_base_")][:count]
        config = recipe.interface
        interface, samples = TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format), 4
    rollout = rollout.model_copy(update={"generation_batch_size": recipe.generation_batch()})
    tasks = by_shared_prefix([task.truncated(recipe.rollout.max_turns) for task in load_tasks(ids)])
    return recipe, rollout, tasks, interface, samples


def play(variant: str, engine_class, part: str, count: int, tokenizer) -> dict:
    recipe, rollout, tasks, interface, samples = setup(part, count)
    engine = engine_class(str(gguf_path(recipe.policy.model)), tokenizer, n_ctx=rollout.max_context_tokens,
                          n_threads=2)
    engine.reseed(recipe.seed, 0)
    started = time.perf_counter()
    groups = rollout_groups([(task, interface) for task in tasks], samples, engine, rollout)
    wall = time.perf_counter() - started
    engine.close()
    return {"variant": variant, "wall_s": round(wall, 1), "read": engine.read_tokens,
            "generated": sum(len(t.completion_ids) for group in groups for t in group),
            "solved": sum(diagnose_episode(task, t.turns).valid for task, group in zip(tasks, groups) for t in group),
            "decodes": getattr(engine, "decodes", None), "computations": getattr(engine, "computations", None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("decode", "eval", "screen"), default="screen")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="decode: the prompt each row holds")
    parser.add_argument("--repeats", type=int, default=1, help="each variant this many times, alternating")
    parser.add_argument("--unified", default="6dfcc00", help="the commit whose engine is the unified one")
    args = parser.parse_args()
    if args.part == "decode":
        rates = decode_rates(str(gguf_path("qwen2.5-coder-0.5b")), args.prompt_tokens)
        for name, value in rates.items():
            print(f"{name:>28}: {value:5.1f} tokens/s ({value / rates['unified']:.2f}x unified)", flush=True)
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b"))
    variants = {"unified": baseline_engine(args.unified), "streams": LlamaCppGenerator}
    for _ in range(args.repeats):
        for name, engine_class in variants.items():
            print(play(name, engine_class, args.part, args.tasks, tokenizer), flush=True)


if __name__ == "__main__":
    main()
