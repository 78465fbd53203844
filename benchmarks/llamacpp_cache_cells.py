"""What the cells other sequences hold in llama.cpp's shared KV cache cost a prompt's read and a batch's decode.

llama.cpp attends over every cell up to the highest one in use (``n_kv``), masking other sequences' cells; its CPU
flash-attention kernel reads each cell's mask entry for every query token, head and layer, and skips a masked cell
only after that. So reading a prompt, or decoding a batch, beside ``--filled`` cells of unrelated sequences costs
more than in an empty cache, although attention's result is the same. The context is made as seal-lite's engine
makes it (seal_lite/engines/llamacpp.py: one unified cache, flash attention, 512-token batches, 2 threads).
Printed, for each amount of filler: tokens/s of a ``--prompt-tokens`` read and of 8 rows decoded together, and the
ratios to the first.

    python benchmarks/llamacpp_cache_cells.py --filled 0 --filled 16384
"""

from __future__ import annotations

import argparse
import time

import numpy as np

BATCH = 512


def rates(path: str, filled: int, prompt_tokens: int) -> dict:
    import llama_cpp

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max, params.kv_unified = 65536, BATCH, BATCH, 16, True
    params.n_threads = params.n_threads_batch = 2
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
    lengths = [0] * 16

    def run(tokens: list[tuple[int, int]], every_logit: bool) -> None:  # (sequence, token), each appended to its own
        batch.n_tokens = len(tokens)
        for i, (seq, token) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = token, lengths[seq], 1, seq
            batch.logits[i] = every_logit or i == len(tokens) - 1
            lengths[seq] += 1
        assert llama_cpp.llama_decode(ctx, batch) == 0

    def read(seq: int, tokens: list[int]) -> None:
        for start in range(0, len(tokens), BATCH):
            run([(seq, token) for token in tokens[start : start + BATCH]], every_logit=False)

    draw = np.random.default_rng(0)  # ordinary tokens, no special ones; nothing shared between sequences
    tokens = lambda count: [int(t) for t in draw.integers(1000, 30000, count)]  # noqa: E731
    try:
        for seq in range(1, 5) if filled else ():
            read(seq, tokens(filled // 4))
        started = time.perf_counter()
        read(0, tokens(prompt_tokens))
        read_rate = prompt_tokens / (time.perf_counter() - started)
        rows = range(8, 16)
        for seq in rows:
            read(seq, tokens(64))
        started = time.perf_counter()
        for _ in range(32):  # one token of each row per decode, as the engine decodes
            run([(seq, int(draw.integers(1000, 30000))) for seq in rows], every_logit=True)
        decode_rate = 32 * len(rows) / (time.perf_counter() - started)
        return {"filled": filled // 4 * 4 if filled else 0, "read": read_rate, "decode_eight": decode_rate}
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--filled", type=int, action="append", help="cells of unrelated sequences (repeatable)")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    args = parser.parse_args()
    from seal_lite.engines.model_sources import gguf_path

    results = [rates(str(gguf_path(args.model)), filled, args.prompt_tokens) for filled in args.filled or [0, 16384]]
    for result in results:
        print(f"{result['filled']:>6} cells of other sequences: read {result['read']:6.1f} tokens/s "
              f"({result['read'] / results[0]['read']:.2f}x), 8 rows decoded together {result['decode_eight']:5.1f} "
              f"tokens/s ({result['decode_eight'] / results[0]['decode_eight']:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
