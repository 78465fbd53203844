"""Issue 41, item 4: the paper-scale comparison, ready for a GPU and not yet run. recipes/paper-qwen2.5-7b.yaml (SEAL)
against recipes/ablation-vanilla-grpo.yaml (vanilla GRPO: the same recipe with schema cues, diagnosis weighting
and closed-loop rho off), seeds paired, each trained model and the base model evaluated on the 400 held-out tasks.

``--plan`` runs nothing and prints the design, what one run costs (steps, trajectories, tokens) and its GPU hours
on each card class of docs/gpu.md, the 400-task evaluations, the total, and the power of the test over seeds.
Every hour is an ESTIMATE: no GPU has run this project's steps. The estimate is arithmetic from the model's
shape (seal_lite/core/memory.py sizes each generate call for the card), episode sizes measured on the BFCL data
(``--episodes`` measures them again) and the speed assumptions in ``Speed``, each named with its source.

Without ``--plan`` it runs, resumably (each part is recorded under --records, docs/results/paper-comparison/, as
soon as it is done, and never redone; ``--commit`` also commits each record with git): per seed, vanilla then
SEAL, each ``seal-lite run RECIPE --set seed=N`` (the same seed draws the same tasks in the same order in both
arms) then ``seal-lite eval RUN`` on the 400 held-out tasks; then the base model. ``--summary-only`` tabulates the
records with seal_vs_vanilla's analysis: the paired differences over seeds, their two-level bootstrap interval,
the exact sign-flip test and the minimum detectable effect. It refuses to train without a CUDA GPU;
``--cpu-smoke`` runs the same plumbing on a CPU with SmolLM2-135M and tiny budgets, for testing.

    .venv/bin/python scripts/paper_comparison.py --plan
    .venv/bin/python scripts/paper_comparison.py --background --commit      # on the GPU machine
    .venv/bin/python scripts/paper_comparison.py --summary-only
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_experiment import (  # noqa: E402
    Records,
    evaluation,
    machine,
    paired_seed_difference,
    quarters,
    seal_lite,
    sets,
    training,
)
from seal_vs_vanilla import detectable, sign_flip_power  # noqa: E402

ARMS = {"vanilla": "recipes/ablation-vanilla-grpo.yaml", "seal": "recipes/paper-qwen2.5-7b.yaml"}
PAPER = {"base": 14.00, "vanilla": 30.75, "seal": 40.25}  # the paper's Table 3, Qwen2.5-7B-Instruct, % held out
DEFAULT_SEEDS = 6  # the fewest pairs whose exact two-sided sign-flip test can reach p < 0.05 (2/64)
# --cpu-smoke: the plumbing on a CPU, SmolLM2-135M, one step of one task x 2, the first turn, the one-line signatures
# (BFCL's view is 7x longer) in training and evaluation, no validation during training: no BFCL score, a test of the
# machinery
SMOKE = ["policy.model=smollm2-135m", "policy.device=auto", "policy.gradient_checkpointing=false",
         "interface.tool_format=signatures", "rollout.num_generations=2", "rollout.max_turns=1",
         "rollout.max_new_tokens=16", "rollout.max_model_calls=2", "rollout.max_response_tokens=null",
         "rollout.max_context_tokens=4096", "rollout.generation_batch_size=null", "rollout.generation_token_budget=null",
         "grpo.steps=1", "grpo.tasks_per_step=1", "grpo.mini_batches=1", "validation.every=null"]


# ---- the cost: seal_lite/core/plan.py, the arithmetic `seal-lite recipe --card` prints for one card -------------

from seal_lite.core.plan import (  # noqa: E402
    ANSWER_TOKENS,
    CARDS,
    PAGED_BLOCK_SIZE,
    Speed,
    card_budget,
    card_memory,
    card_paged,
    card_vllm,
    episode_cases,
    evaluation_cost,
    forward_flops,
    run_cost,
    shares_prefix,
    update_passes,
    update_peak_bytes,
)

# ---- the power of the test over seeds --------------------------------------------------------------------------

SEED_PART = 5.0  # points: the seed-to-seed part of one seed's score, the audit's figure (docs/results/seal-vs-vanilla.md, issue 41)
POWER_PAIRS = (6, 8, 10)


def task_part(tasks: int = 400) -> float:
    """Points: the binomial spread of a mean over ``tasks`` tasks at the paper's 7B scores' midpoint (35.5%),
    as if each task's verdict were drawn afresh for every seed (an upper bound: many tasks never flip)."""
    rate = (PAPER["vanilla"] + PAPER["seal"]) / 200
    return 100 * math.sqrt(rate * (1 - rate) / tasks)


