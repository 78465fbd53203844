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
* ``rows``: no engine, llama.cpp alone. One ``--prompt-tokens`` prompt copied to 8 streams; milliseconds per
  llama_decode of 1 to 8 rows' next tokens (what batching a decode is worth at each width).
* ``reading``: no engine, llama.cpp alone. One ``--prompt-tokens`` prompt read from position 0: tokens/s per 1,024
  positions, and one row's decode after it, with the engine's settings (f16 cells, flash attention), q8_0 or bf16
  cells, and flash attention off.
* ``step``: the engine now only. A cpu-learn step's rollouts (its first 2 tasks x G = 4, as
  ``llamacpp_batching.py --parts step`` plays them) for ``--seeds`` seeds, each llama_decode timed: seconds in batches
  that read new text (prompts, tool results) and in pure decode batches by their number of rows.

    python benchmarks/llamacpp_streams.py --part decode --prompt-tokens 4000
    python benchmarks/llamacpp_streams.py --part rows --prompt-tokens 800
    python benchmarks/llamacpp_streams.py --part reading --prompt-tokens 5120
    python benchmarks/llamacpp_streams.py --part step --seeds 3
    python benchmarks/llamacpp_streams.py --part screen --tasks 16 --repeats 2
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np
from llamacpp_batching import baseline_engine, step_setup  # benchmarks/, beside this script

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
CELL_TYPES = {"f16": 1, "q8_0": 8, "bf16": 30}  # ggml_type of the KV cells (llama_cpp names no bf16 constant)


class Probe:
    """llama.cpp alone: the model, one batch, and a prompt of ordinary tokens (no special ones)."""

    def __init__(self, model: str, prompt_tokens: int):
        import llama_cpp
        from llama_cpp._logger import set_verbose

        llama_cpp.llama_backend_init()
        set_verbose(False)  # llama.cpp's own log lines (a context's every setting) stay off the terminal
        self.weights = llama_cpp.llama_model_load_from_file(model.encode(), llama_cpp.llama_model_default_params())
        self.batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
        self.draw = np.random.default_rng(0)
        self.prompt = [int(t) for t in self.draw.integers(1000, 30000, prompt_tokens)]

    def context(self, unified: bool, sequences: int, cells: str = "f16", flash: bool = True):
        """A context as the engine opens it (f16 cells, flash attention), or with ``cells`` of another type."""
        import llama_cpp

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = sequences * (len(self.prompt) + BATCH)
        params.n_batch, params.n_ubatch, params.n_seq_max, params.kv_unified = BATCH, BATCH, sequences, unified
        params.n_threads = params.n_threads_batch = 2
        params.flash_attn_type = getattr(llama_cpp, f"LLAMA_FLASH_ATTN_TYPE_{'ENABLED' if flash else 'DISABLED'}")
        params.type_k = params.type_v = CELL_TYPES[cells]
        return llama_cpp.llama_init_from_model(self.weights, params)

    def run(self, ctx, tokens: list[tuple[int, int, int]], logits: bool) -> None:  # (sequence, position, token)
        import llama_cpp

        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (seq, pos, token) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = token, pos, 1, seq
            batch.logits[i] = logits
        assert llama_cpp.llama_decode(ctx, batch) == 0

    def read(self, ctx) -> None:
        """The prompt into sequence 0."""
        for start in range(0, len(self.prompt), BATCH):
            self.run(ctx, [(0, start + i, t) for i, t in enumerate(self.prompt[start : start + BATCH])], logits=False)

    def seconds_per_decode(self, ctx, rows: list[int], steps: int = 32) -> float:
        """Seconds per llama_decode of one new token for each of ``rows``, over ``steps`` decodes (then undone)."""
        import llama_cpp

        started, length = time.perf_counter(), len(self.prompt)
        for step in range(steps):
            self.run(ctx, [(seq, length + step, int(self.draw.integers(1000, 30000))) for seq in rows], logits=True)
        seconds = (time.perf_counter() - started) / steps
        for seq in rows:
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), seq, length, -1)
        return seconds

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_model_free(self.weights)


