"""seal_lite/core/plan.py on one card (``seal-lite recipe RECIPE --card NAME``): the memory model's fit, the budget
that makes a recipe fit, the update's estimated peak worked out by hand, and the command on a machine without the
card (the plan needs none)."""

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core import plan
from seal_lite.core.memory import CUDA_CONTEXT, GIB, KNOWN_SHAPES, NF4_BYTES, Shape, paged_live_rows, resident_bytes
from seal_lite.core.recipe import load_recipe

ROOT = Path(__file__).parents[2]
TOY = Shape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, tied_embeddings=True)
CARD = {plan.card_key(card): card for card in plan.CARDS}


def test_the_updates_peak_estimate_worked_out_by_hand():
    """What the backward pass holds throughout: the resident part, the CUDA context and each of 2 layers' input in
    16 bits (2 x width x 4 x 2); then the largest of its moments: the LM head's (one 1,024-position chunk of fp32
    logits and their gradient, 1024 x 10 x 4 x 2, beside the final RMSNorm's fp32 input and 16-bit output, width x 4
    x 6) or a recomputed layer's (its MLP's 3 intermediates and 4 hidden-sized tensors, width x (24 + 16) x 2). At
    100 tokens the head's is the largest, at 10,000 the layer's."""
    base = resident_bytes(TOY, 2, True, 8) + CUDA_CONTEXT
    assert plan.update_peak_bytes(TOY, 100, 2, 8) == int(base + 1600 + 81920 + 2400)
    assert plan.update_peak_bytes(TOY, 10_000, 2, 8) == int(base + 160_000 + 800_000)


def test_the_shared_updates_peak_counts_its_suffixes_masks_and_repeated_keys():
    """With the shared prefix, 1,000 tokens of which 400 the opening: the pass also holds the opening's keys and
    values (1000 x 16 bytes) and the suffix's bool mask, 600 queries x 1,000 keys; in a layer's forward SDPA turns
    that mask into a 16-bit additive one and pads it (2 x 2 bytes a pair) beside the keys and values repeated to both
    heads (1000 x 2 x 2 x 2 x 2 bytes): that moment, 2.4 MB, outweighs the layer's backward (its MLP, the padded
    mask and the repeated keys: 80,000 + 1,200,000 + 16,000) and the head's (81,920 + 24,000)."""
    base = resident_bytes(TOY, 2, True, 8) + CUDA_CONTEXT
    held = 16_000 + 16_000 + 600_000
    assert plan.update_peak_bytes(TOY, 1000, 2, 8, shared=True, opening=400) == int(base + held + 2_416_000)
    # no opening: the suffix bounded by the whole width, 1,000 x 1,000 pairs
    assert plan.update_peak_bytes(TOY, 1000, 2, 8, shared=True) == int(base + 32_000 + 1_000_000 + 4_016_000)


def test_a_recipe_that_does_not_fit_a_card_is_told_the_budget_that_does():
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    on_4090 = plan.card_plan(recipe, shape, CARD["rtx-4090"])
    assert on_4090["call_fits"] and on_4090["fitting_budget"] >= recipe.rollout.generation_token_budget
    on_t4 = plan.card_plan(recipe, shape, CARD["t4"])
    assert not on_t4["call_fits"] and 0 < on_t4["fitting_budget"] < recipe.rollout.generation_token_budget
    cut = recipe.model_copy(update={"rollout": recipe.rollout.model_copy(
        update={"generation_token_budget": on_t4["fitting_budget"]})})
    assert plan.card_plan(cut, shape, CARD["t4"])["call_fits"]  # the --set it names makes it fit
    # auto counts both GPU backends: Unsloth's generate holds less than bitsandbytes + peft's at the same rows
    unsloth = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"backend": "unsloth"})})
    assert plan.card_plan(unsloth, shape, CARD["t4"])["call_gb"] < on_t4["call_gb"]


def test_a_runs_hours_are_its_steps_and_its_validations_and_a_faster_card_takes_fewer():
    recipe = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    a100, h100 = (plan.card_plan(recipe, shape, CARD[key]) for key in ("a100-80gb", "h100-80gb-sxm"))
    for case, hours in a100["hours"].items():
        assert hours["validations"] == 9 and hours["validation"] > 0
        assert hours["run"] == pytest.approx(hours["step"] * recipe.grpo.steps + hours["validation"])
        assert 0 < hours["update_share"] < 1 and h100["hours"][case]["run"] < hours["run"]
    assert a100["hours"]["whole budget"]["run"] > a100["hours"]["like the ground truth"]["run"]