def power_table(seeds: int, effect: float = PAPER["seal"] - PAPER["vanilla"]) -> list[dict]:
    """Per spread of one seed's score and correlation of paired seeds: the SD of a pair's difference, the effect
    the exact sign-flip test detects with 80% power at each number of pairs, its power against ``effect`` with
    ``seeds`` pairs, the fewest pairs (6 to 10) that detect ``effect`` with 80% power, and the interval's
    half-width (1.96 x its standard error) with ``seeds`` pairs."""
    expected = math.hypot(SEED_PART, task_part())
    pairs = sorted({*POWER_PAIRS, seeds} if 6 <= seeds <= 10 else POWER_PAIRS)
    rows = []
    for seed_sd in (3.0, expected, 8.0):
        for correlation in (0.0, 0.4):
            pair_sd = seed_sd * math.sqrt(2 * (1 - correlation))
            rows.append({"seed_sd": seed_sd, "correlation": correlation, "pair_sd": pair_sd,
                         "detectable": {n: detectable(pair_sd, n) for n in pairs},
                         "power": sign_flip_power(effect, pair_sd, seeds) if 6 <= seeds <= 12 else None,
                         "pairs_for_effect": next((n for n in range(6, 11)
                                                   if sign_flip_power(effect, pair_sd, n) >= 0.8), None),
                         "half_width": 1.96 * pair_sd / math.sqrt(seeds)})
    return rows


# ---- the plan ----------------------------------------------------------------------------------------------------

def load(arm: str, overrides: list[str]):
    from seal_lite.api import parse_overrides
    from seal_lite.core.recipe import load_recipe

    return load_recipe(ROOT / ARMS[arm], parse_overrides(tuple(overrides)))


def plan(seeds: int, overrides: list[str], speed: Speed = Speed()) -> dict:
    """The design and its cost: per card and rollout engine (generate; vLLM where the card runs it; the paged
    engine), a run's and an evaluation's hours for episodes like the ground truth's and for episodes that spend
    their whole budget, and the total of 2 arms x ``seeds`` runs and 2 x ``seeds`` + 1 evaluations (the base
    model's too)."""
    from seal_lite.core.memory import GIB, KNOWN_SHAPES

    recipe = load("seal", overrides)
    if recipe.policy.model not in KNOWN_SHAPES:
        raise SystemExit(f"--plan knows the shapes of {', '.join(KNOWN_SHAPES)}, not {recipe.policy.model!r}")
    shape = KNOWN_SHAPES[recipe.policy.model]
    train, held_out = (episode_cases(recipe.rollout, speed, split) for split in ("train", "eval"))
    episodes = {case: (episode, held_out[case][0], decode_steps) for case, (episode, decode_steps) in train.items()}
    # the update on Unsloth, one trajectory a pass, beside the recipe's
    unsloth = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"backend": "unsloth"})})
    like_truth, _, truth_steps = episodes["like the ground truth"]
    cards = []
    for card in CARDS:
        budget = card_budget(recipe, shape, card)
        row = {"card": card, "budget": budget, "rows": budget // recipe.rollout.max_context_tokens, "cases": {},
               "unsloth_update": run_cost(unsloth, shape, card, like_truth, speed, truth_steps)["update"] / 3600,
               "update_gb": card_memory(recipe, shape, card)["update_gb"]}  # what `recipe --card` prints
        if card.vllm:
            row["vllm_memory"], row["vllm_cache_tokens"] = card_vllm(recipe, shape, card)
        row["paged_pool_tokens"] = card_paged(recipe, shape, card)
        for case, (train, held_out, decode_steps) in episodes.items():
            for engine in ("generate", "vllm", "paged") if card.vllm else ("generate", "paged"):
                run = run_cost(recipe, shape, card, train, speed, decode_steps, engine, held_out)
                evaluated = evaluation_cost(recipe, shape, card, held_out, speed, decode_steps, engine=engine)
                key = case if engine == "generate" else f"{case}, {engine}"
                row["cases"][key] = {"run": run, "evaluation": evaluated,
                                     "total": 2 * seeds * run["hours"] + (2 * seeds + 1) * evaluated["hours"]}
        cards.append(row)
    update_gb = update_peak_bytes(shape, recipe.rollout.max_context_tokens, 2, recipe.policy.lora_r,
                                  shares_prefix(recipe), episodes["whole budget"][0].opening) / GIB
    return {"recipe": recipe, "seeds": seeds, "episodes": {case: value[0] for case, value in episodes.items()},
            "cards": cards, "update_gb": update_gb, "power": power_table(seeds), "speed": speed, "shape": shape}


def print_plan(design: dict) -> None:
    print_design(design)
    print_cost(design)
    print_power(design)


