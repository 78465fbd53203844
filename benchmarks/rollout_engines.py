"""Chunked ``generate`` against transformers' continuous batching (``rollout.backend: paged``): the same episodes,
the same policy, one run; the ratio of their generation seconds, of the tokens each read, and their memory peaks.

Both engines play the same tasks x G multi-turn episodes greedily, so the episodes are token for token the same
and only the engines differ (a near-tie may flip a token: the episodes' token counts are printed). ``generate``
plays them as a training step does without a continuous engine: one round of messages at a time, in calls cut by
``rollout.generation_batch_size`` and ``generation_token_budget``; the paged engine plays each episode on as soon
as its message is applied. Tokens read = tokens through the model's embeddings (a padded call's padding included).

    python benchmarks/rollout_engines.py                       # CPU: SmolLM2-135M, the smoke recipe's budgets
    python benchmarks/rollout_engines.py --json out.json       # also write the figures (scripts/gpu_e2e.py does)

On a GPU scripts/gpu_e2e.py runs ``compare`` on a 4-bit + LoRA policy at a real width (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from seal_lite.core import timing
from seal_lite.core.interface import TrainingInterface
from seal_lite.engines.paged_rollouts import PagedGenerator
from seal_lite.engines.transformers_generate import TransformersGenerator
from seal_lite.step.rollout import rollout_groups

SMOKE = Path(__file__).resolve().parent.parent / "recipes" / "smoke.yaml"


def play(generator, model, tasks, rollout, group_size: int) -> dict:
    """Seconds, tokens generated and tokens read for the tasks x ``group_size`` episodes, and the memory peak."""
    import torch

    reads = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: reads.append(args[0].numel()))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    timing.take()
    started = time.perf_counter()
    try:
        groups = rollout_groups([(task, TrainingInterface(True, True, ())) for task in tasks], group_size, generator,
                                rollout)
    finally:
        hook.remove()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    phases = timing.take()
    return {"seconds": seconds, "generate_s": phases.get("generate", seconds),
            "generated": sum(sum(t.env_mask) for group in groups for t in group),
            "episode_tokens": sum(len(t.completion_ids) for group in groups for t in group),
            "read": sum(reads), "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "episodes": [[t.completion_ids for t in group] for group in groups]}


def compare(model, tokenizer, tasks, rollout, group_size: int, cache_tokens: int) -> dict:
    """Both engines on the same episodes (greedy), generate first; the figures of each and their ratios."""
    greedy = rollout.model_copy(update={"temperature": 0.0})
    engines = {"generate": TransformersGenerator(model, tokenizer),
               "paged": PagedGenerator(model, tokenizer, cache_tokens=cache_tokens)}
    figures = {name: play(generator, model, tasks, greedy, group_size) for name, generator in engines.items()}
    pairs = list(zip(sum(figures["generate"].pop("episodes"), []), sum(figures["paged"].pop("episodes"), []),
                     strict=True))
    return {**figures, "same_episodes": all(a == b for a, b in pairs),
            "episodes_equal": f"{sum(a == b for a, b in pairs)} of {len(pairs)}",
            "speedup": figures["generate"]["generate_s"] / figures["paged"]["generate_s"],
            "read_ratio": figures["generate"]["read"] / figures["paged"]["read"]}


def print_comparison(result: dict) -> None:
    print(f"{'engine':10s} {'generate s':>11s} {'generated':>10s} {'tokens read':>12s} {'peak GB':>8s}")
    for name in ("generate", "paged"):
        row = result[name]
        peak = f"{row['peak_gb']:8.2f}" if row["peak_gb"] is not None else f"{'-':>8s}"
        print(f"{name:10s} {row['generate_s']:11.1f} {row['generated']:10d} {row['read']:12d} {peak}")
    print(f"\npaged / generate: {result['speedup']:.2f}x faster, reads {result['read_ratio']:.2f}x fewer tokens; "
          f"episodes token for token equal: {result['episodes_equal']} (a near-tie may flip a greedy token)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    import torch
    from peft import get_peft_model

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.runs.tasks import select_task_ids

    recipe = load_recipe(SMOKE, {"policy.model": args.model, "data.num_tasks": args.tasks,
                                "grpo.tasks_per_step": args.tasks})
    tasks = [task.truncated(recipe.rollout.max_turns) for task in load_tasks(select_task_ids(recipe))]
    policy = load_policy(resolve_model(args.model), recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    rollout = recipe.rollout
    print(f"{args.model} ({policy.dtype}), {len(tasks)} tasks x G={rollout.num_generations}, {rollout.max_turns} "
          f"turns, {rollout.max_new_tokens} tokens a message, {torch.get_num_threads()} threads\n")
    result = compare(model, policy.tokenizer, tasks, rollout, rollout.num_generations,
                     cache_tokens=4 * rollout.max_context_tokens)
    print_comparison(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