def test_the_card_option_plans_a_gpu_recipe_on_a_machine_without_that_card():
    """On this machine `seal-lite recipe recipes/gpu-24gb.yaml` alone may refuse (no GPU here): with --card it plans
    for the card named, and the --set it prints makes the recipe fit."""
    runner = CliRunner()
    result = runner.invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "gpu-24gb on T4 (15 GB" in text and "does not fit in 90% of the card" in text
    fix = text.split("to fit: ")[1].split()[:2]
    assert fix[0] == "--set" and fix[1].startswith("rollout.generation_token_budget=")
    again = runner.invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4", *fix])
    assert "to fit: --set" not in again.output and "fits in 90% of the card" in " ".join(again.output.split())
    # the 7B update at 16k on peft-4bit needs 13.2 GB by the estimate, within 90% of a T4's 15; at 18k it does not
    assert "13.2 GB: fits" in text and "to fit: a smaller rollout.max_context_tokens" not in text
    longer = runner.invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4", "--set",
                                  "rollout.max_context_tokens=18432"])
    longer_text = " ".join(longer.output.split())
    assert "14.2 GB: does not fit" in longer_text and "to fit: a smaller rollout.max_context_tokens" in longer_text
    assert "h a step" in text and "estimated" in text
    unknown = runner.invoke(main, ["recipe", "--card", "t4"])  # the default policy: a GGUF of no known shape
    assert unknown.exit_code == 2 and "--card: the shape of policy.model" in unknown.output


# ---- the paged engine (rollout.backend: paged): transformers' continuous batching on SDPA ----------------------

def _paper():
    recipe = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    return recipe, KNOWN_SHAPES[recipe.policy.model]


def _paged(recipe):
    return recipe.model_copy(update={"rollout": recipe.rollout.model_copy(update={"backend": "paged"})})


def test_the_paged_constants_mirror_the_engines():
    """core imports no engine, so plan.py copies two of its constants; read from its source (importing it needs
    torch)."""
    source = (ROOT / "seal_lite" / "engines" / "paged_rollouts.py").read_text()
    constants = {node.targets[0].id: node.value.value for node in ast.parse(source).body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)}
    assert (constants["BLOCK_SIZE"], constants["PREFILL_TOKENS"]) == (plan.PAGED_BLOCK_SIZE, plan.PAGED_PREFILL_TOKENS)


def test_the_paged_cost_arithmetic_against_hand_computed_figures():
    """The toy on a card of 1 FLOP/s and 1 byte/s at full efficiency. 4 episodes of 2 tasks (G = 2) of 20 tokens,
    mean width 15; a pool of 45 tokens holds 2 contexts of 20, so 2 rows, 30 keys a pass. Prefill: the 2 openings,
    then per episode its 6 environment tokens and half a 32-token block at each of its 2 messages, every token's
    projections (2 x 288) and attention to the 30 keys (4 x 2 layers x 2 heads x 2 dims = 32 FLOPs a key). A
    decode step moves the weights and, per key, its 16 bytes of keys and values 3 + 2 x 2 times (read from the
    pool, written gathered, read by repeat_kv, written for each of the 2 heads and read so by SDPA): 229 + 30 x 112
    = 3,589 bytes, more than its 2 x (576 + 32 x 30) = 3,072 FLOPs."""
    card = plan.Card("toy", 1, 1e-12, 1e-12)
    speed = plan.Speed(prefill_mfu=1, bandwidth_share=1, paged_decode_floor_s=0)
    episode = plan.Episode(opening=10, messages=2, model_tokens=4, env_tokens=6)
    weights = 288 * NF4_BYTES + 80
    cost = plan.paged_rollout_cost(TOY, card, episode, 4, group_size=2, pool_tokens=45, max_context_tokens=20,
                                   rows_cap=8, speed=speed)
    assert cost["rows"] == 2 and cost["prefill_tokens"] == 2 * 10 + 4 * (6 + 2 * 16)
    assert cost["prefill"] == pytest.approx(172 * (2 * 288 + 32 * 30))
    assert weights + 30 * 112 > 2 * (2 * 288 + 32 * 30)
    assert cost["decode"] == pytest.approx(4 * 4 / 2 * (weights + 30 * 112))
    assert plan.paged_rollout_cost(TOY, card, episode, 4, 2, 45, 20, rows_cap=1, speed=speed)["rows"] == 1
    assert plan.paged_rollout_cost(TOY, card, episode, 4, 2, 10, 20, 8, speed)["rows"] == 1  # under one context: 1
    # the engine lets live what its pool holds at the full context, not at the episodes' length: 45 // 40 = 1
    assert plan.paged_rollout_cost(TOY, card, episode, 4, 2, 45, 40, 8, speed)["rows"] == 1
    floored = plan.paged_rollout_cost(TOY, card, episode, 4, 2, 45, 20, 8, plan.Speed(paged_decode_floor_s=1e9))
    assert floored["decode"] == 8 * 1e9


