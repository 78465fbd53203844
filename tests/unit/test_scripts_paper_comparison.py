"""scripts/paper_comparison.py: the paper-scale comparison's cost arithmetic against hand-computed figures, its paired
arms, the base model's settings, its refusal without a GPU, and its summary of records."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seal_lite.core import plan
from seal_lite.core.memory import KNOWN_SHAPES, NF4_BYTES, Shape
from seal_lite.core.recipe import load_recipe
from tests.helpers import load_script

ROOT = Path(__file__).parents[2]
TOY = Shape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10, tied_embeddings=True)


def _script():
    return load_script("paper_comparison")


def test_the_cost_arithmetic_against_hand_computed_figures():
    """A toy model on a card of 1 FLOP/s and 1 byte/s at full efficiency: every term of prefill, decode and update
    worked out by hand. The toy's projections hold 2 x (4 x 2 x (2 x 2 + 2 x 1) + 3 x 4 x 8) = 288 weights, so a
    forward over W tokens is 576 W + 16 W^2 FLOPs (attention: 2 x 2 layers x 2 heads x 2 dims)."""
    card = plan.Card("toy", 1, 1e-12, 1e-12)
    speed = plan.Speed(prefill_mfu=1, update_mfu=1, bandwidth_share=1, decode_floor_s=0, longest_message=4)
    assert TOY.linear_params() == 288
    assert plan.forward_flops(TOY, 10) == 7360 and plan.forward_flops(TOY, 15) == 12240
    assert plan.kv_bytes(TOY) == 16  # 2 layers x (k, v) x 1 head x 2 dims x 2 bytes
    assert plan.weight_bytes(TOY) == pytest.approx(288 * NF4_BYTES + 80)  # NF4 projections, 16-bit LM head

    episode = plan.Episode(opening=10, messages=2, model_tokens=4, env_tokens=6)
    assert episode.rounds() == [(1.0, 10.0), (1.0, 15.0)] and episode.length() == 20
    assert plan.Episode(10, 1.5, 3, 3).rounds() == [(1.0, 10.0), (0.5, 14.0)]  # half the episodes play a 2nd round

    # 3 episodes, calls of at most 2 rows: 2 calls a round, 4 decode steps each, a step reads weights + 2 rows' cache
    cost = plan.rollout_cost(TOY, card, episode, 3, rows_cap=2, budget=None, new_tokens=5, decode_steps=4,
                               speed=speed)
    weights = 288 * NF4_BYTES + 80
    assert cost["prefill_tokens"] == 75 and cost["prefill"] == pytest.approx(3 * (7360 + 12240))
    assert cost["decode"] == pytest.approx(2 * 4 * (weights + 2 * 12 * 16) + 2 * 4 * (weights + 2 * 17 * 16))
    # a budget of 30 padded tokens: 2 rows of 10 + 5 fit, 1 row of 15 + 5, so the second round takes 3 calls
    cut = plan.rollout_cost(TOY, card, episode, 3, rows_cap=2, budget=30, new_tokens=5, decode_steps=4, speed=speed)
    assert cut["decode"] == pytest.approx(2 * 4 * (weights + 2 * 12 * 16) + 3 * 4 * (weights + 17 * 16))
    floored = plan.rollout_cost(TOY, card, episode, 3, 2, None, 5, 4, plan.Speed(decode_floor_s=1e9))
    assert floored["decode"] == 4 * 4 * 1e9  # 4 calls x 4 steps, each at the floor

    # the update: 3 trajectories of 20 tokens, 4 passes, the LM head over the 10 completion tokens in 3 of them
    update = plan.update_cost(TOY, card, episode, 3, context=100, passes=4, speed=speed)
    assert update["trained_tokens"] == 60
    assert update["update"] == pytest.approx(3 * (4 * (576 * 20 + 16 * 400) + 2 * 10 * 4 * 10 * 3))
    assert plan.update_cost(TOY, card, episode, 1, context=12, passes=4, speed=speed)["trained_tokens"] == 12
    # without checkpointing: 3 passes (reference, forward, backward), the LM head in each
    plain = plan.update_cost(TOY, card, episode, 3, context=100, passes=3, speed=speed, recompute=False)
    assert plain["update"] == pytest.approx(3 * (3 * (576 * 20 + 16 * 400) + 2 * 10 * 4 * 10 * 3))



def test_the_shared_prefix_updates_cost_against_hand_computed_figures():
    """A group of G = 2 toy trajectories (opening 10, completion 10 of which 4 model tokens), 4 passes of which 1
    recomputes: the opening once a pass (576 x 10 + 16 x 100 = 7360); each completion in every pass against the
    opening (576 x 10 + 16 x (100 + 2 x 10 x 10) = 10560) with the LM head on its 4 model tokens (2 x 10 x 4 x 4 =
    320), plus the suffix's own recompute unless its graph is kept. Against one pass per trajectory: 2 x (4 x 17920
    + 80 x 10 x 3)."""
    card = plan.Card("toy", 1, 1e-12, 1e-12)
    speed = plan.Speed(update_mfu=1)
    episode = plan.Episode(opening=10, messages=2, model_tokens=4, env_tokens=6)
    assert plan.suffix_flops(TOY, 10, 10) == 10560 and plan.suffix_flops(TOY, 20, 0) == plan.forward_flops(TOY, 20)
    whole = plan.update_cost(TOY, card, episode, 2, context=100, passes=4, speed=speed)
    recomputed = plan.update_cost(TOY, card, episode, 2, context=100, passes=4, speed=speed, group=2)
    kept = plan.update_cost(TOY, card, episode, 2, context=100, passes=4, speed=speed, group=2, kept=True)
    assert whole["update"] == pytest.approx(2 * (4 * 17920 + 80 * 10 * 3)) and whole["read_tokens"] == 40
    assert recomputed["update"] == pytest.approx(4 * 7360 + 2 * 5 * (10560 + 320))
    assert kept["update"] == pytest.approx(4 * 7360 + 2 * 4 * (10560 + 320))
    assert recomputed["read_tokens"] == kept["read_tokens"] == 30 and kept["trained_tokens"] == 40
    # two PPO epochs: the suffix is recomputed in each
    epochs = plan.update_cost(TOY, card, episode, 2, context=100, passes=7, speed=speed, recompute=2, group=2,
                              epochs=2)
    assert epochs["update"] == pytest.approx(7 * 7360 + 2 * 9 * (10560 + 320))


def test_the_paper_recipe_on_peft_4bit_reads_each_groups_opening_once_and_halves_the_update():
    """The shipped paper recipe shares the prefix (peft-4bit); on Unsloth (or auto, which picks it on a GPU) the plan
    prices one trajectory a pass. At the paper's shapes on a 24 GB card the shared update keeps its suffixes and
    takes about half the time."""
    recipe = load_recipe(ROOT / "recipes" / "paper-qwen2.5-7b.yaml")
    unsloth = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"backend": "unsloth"})})
    auto = recipe.model_copy(update={"policy": recipe.policy.model_copy(update={"backend": "auto"})})
    off = recipe.model_copy(update={"grpo": recipe.grpo.model_copy(update={"shared_prefix": False})})
    assert plan.shares_prefix(recipe) and plan.update_group(recipe) == 8
    assert not any(plan.shares_prefix(r) for r in (unsloth, auto, off)) and plan.update_group(unsloth) == 1
    shape, card = KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], next(c for c in plan.CARDS if c.memory_gb == 24)
    episode, steps = plan.episode_cases(recipe.rollout, plan.Speed())["like the ground truth"]
    shared, whole = (plan.run_cost(r, shape, card, episode, plan.Speed(), steps, "vllm") for r in (recipe, unsloth))
    assert plan.suffixes_kept(recipe, shape, card, episode, plan.trained_length(recipe.rollout, episode))
    assert 1.8 < whole["update"] / shared["update"] < 2.2
    assert shared["read_tokens"] / whole["read_tokens"] == pytest.approx(
        (episode.opening + 8 * (episode.length() - episode.opening)) / (8 * episode.length()))

def test_the_vllm_cost_arithmetic_against_hand_computed_figures():
    """vLLM's rollouts on the toy card: each task's opening read once for its group, then only the environment's
    tokens, attending to the episode's mean width; decode in continuous batches of as many episodes as the cache
    holds at their full length."""
    card = plan.Card("toy", 1, 1e-12, 1e-12)
    speed = plan.Speed(prefill_mfu=1, bandwidth_share=1, vllm_decode_floor_s=0)
    episode = plan.Episode(opening=10, messages=2, model_tokens=4, env_tokens=6)  # 20 tokens, mean width 15
    weights = 288 * NF4_BYTES + 80
    # 4 episodes of 2 tasks (G = 2); a cache of 45 tokens holds 2 episodes of 20
    cost = plan.vllm_rollout_cost(TOY, card, episode, 4, group_size=2, cache_tokens=45, speed=speed)
    attention = 4 * 2 * 2 * 2  # 4 x layers x heads x head_dim
    assert cost["prefill_tokens"] == 2 * 10 + 4 * 6
    assert cost["prefill"] == pytest.approx(2 * 7360 + 4 * 6 * (2 * 288 + attention * 15))
    assert cost["rows"] == 2
    assert cost["decode"] == pytest.approx(4 * 4 / 2 * (weights + 2 * 15 * 16))  # 16 tokens, 2 a step
    assert plan.vllm_rollout_cost(TOY, card, episode, 4, 2, 10, speed)["rows"] == 1  # less than one episode: 1
    floored = plan.vllm_rollout_cost(TOY, card, episode, 4, 2, 45, plan.Speed(vllm_decode_floor_s=1e9))
    assert floored["decode"] == 8 * 1e9


def test_the_plan_for_the_paper_recipe():
    """The paper recipe's figures: 72 steps of 32 tasks x 8, 5 passes a trained token (forward, backward,
    recompute, the reference's, and TRL's old log-probs, which 4 mini-batches a step need), each card's generate
    budget as docs/gpu.md's table gives it, the episodes, and the total of 2 arms x N seeds runs plus 2N + 1
    evaluations."""
    script = _script()
    recipe = load_recipe(ROOT / script.ARMS["seal"])

    def grpo(**fields):
        return recipe.model_copy(update={"grpo": recipe.grpo.model_copy(update=fields)})

    assert plan.update_passes(recipe) == 5
    assert plan.update_passes(grpo(beta=0.0)) == 4
    assert plan.update_passes(grpo(mini_batches=1)) == 4  # one optimizer step a step: TRL scores no old log-probs
    assert plan.update_passes(grpo(mini_batches=1, num_iterations=2)) == 2 * 3 + 1 + 1  # each epoch's 3; once 2
    assert plan.recompute_passes(grpo(num_iterations=2)) == 2
    from seal_lite.core.memory import KNOWN_SHAPES

    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    budgets = {card.memory_gb: plan.card_budget(recipe, shape, card) for card in plan.CARDS}
    assert budgets == {80: 212_992, 48: 131_072, 24: 49_152, 15: 16_384}  # the smaller engine's, 4096 new tokens
    assert recipe.rollout.generation_token_budget == budgets[80]

    bound = plan.budget_episode(recipe.rollout, 4946)  # budget release: no cap on model tokens, the context's
    assert (bound.messages, bound.model_tokens, bound.env_tokens, bound.length()) == (20, 16384 - 4946, 0, 16384)
    assert plan.trained_length(recipe.rollout, bound) == 4946 + 4096  # the update: the prompt and 4096 after it
    expected = plan.ground_truth_episode(plan.MEASURED_EPISODES["train"])
    assert expected.messages == pytest.approx(5.71 + 4.16)
    assert expected.model_tokens == pytest.approx(226.6 + 40 * 4.16)
    assert expected.env_tokens == pytest.approx(191.6 + 2843.6)

    design = script.plan(3, [])
    a100 = design["cards"][0]
    assert a100["card"].name == "A100 80GB" and a100["rows"] == 13
    for case in a100["cases"].values():
        run, evaluated = case["run"], case["evaluation"]
        assert run["steps"] == 72 and run["trajectories"] == 72 * 32 * 8
        assert case["total"] == pytest.approx(6 * run["hours"] + 7 * evaluated["hours"])
        assert run["hours"] == pytest.approx((run["prefill"] + run["decode"] + run["update"] + run["validation"]) / 3600)
        assert run["validation"] == pytest.approx(9 * 3600 * evaluated["hours"])  # 9 validations of the 400 tasks
    assert a100["cases"]["whole budget"]["total"] > a100["cases"]["like the ground truth"]["total"]
    # vLLM where auto picks it (Ampere or newer), its share the memory model's, the update the same as generate's
    from seal_lite.core.memory import GIB, vllm_cache_tokens, vllm_share

    share = vllm_share(shape, 80 * GIB, 2, True, recipe.policy.lora_r)
    assert (a100["vllm_memory"], a100["vllm_cache_tokens"]) == (
        share, vllm_cache_tokens(shape, 80 * GIB, share, 2, True, recipe.policy.lora_r))
    with_vllm = a100["cases"]["like the ground truth, vllm"]["run"]
    assert with_vllm["update"] == a100["cases"]["like the ground truth"]["run"]["update"]
    assert with_vllm["prefill_tokens"] < a100["cases"]["like the ground truth"]["run"]["prefill_tokens"] / 10
    assert not any("vllm" in case for case in design["cards"][-1]["cases"])  # the T4
    # the paged engine on every card, the T4 included, its pool the memory model's, the update generate's too
    for row in design["cards"]:
        assert row["paged_pool_tokens"] == plan.card_paged(recipe, shape, row["card"]) > 0
        paged, generate = (row["cases"][f"like the ground truth{engine}"]["run"] for engine in (", paged", ""))
        assert paged["update"] == generate["update"] and paged["prefill_tokens"] < generate["prefill_tokens"] / 10
    h100 = design["cards"][1]["cases"]["like the ground truth"]["run"]
    assert h100["prefill"] == pytest.approx(a100["cases"]["like the ground truth"]["run"]["prefill"] * 312 / 989)

    assert script.task_part(400) == pytest.approx(100 * math.sqrt(0.355 * 0.645 / 400))
    for row in design["power"]:
        assert row["pair_sd"] == pytest.approx(row["seed_sd"] * math.sqrt(2 * (1 - row["correlation"])))
        assert row["power"] is None  # 3 pairs: no exact test reaches 0.05
        assert row["half_width"] == pytest.approx(1.96 * row["pair_sd"] / math.sqrt(3))
    detectable = [row["detectable"] for row in design["power"]]
    assert all(row[6] >= row[8] >= row[10] for row in detectable)  # more pairs, smaller effects


def test_the_plan_prints_cost_and_power_and_says_what_three_seeds_cannot_do(capsys):
    script = _script()
    design = script.plan(3, [])
    script.print_plan(design)
    text = capsys.readouterr().out
    assert "ESTIMATED GPU hours" in text and "assumptions" in text and "| A100 80GB (80 GB) | 212,992 (13) |" in text
    assert "2/8 = 0.25, so it can never reach 0.05" in text and "6 pairs is the fewest" in text
    assert "+9.5" in text and "72 steps x 32 tasks x G = 8 = 18,432 episodes" in text
    assert "| T4 (15 GB) | generate only: older than Ampere |" in text and "| rollout.vllm_memory (KV tokens) |" in text
    paged = text.split("With paged rollouts")[1]
    assert "| KV pool tokens (episodes of 16k) |" in paged and "a paged step at least 30 ms" in paged
    t4_pool = design["cards"][-1]["paged_pool_tokens"]
    assert "SDPA without flash attention" in paged and f"| T4 (15 GB) | {t4_pool:,} ({t4_pool // 16384}) |" in paged
    assert "copied to every attention head" in paged and "(17 times their bytes, counted)" in paged  # 3 + 2 x 28 / 4
    assert "which generate's estimate does not yet count" in paged
    # the update's peak: the one `seal-lite recipe --card` prints, the whole-budget episode's opening given
    from seal_lite.core.memory import GIB

    recipe, shape = design["recipe"], KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    assert design["update_gb"] * GIB == plan.update_peak_bytes(shape, 16384, 2, recipe.policy.lora_r, True,
                                                               plan.MEASURED_EPISODES["train"]["opening"])
    for row in design["cards"]:
        memory = plan.card_memory(recipe, shape, row["card"])
        assert row["update_gb"] == memory["update_gb"]
        assert ("update tight" in text.split(f"| {row['card'].name} (")[1].split("|")[0]) != memory["update_fits"]
    assert f"the update's estimated peak is {design['update_gb']:.1f} GB" in text


def test_the_measured_episodes_count_the_datas_calls_and_turns():
    """The tokenizer-free half of MEASURED_EPISODES (``--episodes`` measures the tokens) is the BFCL data's."""
    from seal_lite.envs.bfcl import load_tasks, split_ids

    for split in ("train", "eval"):
        tasks = load_tasks(split_ids(split))
        assert len(tasks) == 400
        calls = sum(len(calls) for task in tasks for calls in task.ground_truth) / len(tasks)
        assert plan.MEASURED_EPISODES[split]["calls"] == pytest.approx(calls, abs=0.01)
        assert plan.MEASURED_EPISODES[split]["turns"] == pytest.approx(sum(len(t.turns) for t in tasks) / 400,
                                                                         abs=0.01)