def print_design(design: dict) -> None:
    recipe, seeds = design["recipe"], design["seeds"]
    per_step = recipe.grpo.tasks_per_step * recipe.rollout.num_generations
    print(f"Design: {ARMS['seal']} (SEAL) against {ARMS['vanilla']} (vanilla GRPO: schema cues, diagnosis "
          f"weighting and closed-loop rho off), {recipe.policy.model}, seeds 0-{seeds - 1} paired (the same seed "
          f"draws the same tasks in the same order in both arms); each trained model and the base model evaluated "
          f"greedily on the 400 held-out tasks (data/eval_ids.txt, 100 a category). {2 * seeds} runs, "
          f"{2 * seeds + 1} evaluations.")
    rollout = recipe.rollout
    trained = (f"the update on the first {rollout.trained_tokens()} tokens after the prompt" if rollout.trained_tokens()
               else f"at most {rollout.episode_token_cap()} model tokens")
    print(f"One run: {recipe.grpo.steps} steps x {recipe.grpo.tasks_per_step} tasks x G = "
          f"{rollout.num_generations} = {recipe.grpo.steps * per_step:,} episodes; each at most "
          f"{rollout.max_model_calls} model messages of {rollout.max_new_tokens} tokens in a "
          f"{rollout.max_context_tokens:,}-token context, {trained} (rollout.budget {rollout.budget}).")
    validation = recipe.validation
    if validation.every:
        print(f"Each run validates {validation.count(recipe.grpo.steps)} times (every {validation.every} steps, after "
              f"the last{', and before the first' if validation.before_training else ''}) on {validation.slice_size()} "
              f"tasks of the {validation.split} split, greedily, and keeps the best adapter by "
              f"{validation.metric}, as the SEAL release does.")
    print("\nEpisodes (tokens, means): measured ones play like the ground truth (the official view, Qwen2.5's "
          f"tokenizer, the BFCL data; {ANSWER_TOKENS} tokens per text answer assumed); the bound spends every budget.")
    print("| episode | opening | model messages | model tokens | environment tokens | final length |")
    print("|---|---|---|---|---|---|")
    for case, episode in design["episodes"].items():
        print(f"| {case} (training) | {episode.opening:,.0f} | {episode.messages:.1f} | {episode.model_tokens:,.0f} "
              f"| {episode.env_tokens:,.0f} | {episode.length():,.0f} |")
    for case, cost in design["cards"][0]["cases"].items():
        run = cost["run"]
        print(f"Tokens of one run, {case}: {run['prefill_tokens'] / 1e9:.2f} G read by prefills, "
              f"{run['generated_tokens'] / 1e6:.1f} M generated, {run['trained_tokens'] / 1e6:.0f} M trained on; "
              f"one evaluation reads {cost['evaluation']['prefill_tokens'] / 1e6:.0f} M.")