def test_a_paged_decode_step_moves_each_key_19_times_for_qwen25_3b():
    """Qwen2.5-3B's 16 attention heads share 2 KV heads, so SDPA's copy for every head is 8 of the key's 36,864
    bytes (36 layers x K, V x 2 heads x 128 x 2 bytes); with the gather, 3 + 2 x 8 = 19 of them a step. On a card
    of 1 byte/s (and FLOPs for free), one row of mean width 1,500 decodes 100 tokens in 100 such steps."""
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-3B-Instruct"]
    card = plan.Card("bytes", 1, 1e12, 1e-12)
    speed = plan.Speed(bandwidth_share=1, paged_decode_floor_s=0)
    episode = plan.Episode(opening=1000, messages=1, model_tokens=100, env_tokens=900)
    cost = plan.paged_rollout_cost(shape, card, episode, 1, 1, 16384, 16384, 1, speed)
    assert cost["decode"] == pytest.approx(100 * (plan.weight_bytes(shape) + 1500 * 19 * 36864))


def test_the_paged_engine_lets_live_what_its_pool_holds_at_the_full_context():
    """colab-t4 on a T4: a pool of 194,379 tokens holds 11 contexts of 16,384, fewer than the 32 episodes its
    generation batch allows (more would be evicted and prefilled again); the card plan prices those 11 rows and
    says so. A cap below the pool's count decides, and a pool under one context still plays one."""
    assert paged_live_rows(194_379, 16_384, 32) == 11
    assert paged_live_rows(194_379, 16_384, None) == 11 and paged_live_rows(194_379, 16_384, 8) == 8
    assert paged_live_rows(10_000, 16_384, 32) == 1
    recipe = load_recipe(ROOT / "recipes" / "colab-t4.yaml")
    shape, card = KNOWN_SHAPES[recipe.policy.model], CARD["t4"]
    planned = plan.card_plan(recipe, shape, card)
    assert (planned["pool_tokens"], planned["live_rows"]) == (194_379, 11)
    episode = plan.episode_cases(recipe.rollout, plan.Speed())["like the ground truth"][0]
    priced = plan.paged_rollout_cost(shape, card, episode, 32, 8, planned["pool_tokens"],
                                     recipe.rollout.max_context_tokens, recipe.generation_batch(), plan.Speed())
    assert priced["rows"] == 11  # not 194,379 // 8,374 = 23 episodes of the ground truth's mean length


def test_the_paged_engines_decode_step_grows_with_the_square_of_its_rows():
    """Where FLOPs bind (a card of endless bandwidth), SDPA's R x (R x W) query-key pairs make a step of 2R rows
    cost more than two of R, so a generated token costs more the more rows share a step (vLLM's costs less)."""
    card = plan.Card("compute-bound", 1, 1e-12, 1e12)
    speed = plan.Speed(prefill_mfu=1, paged_decode_floor_s=0, vllm_decode_floor_s=0)
    episode = plan.Episode(opening=1000, messages=2, model_tokens=100, env_tokens=100)
    tokens = 64 * episode.model_tokens

    def paged_step(rows):  # a pool for all 64 episodes: the rows cap decides
        return plan.paged_rollout_cost(TOY, card, episode, 64, 8, 10**6, 1200, rows, speed)["decode"] * rows / tokens

    def vllm_step(rows):  # a cache of ``rows`` whole episodes
        return plan.vllm_rollout_cost(TOY, card, episode, 64, 8, rows * 1200, speed)["decode"] * rows / tokens

    assert paged_step(16) > 2 * paged_step(8) and paged_step(32) > 2 * paged_step(16)
    assert paged_step(32) / 32 > paged_step(8) / 8  # per token: more rows, dearer
    assert vllm_step(32) / 32 < vllm_step(8) / 8