@pytest.mark.parametrize("overrides", [[], ["rollout.temperature=0.7"], "smoke"])
def test_both_arms_share_each_seed_and_differ_exactly_in_the_ablations_fields(overrides):
    from seal_lite.api import parse_overrides
    from seal_lite.runs.run_dir import recipe_differences

    script = _script()
    overrides = script.SMOKE if overrides == "smoke" else overrides
    for seed in (0, 4):
        seal, vanilla = (load_recipe(ROOT / script.ARMS[arm], parse_overrides(tuple(script.arm_settings(seed, overrides))))
                         for arm in ("seal", "vanilla"))
        assert seal.seed == vanilla.seed == seed
        assert sorted(recipe_differences(seal.model_dump(), vanilla.model_dump())) == [
            "grpo.closed_loop", "grpo.diagnosis_weighting", "interface.schema_cues", "name"]
        assert seal.interface.schema_cues and seal.grpo.diagnosis_weighting and seal.grpo.closed_loop


def test_the_base_model_is_evaluated_with_the_recipes_policy_and_rollout():
    from seal_lite.api import parse_overrides

    script = _script()
    paper = load_recipe(ROOT / script.ARMS["vanilla"])
    settings = script.base_settings([])
    assert not any(setting.startswith("policy.model=") for setting in settings)
    base = load_recipe(None, parse_overrides((*settings, f"policy.model={paper.policy.model}")))
    assert base.policy == paper.policy and base.rollout == paper.rollout