def decode_rates(model: str, prompt_tokens: int) -> dict:
    """Tokens/s of 8 rows decoded together in each cache layout, and of one row alone."""
    import llama_cpp

    probe, rates = Probe(model, prompt_tokens), {}

    def distinct_copies(ctx) -> None:  # the prompt's cells copied, not shared: 8 sequences of distinct cells
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        data = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, data, size, 0)
        for seq in range(1, 8):
            assert llama_cpp.llama_state_seq_set_data(ctx, data, written, seq) > 0

    try:
        for name in ("one row", "unified", "unified, cells shared", "streams"):
            ctx = probe.context(unified=name != "streams", sequences=1 if name == "one row" else 8)
            probe.read(ctx)
            if name == "unified":
                distinct_copies(ctx)
            elif name != "one row":
                for seq in range(1, 8):  # in a unified cache the cells are shared; between streams, copied
                    llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(ctx), 0, seq, -1, -1)
            rows = [0] if name == "one row" else list(range(8))
            rates[name] = len(rows) / probe.seconds_per_decode(ctx, rows)
            if name == "streams":
                rows = [0, 1, 2, 3, 5, 6, 7]
                rates["streams, two runs (one gap)"] = len(rows) / probe.seconds_per_decode(ctx, rows)
            llama_cpp.llama_free(ctx)
    finally:
        probe.close()
    return rates


def row_costs(model: str, prompt_tokens: int) -> dict[int, float]:
    """Milliseconds per llama_decode of 1 to 8 rows' next tokens, each row's stream holding the prompt."""
    import llama_cpp

    probe = Probe(model, prompt_tokens)
    try:
        ctx = probe.context(unified=False, sequences=8)
        probe.read(ctx)
        for seq in range(1, 8):
            llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(ctx), 0, seq, -1, -1)
        costs = {rows: 1000 * probe.seconds_per_decode(ctx, list(range(rows))) for rows in range(1, 9)}
        llama_cpp.llama_free(ctx)
    finally:
        probe.close()
    return costs


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


def reading_rates(model: str, prompt_tokens: int) -> dict[str, list[float]]:
    """Tokens/s of one prompt read from position 0, per 1,024 positions, then the ms of one row's decode after it:
    with the engine's settings (f16 cells, flash attention), other cell types, and flash attention off."""
    import llama_cpp

    probe, rates = Probe(model, prompt_tokens), {}
    try:
        for name, cells, flash in (("f16 (the engine)", "f16", True), ("q8_0 cells", "q8_0", True),
                                   ("bf16 cells", "bf16", True), ("flash attention off", "f16", False)):
            ctx = probe.context(unified=True, sequences=1, cells=cells, flash=flash)
            marks, started = [], time.perf_counter()
            for start in range(0, prompt_tokens, BATCH):
                chunk = probe.prompt[start : start + BATCH]
                probe.run(ctx, [(0, start + i, t) for i, t in enumerate(chunk)], logits=False)
                if (start + len(chunk)) % 1024 == 0:
                    marks.append(time.perf_counter() - started)
            per_kilo = [1024 / (b - a) for a, b in zip([0.0, *marks], marks)]
            rates[name] = [*per_kilo, 1000 * probe.seconds_per_decode(ctx, [0])]
            llama_cpp.llama_free(ctx)
    finally:
        probe.close()
    return rates