def test_the_paged_engine_reads_each_groups_opening_once():
    """On the paper recipe's step, like the ground truth: generate re-reads each episode's whole context at every
    message, the paged engine each task's opening once for its group, then what the environment appends and half
    a block a message."""
    recipe, shape = _paper()
    card, speed = CARD["a100-80gb"], plan.Speed()
    episode, decode_steps = plan.episode_cases(recipe.rollout, speed)["like the ground truth"]
    trajectories, group = recipe.grpo.tasks_per_step * recipe.rollout.num_generations, recipe.rollout.num_generations
    pool = plan.card_paged(recipe, shape, card)
    context = recipe.rollout.max_context_tokens
    paged = plan.paged_rollout_cost(shape, card, episode, trajectories, group, pool, context, recipe.generation_batch(),
                                    speed)
    generate = plan.rollout_cost(shape, card, episode, trajectories, recipe.generation_batch(),
                                 plan.card_budget(recipe, shape, card), recipe.rollout.max_new_tokens, decode_steps,
                                 speed)
    assert paged["prefill_tokens"] < generate["prefill_tokens"] / 10 and paged["prefill"] < generate["prefill"]
    alone = plan.paged_rollout_cost(shape, card, episode, trajectories, 1, pool, context, recipe.generation_batch(),
                                    speed)
    assert alone["prefill_tokens"] - paged["prefill_tokens"] == pytest.approx((trajectories - 32) * episode.opening)


def test_the_paged_pool_fits_a_3b_on_a_t4_and_grows_with_the_card():
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-3B-Instruct"]
    on_t4, on_4090 = (plan.card_paged(recipe, shape, CARD[key]) for key in ("t4", "rtx-4090"))
    assert recipe.rollout.max_context_tokens + plan.PAGED_PREFILL_TOKENS < on_t4 < on_4090


def test_a_run_on_the_paged_engine_costs_its_own_rollouts_and_the_same_update():
    recipe, shape = _paper()
    speed = plan.Speed()
    episode, decode_steps = plan.episode_cases(recipe.rollout, speed)["like the ground truth"]
    runs = {engine: plan.run_cost(recipe, shape, CARD["t4"], episode, speed, decode_steps, engine)
            for engine in ("generate", "paged")}
    assert runs["paged"]["hours"] != pytest.approx(runs["generate"]["hours"], rel=0.01)
    assert runs["paged"]["update"] == runs["generate"]["update"] and "rows" not in runs["paged"]
    evaluated = plan.evaluation_cost(recipe, shape, CARD["t4"], episode, speed, decode_steps, engine="paged")
    assert evaluated["prefill_tokens"] == pytest.approx(400 * (episode.length() - episode.model_tokens
                                                               + episode.messages * plan.PAGED_BLOCK_SIZE / 2))
    with pytest.raises(ValueError, match="'pagd'.*generate, vllm, paged"):
        plan.run_cost(recipe, shape, CARD["t4"], episode, speed, decode_steps, "pagd")


def test_the_card_plan_prices_paged_rollouts_when_the_recipe_names_them():
    recipe, shape = _paper()
    generate, paged = (plan.card_plan(r, shape, CARD["t4"]) for r in (recipe, _paged(recipe)))
    assert (generate["rollouts"], paged["rollouts"]) == ("generate", "paged")
    assert paged["pool_tokens"] == plan.card_paged(recipe, shape, CARD["t4"]) and paged["pool_fits"]
    assert paged["call_gb"] == generate["call_gb"] and paged["update_gb"] == generate["update_gb"]
    held_out = plan.episode_cases(recipe.rollout, plan.Speed(), "eval")
    for case, (episode, decode_steps) in plan.episode_cases(recipe.rollout, plan.Speed()).items():
        run = plan.run_cost(recipe, shape, CARD["t4"], episode, plan.Speed(), decode_steps, "paged", held_out[case][0])
        assert paged["hours"][case]["run"] == pytest.approx(run["hours"]) != generate["hours"][case]["run"]
    wide = _paged(recipe).model_copy(update={"rollout": _paged(recipe).rollout.model_copy(
        update={"max_context_tokens": paged["pool_tokens"]})})
    assert not plan.card_plan(wide, shape, CARD["t4"])["pool_fits"]  # no room for a forward pass beside a context