def test_without_a_gpu_it_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "cuda_device", lambda: None)
    monkeypatch.setattr(script, "seal_lite", lambda *args: pytest.fail(f"ran seal-lite {args}"))
    with pytest.raises(SystemExit, match="torch sees no CUDA GPU.*--plan.*--cpu-smoke"):
        script.main(["--out", str(tmp_path / "out"), "--records", str(tmp_path / "records")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "records").exists()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "paper_comparison.py"), "--out",
                           str(tmp_path / "out"), "--records", str(tmp_path / "records")],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "torch sees no CUDA GPU on this machine" in done.stderr and not (tmp_path / "out").exists()


def test_background_starts_the_same_command_detached_after_the_gpu_check(tmp_path, monkeypatch):
    script = _script()
    started = []

    class Child:
        pid = 4242

        def __init__(self, command, **options):
            started.append((command, options))

    monkeypatch.setattr(script.subprocess, "Popen", Child)
    monkeypatch.setattr(script, "cuda_device", lambda: None)
    with pytest.raises(SystemExit):  # refused before anything starts
        script.main(["--background", "--out", str(tmp_path)])
    assert not started
    script.main(["--background", "--cpu-smoke", "--seeds", "1", "--out", str(tmp_path)])
    [(command, options)] = started
    assert command[1:] == [str(ROOT / "scripts" / "paper_comparison.py"), "--cpu-smoke", "--seeds", "1", "--out",
                           str(tmp_path)]
    assert options["start_new_session"] and (tmp_path / "paper-comparison.log").exists()