def print_cost(design: dict) -> None:
    recipe, seeds, speed, update_gb = design["recipe"], design["seeds"], design["speed"], design["update_gb"]
    kept = {}  # the cards where the update keeps its suffixes' graphs, by its peak there
    for row in design["cards"]:
        if round(row["update_gb"], 1) != round(update_gb, 1):
            kept.setdefault(f"{row['update_gb']:.1f}", []).append(row["card"].name)
    with_kept = "".join(f", {peak} GB with the suffixes' graphs it keeps on {', '.join(names)}"
                        for peak, names in kept.items())
    print("\nESTIMATED GPU hours (no GPU has run these steps; the speeds below are assumptions). Per card, the "
          "memory model (seal_lite/core/memory.py) sizes each generate call: padded tokens a call, rows of the full "
          f"context; the update's estimated peak is {update_gb:.1f} GB{with_kept} (seal_lite/core/plan.py, "
          "update_peak_bytes and card_memory: what `seal-lite recipe --card` prints).")
    print("| card | tokens per call (rows of 16k) | run: prefill + decode + update + validation, h | evaluation, h "
          f"| total, {2 * seeds} runs + {2 * seeds + 1} evaluations, h | whole-budget bound, total h |")
    print("|---|---|---|---|---|---|")
    for row in design["cards"]:
        card = row["card"]
        setting = "" if row["budget"] == recipe.rollout.generation_token_budget else \
            f" (--set rollout.generation_token_budget={row['budget']})"
        fits = "" if row["update_gb"] <= 0.9 * card.memory_gb else ", update tight"
        print(f"| {card.name} ({card.memory_gb} GB{fits}) | {row['budget']:,} ({row['rows']}){setting} | "
              f"{hours_cells(row, '')}")
    print(f"Assumed (not measured): prefill at {speed.prefill_mfu:.0%} and the update at {speed.update_mfu:.0%} of the "
          f"card's 16-bit peak; decode at {speed.bandwidth_share:.0%} of its bandwidth and at least "
          f"{speed.decode_floor_s * 1000:.0f} ms a step; a generate call decodes {speed.longest_message} steps "
          f"(its longest message; the bound: {recipe.rollout.max_new_tokens}). The update counts "
          f"{update_passes(recipe)} forward-sized passes a trained token (forward, backward, recompute, the "
          f"reference's, and TRL's old log-probs: {recipe.grpo.mini_batches} mini-batches a step); counted the same "
          f"way, the update measured on 2 CPU cores (benchmarks/RESULTS.md, issue 16: 4 passes) ran at "
          f"{cpu_update_rate():.0f} GFLOP/s, well under two AVX2 cores' fp32 peak.")
    run = design["cards"][0]["cases"]["like the ground truth"]["run"]
    print(f"Where the hours go with generate: prefill, since each model message re-reads its episode's whole context "
          f"(generate keeps no cache between an episode's messages): {run['prefill_tokens'] / 1e9:.2f} G tokens a run, "
          f"where its episodes hold {run['trained_tokens'] / 1e6:.0f} M.")
    if shares_prefix(recipe):
        updates = ", ".join(f"{row['card'].name} {row['cases']['like the ground truth']['run']['update'] / 3600:.1f} "
                            f"against {row['unsloth_update']:.1f}" for row in design["cards"])
        print(f"The update on {recipe.policy.backend} reads each group's opening once a pass, then each trajectory's "
              f"rest against it: {run['read_tokens'] / 1e6:.0f} M tokens a pass where the trajectories hold "
              f"{run['trained_tokens'] / 1e6:.0f} M; it keeps the suffixes' graphs for the backward pass where half the "
              "free memory holds a group's (else it recomputes them: one more pass over them). Unsloth's trainer reads "
              f"every trajectory whole (--set policy.backend=unsloth). Update hours a run, {recipe.policy.backend} "
              f"against Unsloth, at the same assumed speed: {updates}.")
    else:
        print("The update reads each trajectory whole, one a pass.")
    print("\nWith vLLM rollouts (rollout.backend vllm on an Ampere or newer card with `pip install -e '.[vllm]'`): "
          "prefix caching reads each task's opening once a group and then only what the environment appends, and "
          "continuous batching decodes as many episodes as vLLM's KV cache holds. Its share of the card is the "
          "largest the memory model leaves beside the trainer (vLLM sleeps during the update; not measured).")
    print(f"| card | rollout.vllm_memory (KV tokens) | run: prefill + decode + update + validation, h | evaluation, h "
          f"| total, {2 * seeds} runs + {2 * seeds + 1} evaluations, h | whole-budget bound, total h |")
    print("|---|---|---|---|---|---|")
    for row in design["cards"]:
        card = row["card"]
        if not card.vllm:
            print(f"| {card.name} ({card.memory_gb} GB) | generate only: older than Ampere | | | | |")
            continue
        print(f"| {card.name} ({card.memory_gb} GB) | {row['vllm_memory']:.2f} ({row['vllm_cache_tokens']:,}) | "
              f"{hours_cells(row, ', vllm')}")
    print(f"Assumed (not measured): a vLLM decode step at least {speed.vllm_decode_floor_s * 1000:.0f} ms; the rest "
          f"as above. A run reads {design['cards'][0]['cases']['like the ground truth, vllm']['run']['prefill_tokens'] / 1e9:.2f} "
          "G tokens by prefills.")
    print_paged_cost(design)


def hours_cells(row: dict, engine: str) -> str:
    """A cost table's last four cells for one card on one engine ("", ", vllm", ", paged"): a run's prefill +
    decode + update + validation hours, an evaluation's, the design's total, and its whole-budget bound."""
    expected, bound = row["cases"][f"like the ground truth{engine}"], row["cases"][f"whole budget{engine}"]
    run = expected["run"]
    parts = " + ".join(f"{run[key] / 3600:.1f}" for key in ("prefill", "decode", "update", "validation"))
    return (f"{parts} = {run['hours']:.0f} | {expected['evaluation']['hours']:.1f} | {expected['total']:,.0f} | "
            f"{bound['total']:,.0f} |")


