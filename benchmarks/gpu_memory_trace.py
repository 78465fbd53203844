"""What one generate call holds at its peak on a GPU, by the code that allocated it: CUDA's allocator history
(``torch.cuda.memory._record_memory_history``) replayed to the moment of the largest total, each live block
grouped by its allocating Python frames. For checking seal_lite/core/memory.py's terms where the model and
``scripts/gpu_check.sh``'s memory check disagree.

Each call runs on a layer-truncated random model of a real shape, loaded through seal-lite's policy loader
(Unsloth where ``--backend unsloth``), rows left-padded as in a rollout chunk; ``--repeat`` runs each call twice,
so a first call's one-off costs (Unsloth's compile) show apart from the steady ones.

    python benchmarks/gpu_memory_trace.py --backend unsloth --out OUT      # needs CUDA
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from seal_lite.core import memory  # noqa: E402

# (model, rows, width): the calls of gpu_check.sh's memory check whose peaks the model missed by most and least
CALLS = [("Qwen/Qwen2.5-3B-Instruct", 5, 16368), ("Qwen/Qwen2.5-3B-Instruct", 3, 8178),
         ("Qwen/Qwen2.5-7B-Instruct", 4, 16368)]


def live_at_peak(events: list[dict]) -> tuple[int, list[dict]]:
    """Replay an allocator trace: the largest total of blocks allocated during it and still live, and those
    blocks. A block counts from its ``alloc`` to its ``free_requested`` (what ``max_memory_allocated`` counts)."""
    live, total, peak, at_peak = {}, 0, 0, []
    for event in events:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif event["action"] == "free_requested" and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
    return peak, at_peak


def frame_key(frames: list[dict], depth: int = 3) -> str:
    """The innermost ``depth`` Python frames outside torch's own modules, as file:line(function)."""
    shown = [f for f in frames if "/torch/" not in f["filename"] or "/torch/nn/functional" in f["filename"]]
    cut = [f"{f['filename'].split('site-packages/')[-1].split('/tmp/site/')[-1]}:{f['line']}({f['name']})"
           for f in (shown or frames)[:depth]]
    return " < ".join(cut)


def by_frames(blocks: list[dict]) -> list[tuple[str, int, int]]:
    """(frames, bytes, blocks) for each allocating site, largest first."""
    size, count = Counter(), Counter()
    for block in blocks:
        key = frame_key(block.get("frames", []))
        size[key] += block["size"]
        count[key] += 1
    return [(key, size[key], count[key]) for key, _ in size.most_common()]


def trace_call(policy, rows: int, width: int, new: int) -> tuple[int, int, list[tuple[str, int, int]]]:
    """(allocator peak, replayed peak, live blocks by site) of one left-padded generate call."""
    import gpu_check
    import torch

    torch.cuda.memory._record_memory_history(max_entries=200_000, context="alloc", stacks="python")
    peak = gpu_check._generate_peak(policy, rows, width, new, cuda=True)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    replayed, blocks = live_at_peak(snapshot["device_traces"][torch.cuda.current_device()])
    return peak, replayed, by_frames(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="unsloth")
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeat", action="store_true", help="each call twice")
    args = parser.parse_args()

    import gpu_check
    import gpu_memory

    from seal_lite.engines.policy import load_policy

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    engine = "unsloth" if args.backend == "unsloth" else "transformers"
    loaded, policy = None, None
    for name, rows, width in CALLS:
        shape = dataclasses.replace(memory.KNOWN_SHAPES[name], layers=args.layers)
        if name != loaded:  # one model at a time on the card: CALLS lists each model's calls together
            del policy
            gpu_memory._empty_caches()
            model_dir = gpu_memory.random_model_dir(shape, str(work / name.replace("/", "-")))
            recipe = gpu_check.check_recipe(model_dir, args.backend, False, **{
                "rollout.max_context_tokens": 16384, "rollout.max_new_tokens": 16})
            loaded, policy = name, load_policy(model_dir, recipe)
        terms = memory.generate_bytes(shape, rows, width, 16, policy.dtype.itemsize, engine)
        modelled = memory.generate_peak(shape, rows, width, 16, policy.dtype.itemsize, engine)
        for attempt in range(2 if args.repeat else 1):
            peak, replayed, sites = trace_call(policy, rows, width, 16)
            record = {"model": name, "layers": shape.layers, "rows": rows, "width": width, "attempt": attempt,
                      "measured_gb": round(peak / memory.GIB, 3), "replayed_gb": round(replayed / memory.GIB, 3),
                      "model_gb": round(modelled / memory.GIB, 3),
                      "terms_gb": {k: round(v / memory.GIB, 3) for k, v in terms.items()},
                      "sites": [{"site": s, "gb": round(b / memory.GIB, 3), "blocks": n} for s, b, n in sites[:25]]}
            print(json.dumps(record), flush=True)
            with open(out / "memory_trace.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