def _record(scores: dict[str, float], **extra) -> dict:
    return {"training": {"rewards": [0.1, 0.2, 0.3, 0.4], "minutes": 60.0}, "gpu": "H100",
            "held_out": {task: {"accuracy": value, "turn_pass_rate": value} for task, value in scores.items()},
            **extra}


def test_the_summary_pairs_seeds_and_says_when_it_is_interim(tmp_path, capsys):
    """Seeds 0-2 of vanilla and SEAL: SEAL solves one more of the 4 tasks in seeds 0 and 1 and one fewer in seed 2;
    the third pair is added only once both its runs are evaluated."""
    script = _script()
    records = script.Records(tmp_path)
    tasks = ["multi_turn_base_1", "multi_turn_miss_func_1", "multi_turn_miss_param_1", "multi_turn_long_context_1"]
    solved = {"vanilla": (1, 2, 2), "seal": (2, 3, 1)}
    for arm, counts in solved.items():
        for seed, count in enumerate(counts):
            records.put(f"{arm}-seed{seed}", _record({task: float(i < count) for i, task in enumerate(tasks)}))
    records.put("base", {"held_out": {task: {"accuracy": 0.0, "turn_pass_rate": 0.0} for task in tasks}})
    unevaluated = records.get("seal-seed2")
    del unevaluated["held_out"]
    records.put("seal-seed2", unevaluated)

    summary = script.summarize(records, [0, 1, 2])
    result = summary["seal_minus_vanilla"]
    assert result["seeds"] == [0, 1] and result["interim"]
    assert result["differences"] == [0.25, 0.25] and result["seed_p"] == 0.5 and result["smallest_p"] == 0.5
    assert summary["runs"]["seal-seed2"]["held_out"] is None
    assert summary["arms"]["vanilla"]["seeds"] == 3 and summary["arms"]["seal"]["seeds"] == 2
    assert summary["arms"]["vanilla"]["mean"] == pytest.approx(5 / 12)  # 5 of 12 (task, seed) pairs, 1 per category
    assert summary["arms"]["base"]["mean"] == 0.0

    records.put("seal-seed2", _record({task: float(i < 1) for i, task in enumerate(tasks)}))
    result = script.summarize(records, [0, 1, 2])["seal_minus_vanilla"]
    assert not result["interim"] and result["differences"] == [0.25, 0.25, -0.25]
    assert result["mean"] == pytest.approx(1 / 12) and result["smallest_p"] == 0.25
    script.print_summary(script.summarize(records, [0, 1, 2]))
    text = capsys.readouterr().out
    assert "SEAL - vanilla, seeds 0, 1, 2: per seed +25.0, +25.0, -25.0" in text
    assert "no exact test over these seeds reaches p < 0.05" in text and "| seal | 3 |" in text


def test_committed_records_commit_each_record_and_only_it(tmp_path, monkeypatch):
    for variable in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(variable, "test")
    for variable in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(variable, "test@example.com")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "other.txt").write_text("staged, not ours\n")
    subprocess.run(["git", "add", "other.txt"], cwd=tmp_path, check=True)
    script = _script()
    script.CommittedRecords(tmp_path / "records").put("vanilla-seed0", {"seed": 0})
    log = subprocess.run(["git", "log", "--name-only", "--format=%s"], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.split()
    assert log == ["paper", "comparison:", "vanilla-seed0", "recorded", "records/vanilla-seed0.json"]
    assert json.loads((tmp_path / "records" / "vanilla-seed0.json").read_text()) == {"seed": 0}