def print_paged_cost(design: dict) -> None:
    recipe, seeds, speed = design["recipe"], design["seeds"], design["speed"]
    context = recipe.rollout.max_context_tokens
    print("\nWith paged rollouts (rollout.backend paged: transformers' continuous batching on paged attention, the "
          "trained model itself, on every card, the T4 included): prefix blocks read each task's opening once a group "
          f"and then what the environment appends, with up to {PAGED_BLOCK_SIZE - 1} tokens again a message; as many "
          f"episodes decode at once as its KV pool holds, at most {recipe.generation_batch()} (the recipe's "
          "generation batch). Its pool is the largest the memory model fits beside the policy (not measured).")
    print(f"| card | KV pool tokens (episodes of {context // 1024}k) | run: prefill + decode + update + validation, h "
          f"| evaluation, h | total, {2 * seeds} runs + {2 * seeds + 1} evaluations, h | whole-budget bound, total h |")
    print("|---|---|---|---|---|---|")
    for row in design["cards"]:
        card, pool = row["card"], row["paged_pool_tokens"]
        print(f"| {card.name} ({card.memory_gb} GB) | {pool:,} ({pool // context}) | {hours_cells(row, ', paged')}")
    shape = design["shape"]
    print(f"Assumed (not measured): a paged step at least {speed.paged_decode_floor_s * 1000:.0f} ms (generate's "
          "floor: Python and kernel launches every step); attention by torch's SDPA without flash attention (none "
          "is installed; the T4 has none), which attends every query of a pass to every key the pass reads, so a "
          "step's attention grows with the square of the rows and its bytes with the keys and values it reads: out "
          "of the pool, gathered, and copied to every attention head, as transformers does with a mask "
          f"({3 + 2 * shape.heads / shape.kv_heads:g} times their bytes, counted); each prefill token attends to all "
          "the batch's keys too. Generate's padded calls make the same copy to every head, which generate's "
          "estimate does not yet count. The rest as above. A run reads "
          f"{design['cards'][0]['cases']['like the ground truth, paged']['run']['prefill_tokens'] / 1e9:.2f} G tokens "
          "by prefills.")


def print_power(design: dict) -> None:
    seeds, effect = design["seeds"], PAPER["seal"] - PAPER["vanilla"]
    print("\nPower: the primary test is the exact two-sided sign-flip test over the paired seeds' differences "
          "(SEAL - vanilla, points of the 400-task mean). ASSUMED spread of one seed's score: "
          f"{SEED_PART:g} points seed to seed (the audit's figure, docs/results/seal-vs-vanilla.md) with {task_part():.1f} of task "
          f"noise (binomial, 400 tasks at {(PAPER['vanilla'] + PAPER['seal']) / 2:.1f}%): "
          f"{math.hypot(SEED_PART, task_part()):.1f} in all; 3 and 8 bracket it (8: the CPU pre-registration's upper "
          "figure). Paired seeds may correlate (0 or 0.4).")
    print(f"| one seed's SD | correlation | SD of a pair's difference | detectable at 80%: "
          f"{' | '.join(f'{n} pairs' for n in POWER_PAIRS)} | power at +{effect:g} with {seeds} pairs "
          f"| pairs for +{effect:g} at 80% | 95% half-width (normal) with {seeds} pairs |")
    print("|---|---|---|" + "---|" * len(POWER_PAIRS) + "---|---|---|")
    for row in design["power"]:
        cells = " | ".join(f"{row['detectable'][n]}" if row["detectable"][n] else "> 60" for n in POWER_PAIRS)
        power = "no test" if seeds < 6 else f"{row['power']:.0%}" if row["power"] is not None else "-"
        print(f"| {row['seed_sd']:.1f} | {row['correlation']:g} | {row['pair_sd']:.1f} | {cells} | {power} | "
              f"{row['pairs_for_effect'] or '> 10'} | ±{row['half_width']:.1f} |")
    smallest = 2 / 2**seeds
    verdict = (f"{seeds} pairs: the exact test's smallest p is 2/{2**seeds} = {smallest:.3g}, so it can never "
               "reach 0.05; these seeds give an estimate with its interval, not a test. 6 pairs is the fewest for "
               "a two-sided exact test at 0.05 (2/64)." if smallest >= 0.05 else
               f"{seeds} pairs: the exact test's smallest p is 2/{2**seeds} = {smallest:.3g}.")
    expected = [row for row in design["power"] if row["seed_sd"] == math.hypot(SEED_PART, task_part())]
    if all(seeds in row["detectable"] and row["power"] is not None for row in expected):
        verdict += (f" At the expected spread they detect {min(r['detectable'][seeds] for r in expected)} to "
                    f"{max(r['detectable'][seeds] for r in expected)} points with 80% power and find "
                    f"+{effect:g} with {min(r['power'] for r in expected):.0%} to {max(r['power'] for r in expected):.0%};"
                    f" 80% for +{effect:g} takes {min(r['pairs_for_effect'] or 11 for r in expected)} to "
                    f"{max(r['pairs_for_effect'] or 11 for r in expected)} pairs (--seeds).")
    print(f"{verdict} The paper's SEAL - vanilla at 7B is +{effect:g} ({PAPER['seal']} against {PAPER['vanilla']}, "
          "Table 3, one run each).")


