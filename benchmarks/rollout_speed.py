"""Rollout tokens/s: seal-lite's llama.cpp backend versus plain transformers ``generate``, same prompts, one run.

Both engines play the same multi-turn rollouts (the quickstart's tasks, G trajectories each, the quickstart's
budgets and training interface) with the same policy: SmolLM2-135M (its pip GGUF for llama.cpp, the model
converted from that GGUF, bf16, with a fresh LoRA, for transformers). Tokens/s = tokens the policy generated /
seconds spent generating (prefill + decode), so different sampled lengths do not bias the ratio.

    python benchmarks/rollout_speed.py [--model smollm2-135m] [--tasks 4] [--repeats 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from seal_lite.core import timing
from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.llamacpp import LlamaCppGenerator
from seal_lite.engines.model_sources import gguf_path, resolve_model
from seal_lite.engines.policy import load_policy
from seal_lite.engines.transformers_generate import TransformersGenerator
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.tasks import select_task_ids
from seal_lite.step.rollout import rollout_group

SMOKE = Path(__file__).resolve().parent.parent / "recipes" / "smoke.yaml"  # SmolLM2's budgets, as measured


def play(generator, tasks, recipe) -> dict[str, float]:
    interface = TrainingInterface(True, True, (), recipe.interface.tool_format)
    timing.take()
    started = time.perf_counter()
    tokens = 0
    for task in tasks:
        for trajectory in rollout_group(task, recipe.rollout.num_generations, generator, recipe.rollout, interface):
            tokens += sum(trajectory.env_mask)
    phases = timing.take()
    return {"tokens": tokens, "generate_s": phases["generate"], "prefill_s": phases.get("prefill", 0.0),
            "decode_s": phases.get("decode", 0.0), "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args()
    import torch
    from peft import get_peft_model

    recipe = load_recipe(SMOKE, {"policy.model": args.model, "data.num_tasks": args.tasks,
                                "grpo.tasks_per_step": min(2, args.tasks)})
    tasks = [task.truncated(recipe.rollout.max_turns) for task in load_tasks(select_task_ids(recipe))]
    policy = load_policy(resolve_model(args.model), recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    torch.manual_seed(recipe.seed)
    engines = {
        "transformers generate": TransformersGenerator(model, policy.tokenizer),
        "seal-lite llama.cpp": LlamaCppGenerator(str(gguf_path(args.model)), policy.tokenizer,
                                                 n_ctx=recipe.rollout.max_context_tokens, seed=recipe.seed),
    }
    print(f"{args.model}, {len(tasks)} tasks x G={recipe.rollout.num_generations}, "
          f"{recipe.rollout.max_turns} turns, {recipe.rollout.max_new_tokens} tokens a call, "
          f"{torch.get_num_threads()} threads\n")
    print(f"{'engine':24s} {'tokens':>7s} {'generate s':>11s} {'prefill s':>10s} {'decode s':>9s} {'tokens/s':>9s}")
    rates = {}
    for name, generator in engines.items():
        figures = play(generator, tasks, recipe)
        rates[name] = figures["tokens"] / figures["generate_s"]
        print(f"{name:24s} {figures['tokens']:7d} {figures['generate_s']:11.1f} {figures['prefill_s']:10.1f} "
              f"{figures['decode_s']:9.1f} {rates[name]:9.1f}")
    engines["seal-lite llama.cpp"].close()
    print(f"\nratio (llama.cpp / transformers tokens/s): {rates['seal-lite llama.cpp'] / rates['transformers generate']:.2f}x")


if __name__ == "__main__":
    main()