class TimedBatches(LlamaCppGenerator):
    """The engine, each llama_decode timed: (tokens, rows sampled, seconds) per batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[tuple[int, int, float]] = []

    def _run(self, tokens) -> None:
        started = time.perf_counter()
        super()._run(tokens)
        self.batches.append((len(tokens), sum(wants for _, _, wants in tokens), time.perf_counter() - started))


def step_anatomy(seeds: int, tokenizer) -> None:
    """Where a cpu-learn step's rollouts spend their time, per seed."""
    recipe, tasks, interface = step_setup()
    rollout = recipe.rollout
    engine = TimedBatches(str(gguf_path(recipe.policy.model)), tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2)
    for seed in range(seeds):
        engine.load_adapter(None)  # a new step: the last one's cells dropped
        engine.reseed(seed, 1)
        engine.batches.clear()
        started = time.perf_counter()
        groups = rollout_groups([(task, interface) for task in tasks], rollout.num_generations, engine, rollout)
        wall = time.perf_counter() - started
        reading = [batch for batch in engine.batches if batch[0] > batch[1]]
        by_rows: dict[int, list[float]] = {}
        for tokens, rows, seconds in engine.batches:
            if tokens == rows:
                by_rows.setdefault(rows, []).append(seconds)
        print(f"seed {seed}: {wall:.1f} s, of it in llama_decode {sum(b[2] for b in engine.batches):.1f} s; "
              f"{len(reading)} batches reading {sum(b[0] - b[1] for b in reading)} tokens of new text: "
              f"{sum(b[2] for b in reading):.1f} s; {sum(sum(t.env_mask) for g in groups for t in g)} tokens "
              f"generated", flush=True)
        for rows, times in sorted(by_rows.items()):
            print(f"  decode of {rows} rows: {len(times):3d} batches, {1000 * np.mean(times):5.1f} ms each, "
                  f"{sum(times):4.1f} s", flush=True)
        if widest := max(by_rows, default=0):  # what the step would take if every row decoded at the widest rate
            per_row = np.mean(by_rows[widest]) / widest
            decoding = sum(sum(times) for times in by_rows.values())
            ideal = per_row * sum(rows * len(times) for rows, times in by_rows.items())
            print(f"  every decode at the {widest}-row rate: {ideal:.1f} s instead of {decoding:.1f} s, the step "
                  f"{wall - decoding + ideal:.1f} s", flush=True)
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("decode", "rows", "reading", "step", "eval", "screen"), default="screen")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="decode, rows, reading: the prompt's length")
    parser.add_argument("--seeds", type=int, default=3, help="step: the seeds played")
    parser.add_argument("--gguf", help="decode, rows, reading: another GGUF than the policy's (e.g. a requantized "
                        "copy, benchmarks/gguf_types.py's requantized)")
    parser.add_argument("--repeats", type=int, default=1, help="each variant this many times, alternating")
    parser.add_argument("--unified", default="6dfcc00", help="the commit whose engine is the unified one")
    args = parser.parse_args()
    model = args.gguf or str(gguf_path("qwen2.5-coder-0.5b"))
    if args.part == "decode":
        rates = decode_rates(model, args.prompt_tokens)
        for name, value in rates.items():
            print(f"{name:>28}: {value:5.1f} tokens/s ({value / rates['unified']:.2f}x unified)", flush=True)
        return
    if args.part == "reading":
        for name, values in reading_rates(model, args.prompt_tokens).items():
            print(f"{name:>20}: tokens/s per 1,024 positions " + ", ".join(f"{v:.0f}" for v in values[:-1]) +
                  f"; then one row's decode {values[-1]:.1f} ms", flush=True)
        return
    if args.part == "rows":
        costs = row_costs(model, args.prompt_tokens)
        for rows, ms in costs.items():
            print(f"{rows} rows: {ms:5.1f} ms a decode, {ms / rows:4.1f} ms a row ({rows * costs[1] / ms:.2f}x "
                  f"one row at a time)", flush=True)
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b"))
    if args.part == "step":
        step_anatomy(args.seeds, tokenizer)
        return
    variants = {"unified": baseline_engine(args.unified), "streams": LlamaCppGenerator}
    for _ in range(args.repeats):
        for name, engine_class in variants.items():
            print(play(name, engine_class, args.part, args.tasks, tokenizer), flush=True)


if __name__ == "__main__":
    main()