def cpu_update_rate() -> float:
    """GFLOP/s the FLOP count implies for the update measured on 2 CPU cores (benchmarks/RESULTS.md, issue 16):
    Qwen2.5-Coder-0.5B in fp32, one trajectory a pass, a 4,934-token prompt and G = 8 completions of 450-751
    tokens, the reference pass and gradient checkpointing, 5,546.5 s of wall time."""
    from seal_lite.core.memory import Shape

    shape = Shape(24, 896, 4864, 14, 2, 64, 151936, True)  # Qwen2.5-0.5B's config.json
    completions = range(450, 752, 43)
    flops = sum(4 * forward_flops(shape, 4934 + n) + 3 * 2 * shape.vocab * shape.hidden * n for n in completions)
    return flops / 5546.5 / 1e9


def ground_truth_episodes(split: str) -> dict:
    """Measure ``MEASURED_EPISODES[split]`` again: play each task's ground truth in the environment and count the
    official view's tokens with Qwen2.5's tokenizer (the pip GGUF of Qwen2.5-Coder-0.5B, the same vocabulary)."""
    from transformers import AutoTokenizer

    from seal_lite.core.calls import parse_calls
    from seal_lite.core.interface import evaluation_interface
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.envs.bfcl import episode, load_tasks, split_ids
    from seal_lite.step.rollout import turn_text

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b"), clean_up_tokenization_spaces=False)
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    view, rows = evaluation_interface("official"), []
    for task in load_tasks(split_ids(split)):
        environment, row = episode(task), {"calls": 0, "call_tokens": 0, "result_tokens": 0}
        row["opening"] = count(turn_text(tokenizer, task, 0, view))
        row["user_turns"] = sum(count(turn_text(tokenizer, task, turn, view)) for turn in range(1, len(task.turns)))
        row["turns"] = len(task.turns)
        for turn, calls in enumerate(task.ground_truth):
            visible = {doc["name"] for doc in task.visible_functions(turn)}
            for call in parse_calls("[" + ", ".join(calls) + "]").calls if calls else []:
                outcome = environment.execute(call, visible)
                block = json.dumps({"name": call.name, "arguments": call.arguments})
                row["calls"] += 1
                row["call_tokens"] += count(f"<tool_call>\n{block}\n</tool_call>") + 2  # <|im_end|>\n
                row["result_tokens"] += count(f"<|im_start|>user\n<tool_response>\n{outcome.result}\n</tool_response>"
                                              "<|im_end|>\n<|im_start|>assistant\n")
        rows.append(row)
    return {key: round(statistics.fmean(row[key] for row in rows), 2) for key in rows[0]}


# ---- the runs ----------------------------------------------------------------------------------------------------

def arm_settings(seed: int, overrides: list[str]) -> list[str]:
    """The fields a run sets on its arm's recipe: the seed (the same in both arms) and any --set."""
    return [f"seed={seed}", *overrides]


def base_settings(overrides: list[str]) -> list[str]:
    """``seal-lite eval MODEL``'s --set for the base model: the recipe's policy (but the model) and rollout fields,
    so it is loaded, batched and budgeted as the trained models' evaluations are."""
    recipe = load("vanilla", overrides)
    return [f"{section}.{key}={json.dumps(value)}" for section in ("policy", "rollout")
            for key, value in getattr(recipe, section).model_dump().items() if (section, key) != ("policy", "model")]


