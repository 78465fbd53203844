"""An evaluation or a screen played by the llama.cpp engine in fixed batches against one call that keeps
``generation_batch_size`` episodes live and starts the next when one ends (what seal-lite does since the refill).

``eval``: the first ``--tasks`` held-out tasks under BFCL's view, greedy, the smoke recipe's budgets with
Qwen2.5-Coder-0.5B, batches of 8 tasks. ``screen``: the first ``--tasks`` base training tasks x 4 samples under
cpu-learn's rollouts, batches of 2 tasks (8 sequences). Both variants play the same tasks in the same order
(``by_shared_prefix``) with the same engine settings; printed for each: wall seconds, the engine's prefill and decode
seconds, tokens read into the cache (of them, read in the side context), tokens generated and tasks solved. Sampled
plays (the screen) draw other streams in the variants, so their generated tokens differ. ``refill-shared`` is
``refill`` with every token read in the shared cache (no side context, as before it was added).

    python benchmarks/llamacpp_refill.py --part eval --tasks 16
    python benchmarks/llamacpp_refill.py --part screen --tasks 16 --repeats 2
    python benchmarks/llamacpp_refill.py --part eval --variants refill-shared,refill --repeats 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from seal_lite.core import timing
from seal_lite.core.interface import TrainingInterface, evaluation_interface
from seal_lite.core.recipe import load_recipe
from seal_lite.engines import llamacpp
from seal_lite.engines.llamacpp import LlamaCppGenerator
from seal_lite.engines.model_sources import gguf_path, resolve_model
from seal_lite.envs.bfcl import load_tasks, split_ids
from seal_lite.runs.evaluate_bfcl import evaluation_rollout
from seal_lite.step.rollout import by_shared_prefix, rollout_groups
from seal_lite.step.verifier import diagnose_episode

ROOT = Path(__file__).resolve().parent.parent
SIDE_READ = llamacpp.SIDE_READ


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


def play(variant: str, part: str, count: int, tokenizer) -> dict:
    recipe, rollout, tasks, interface, samples = setup(part, count)
    engine = LlamaCppGenerator(str(gguf_path(recipe.policy.model)), tokenizer, n_ctx=rollout.max_context_tokens,
                               n_threads=2)
    engine.reseed(recipe.seed, 0)
    per_batch = rollout.generation_batch_size // samples
    batches = [tasks[s : s + per_batch] for s in range(0, len(tasks), per_batch)] if variant == "batches" else [tasks]
    llamacpp.SIDE_READ = 10**9 if variant == "refill-shared" else SIDE_READ
    timing.take()
    started = time.perf_counter()
    groups = [group for batch in batches
              for group in rollout_groups([(task, interface) for task in batch], samples, engine, rollout)]
    wall = time.perf_counter() - started
    phases = timing.take()
    engine.close()
    return {"variant": variant, "wall_s": round(wall, 1), "prefill_s": round(phases.get("prefill", 0.0), 1),
            "decode_s": round(phases.get("decode", 0.0), 1), "read": engine.read_tokens,
            "read_aside": engine.read_aside,
            "generated": sum(len(t.completion_ids) for group in groups for t in group),
            "solved": sum(diagnose_episode(task, t.turns).valid for task, group in zip(tasks, groups) for t in group)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("eval", "screen"), default="eval")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="each variant this many times, alternating")
    parser.add_argument("--variants", default="batches,refill", help="of batches, refill, refill-shared")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b"))
    for _ in range(args.repeats):
        for variant in args.variants.split(","):
            print(play(variant, args.part, args.tasks, tokenizer), flush=True)


if __name__ == "__main__":
    main()