def test_the_card_option_says_paged_and_its_pool():
    result = CliRunner().invoke(main, ["recipe", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--card", "t4", "--set",
                                       "rollout.backend=paged"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "paged rollouts" in text and "rollouts paged: a KV pool of" in text and "widest generate call" not in text
    assert "to fit: --set" not in text  # the budget a generate call needs is no concern of the paged engine


def test_a_run_costs_its_validations_as_greedy_evaluations_of_the_slice():
    recipe, shape = _paper()  # validation every 10 of 72 steps, before the first and after the last: 9 of 400 tasks
    unvalidated = recipe.model_copy(update={"validation": recipe.validation.model_copy(update={"every": None})})
    speed = plan.Speed()
    (episode, decode_steps), (held_out, _) = (plan.episode_cases(recipe.rollout, speed, split)["like the ground truth"]
                                             for split in ("train", "eval"))
    for engine in plan.ENGINES:
        validated, plain = (plan.run_cost(r, shape, CARD["rtx-4090"], episode, speed, decode_steps, engine, held_out)
                            for r in (recipe, unvalidated))
        one = plan.evaluation_cost(recipe, shape, CARD["rtx-4090"], held_out, speed, decode_steps, 400, engine)
        assert (validated["validations"], plain["validations"], plain["validation"]) == (9, 0, 0)
        assert validated["hours"] - plain["hours"] == pytest.approx(9 * one["hours"]) and one["hours"] > 0


def test_the_hold_share_mirrors_the_trainers():
    """plan.py copies shared_prefix.py's share of the free memory that kept suffix graphs may take."""
    source = (ROOT / "seal_lite" / "training" / "shared_prefix.py").read_text()
    constants = {node.targets[0].id: node.value.value for node in ast.parse(source).body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)}
    assert constants["HOLD_SHARE"] == plan.HOLD_SHARE


def test_suffixes_are_kept_where_a_groups_fit_in_half_the_free_memory():
    """gpu-24gb on a 24 GB card: a group of 8 suffixes like the ground truth's (3,428 tokens) holds 8 x 28 layers x
    3,428 x 3,584 x 2 bytes = 5.5 GB, within half of what the 4-bit policy leaves (about 8.8 GB); the whole budget's
    (11,438 tokens, 18.3 GB) is not, and the card plan says so and counts the kept graphs in the update's peak.
    With gradient checkpointing off nothing is kept."""
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    shape, card = KNOWN_SHAPES[recipe.policy.model], CARD["rtx-4090"]
    cases = plan.episode_cases(recipe.rollout, plan.Speed())
    truth, budget = cases["like the ground truth"][0], cases["whole budget"][0]
    suffix = truth.length() - truth.opening
    assert plan.kept_suffix_bytes(recipe, shape, truth, 16384) == pytest.approx(8 * 28 * suffix * 3584 * 2)
    assert plan.suffixes_kept(recipe, shape, card, truth, 16384)
    assert not plan.suffixes_kept(recipe, shape, card, budget, 16384)
    assert not plan.suffixes_kept(recipe, shape, CARD["t4"], truth, 16384)  # 15 GB: 4.2 GB free for them
    unchecked = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"gradient_checkpointing": False})})
    assert not plan.suffixes_kept(unchecked, shape, card, truth, 16384)
    planned = plan.card_plan(recipe, shape, card)
    assert planned["shared_prefix"] and [h["suffixes_kept"] for h in planned["hours"].values()] == [True, False]
    peak = (plan.update_peak_bytes(shape, 16384, 2, 16, shared=True, opening=budget.opening)
            + plan.kept_graph_bytes(recipe, shape, truth, 16384))
    assert planned["update_gb"] * GIB == pytest.approx(peak) and planned["update_fits"]


def test_kept_suffixes_also_hold_their_masks_and_final_norms():
    """Beside its layers' inputs, each of gpu-24gb's 8 kept suffixes (3,428 tokens of an 8,374-token trajectory like
    the ground truth's) holds its bool mask against the opening and itself (a byte a query-key pair) and the final
    RMSNorm's fp32 input and 16-bit output (6 bytes a hidden unit): 8 x 3,428 x (8,374 + 6 x 3,584) bytes, 0.8 GB."""
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    shape = KNOWN_SHAPES[recipe.policy.model]
    truth = plan.episode_cases(recipe.rollout, plan.Speed())["like the ground truth"][0]
    suffix = truth.length() - truth.opening
    extra = plan.kept_graph_bytes(recipe, shape, truth, 16384) - plan.kept_suffix_bytes(recipe, shape, truth, 16384)
    assert extra == pytest.approx(8 * suffix * (truth.length() + 6 * 3584))