def cuda_device() -> str | None:
    """The name of the CUDA GPU torch sees, or None."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


class CommittedRecords(Records):
    """Records that git commits as each is written (only that file: other staged changes stay staged)."""

    def put(self, name: str, record: dict) -> None:
        super().put(name, record)
        path = (self.directory / f"{name}.json").resolve()
        subprocess.run(["git", "add", path.name], cwd=path.parent, check=True)
        subprocess.run(["git", "commit", "-q", "-m", f"paper comparison: {name} recorded", "--", path.name],
                       cwd=path.parent, check=False)


def evaluate(target: str, path: Path, held_out: dict, *settings: str) -> float | None:
    """``seal-lite eval TARGET`` on ``held_out`` (split, tasks, view) into ``path`` unless it is there; the minutes it
    took (None: done before)."""
    if path.exists():
        return None
    started = time.time()
    tasks = ["--tasks", str(held_out["tasks"])] if held_out["tasks"] else []
    seal_lite("eval", target, "--split", held_out["split"], *tasks, "--view", held_out["view"],
              *sets(list(settings)), "--json-file", str(path))
    return (time.time() - started) / 60


def run(out: Path, records: Records, seeds: list[int], overrides: list[str], held_out: dict) -> None:
    """Per seed, vanilla then SEAL: the run (resumed if unfinished), its record, its evaluation on ``held_out``
    ({"split", "tasks", "view"}); then the base model's."""
    from seal_lite.runs.run_dir import run_status

    where = {"machine": machine(), "gpu": cuda_device()}
    for seed in seeds:
        for arm, recipe in ARMS.items():
            name, run_dir = f"{arm}-seed{seed}", out / f"{arm}-seed{seed}"
            record = records.get(name) or {}
            if "training" not in record:
                if run_status(run_dir) != "finished":
                    seal_lite("run", ARMS[arm], "--out", str(run_dir), *sets(arm_settings(seed, overrides)))
                record = {"arm": arm, "seed": seed, "recipe": recipe, "settings": arm_settings(seed, overrides),
                          **where, "training": training(run_dir)}
                records.put(name, record)
            if "held_out" not in record:
                minutes = evaluate(str(run_dir), out / f"{name}-eval.json", held_out)
                record.update(held_out=evaluation(out / f"{name}-eval.json"), evaluated_on=held_out,
                              eval_minutes=minutes)
                records.put(name, record)
    if records.get("base") is None:
        model = load("vanilla", overrides).policy.model
        minutes = evaluate(model, out / "base-eval.json", held_out, *base_settings(overrides))
        records.put("base", {"model": model, **where, "held_out": evaluation(out / "base-eval.json"),
                             "evaluated_on": held_out, "eval_minutes": minutes})


def accuracy(record: dict) -> dict[str, float]:
    return {task: row["accuracy"] for task, row in record["held_out"].items()}


def per_category(scores: list[dict[str, float]]) -> dict[str, float]:
    """The mean accuracy of each category over the runs, and their plain mean (the paper's headline)."""
    from seal_lite.envs.bfcl import CATEGORIES, category_of

    table = {category: statistics.fmean(score[task] for score in scores for task in score
                                         if category_of(task) == category)
             for category in CATEGORIES if any(category_of(task) == category for task in scores[0])}
    return {**table, "mean": statistics.fmean(table.values())}


def summarize(records: Records, seeds: list[int]) -> dict:
    """What is done: each run's training and held-out score, per arm the categories' means, and SEAL against
    vanilla over the seeds whose two runs are both evaluated (an interim result while pairs are missing)."""
    runs = {(arm, seed): record for arm in ARMS for seed in seeds if (record := records.get(f"{arm}-seed{seed}"))}
    summary: dict = {"seeds": seeds, "runs": {}, "arms": {}}
    for (arm, seed), record in runs.items():
        first, last = quarters(record["training"]["rewards"]) if record["training"]["rewards"] else (None, None)
        summary["runs"][f"{arm}-seed{seed}"] = {
            "reward_first_quarter": first, "reward_last_quarter": last, "minutes": record["training"]["minutes"],
            "eval_minutes": record.get("eval_minutes"), "gpu": record.get("gpu"),
            "held_out": statistics.fmean(accuracy(record).values()) if "held_out" in record else None}
    for arm in ARMS:
        scores = [accuracy(runs[arm, seed]) for seed in seeds if "held_out" in runs.get((arm, seed), {})]
        if scores:
            summary["arms"][arm] = {"seeds": len(scores), **per_category(scores)}
    if (base := records.get("base")) is not None:
        summary["arms"]["base"] = {"seeds": 1, **per_category([accuracy(base)])}
    paired = [seed for seed in seeds if all("held_out" in runs.get((arm, seed), {}) for arm in ARMS)]
    if paired:
        summary["seal_minus_vanilla"] = {
            "seeds": paired, "interim": len(paired) < len(seeds),
            **paired_seed_difference([accuracy(runs["seal", seed]) for seed in paired],
                                     [accuracy(runs["vanilla", seed]) for seed in paired])}
    return summary


def print_summary(summary: dict) -> None:
    if not summary["runs"] and not summary["arms"]:
        print("nothing recorded yet")
        return
    print("| run | GPU | reward, first -> last quarter | minutes of steps | evaluation minutes | held-out accuracy % |")
    print("|---|---|---|---|---|---|")
    for name, run in summary["runs"].items():
        rewards = (f"{run['reward_first_quarter']:.2f} -> {run['reward_last_quarter']:.2f}"
                   if run["reward_first_quarter"] is not None else "-")
        held_out = f"{100 * run['held_out']:.1f}" if run["held_out"] is not None else "not yet"
        evaluated = f"{run['eval_minutes']:.0f}" if run["eval_minutes"] is not None else "-"
        print(f"| {name} | {run['gpu'] or 'none'} | {rewards} | {run['minutes']:.0f} | {evaluated} | {held_out} |")
    if summary["arms"]:
        categories = [key for key in next(iter(summary["arms"].values())) if key != "seeds"]
        print(f"\n| arm | seeds | {' | '.join(categories)} | paper (7B) |")
        print("|---|---|" + "---|" * (len(categories) + 1))
        for arm, row in summary["arms"].items():
            print(f"| {arm} | {row['seeds']} | {' | '.join(f'{100 * row[c]:.2f}' for c in categories)} "
                  f"| {PAPER[arm]:.2f} |")
    if "seal_minus_vanilla" not in summary:
        print("\nSEAL - vanilla: no seed has both runs evaluated yet")
        return
    result = summary["seal_minus_vanilla"]
    interim = f" (interim: {len(result['seeds'])} of {len(summary['seeds'])} pairs)" if result["interim"] else ""
    pair_sd = f"{100 * result['pair_sd']:.1f}" if result["pair_sd"] is not None else "-"
    print(f"\nSEAL - vanilla{interim}, seeds {', '.join(map(str, result['seeds']))}: per seed "
          f"{', '.join(f'{100 * d:+.1f}' for d in result['differences'])}; mean {100 * result['mean']:+.1f} points "
          f"[{100 * result['low']:+.1f}, {100 * result['high']:+.1f}] (two-level bootstrap, pairs then tasks); "
          f"sign-flip test over seeds p = {result['seed_p']:.2g} (at best {result['smallest_p']:.2g}); SD of a pair's "
          f"difference {pair_sd} points; detectable at 80% power about {100 * result['mde']:.0f} points"
          + (" (no exact test over these seeds reaches p < 0.05)" if result["smallest_p"] >= 0.05 else "")
          + f". The paper: +{PAPER['seal'] - PAPER['vanilla']:g}.")


def background(argv: list[str], out: Path) -> None:
    """This command again, without --background, detached from the terminal; its output to OUT/paper-comparison.log."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "paper-comparison.log"
    with log.open("a") as sink:
        child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                  *(word for word in argv if word != "--background")],
                                 cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"running in the background (pid {child.pid}), output in {log}; the same command resumes it after a "
          "stop, and --summary-only tabulates what is done")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="print the design, its estimated cost and power; run nothing")
    parser.add_argument("--episodes", action="store_true", help="measure the ground truth's episode sizes again")
    parser.add_argument("--summary-only", action="store_true", help="run nothing: tabulate the records")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="paired seeds 0..N-1 (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of both arms' recipes (repeatable)")
    parser.add_argument("--out", type=Path, help="the runs and evaluations (default: runs/paper-comparison)")
    parser.add_argument("--records", type=Path,
                        help="the records of finished parts (default: docs/results/paper-comparison)")
    parser.add_argument("--eval-split", default="eval", help="held-out tasks: eval (the 400) or BFCL ids a,b")
    parser.add_argument("--eval-tasks", type=int, help="only the first N held-out tasks of each category")
    parser.add_argument("--commit", action="store_true", help="git-commit each record as it is written")
    parser.add_argument("--background", action="store_true", help="run detached, output to OUT/paper-comparison.log")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="test the plumbing on a CPU: SmolLM2-135M, one tiny step a run, records under OUT")
    args = parser.parse_args(argv)
    if args.episodes:
        print(json.dumps({split: ground_truth_episodes(split) for split in ("train", "eval")}, indent=1))
        return
    seeds = list(range(args.seeds))
    if args.plan:
        print_plan(plan(args.seeds, args.overrides))
        return
    smoke = "paper-comparison-smoke" if args.cpu_smoke else "paper-comparison"
    out = args.out or ROOT / "runs" / smoke
    records_dir = args.records or (out / "records" if args.cpu_smoke else ROOT / "docs" / "results" / smoke)
    records = (CommittedRecords if args.commit else Records)(records_dir)
    if not args.summary_only:
        if not args.cpu_smoke and cuda_device() is None:
            raise SystemExit("scripts/paper_comparison.py trains Qwen2.5-7B-Instruct on an NVIDIA GPU (an 80 GB card, "
                             "docs/gpu.md), and torch sees no CUDA GPU on this machine. Here: --plan prints the design "
                             "and its cost, --summary-only tabulates the records, --cpu-smoke tests the plumbing with "
                             "a tiny model.")
        if args.background:
            background(argv, out)
            return
        out.mkdir(parents=True, exist_ok=True)
        held_out = {"split": args.eval_split, "tasks": args.eval_tasks,
                    "view": "signatures" if args.cpu_smoke else "official"}
        run(out, records, seeds, [*(SMOKE if args.cpu_smoke else []), *args.overrides], held_out)
    summary = summarize(records, seeds)
    if summary["runs"] or summary["arms"]:
        records.put("summary", summary)
    print_summary(summary)


if __name__ == "__main__":
    main()
