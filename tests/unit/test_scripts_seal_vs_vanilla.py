"""scripts/seal_vs_vanilla.py: issue 41's pre-registered design (arms, tasks, held-out set, power)."""

import statistics
from pathlib import Path

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.tasks import read_task_file
from tests.helpers import ScriptedGenerator, load_script

ROOT = Path(__file__).parents[2]


def _design():
    return load_script("seal_vs_vanilla")


def test_the_arms_are_the_papers_seal_vanilla_weighting_alone_and_the_placebo():
    """Each arm is the recipe with the common settings and exactly its five method fields; the SEAL arm is the
    paper's (phi_schema, weighting, closed-loop rho; phi_err and phi_cap off); the placebo is vanilla on shuffled
    rewards."""
    from seal_lite.api import parse_overrides

    design = _design()

    def arm(name: str):
        sets = [*design.COMMON, *(f"{key}={value}" for key, value in design.ARMS[name].items())]
        return load_recipe(ROOT / design.RECIPE, parse_overrides(tuple(sets)))

    vanilla, seal, reweight, placebo = arm("vanilla"), arm("seal"), arm("reweight"), arm("placebo")
    assert vanilla.rollout.max_turns == 2 and vanilla.grpo.steps == 12 and vanilla.diagnoser.mode == "off"
    assert not any([vanilla.interface.schema_cues, vanilla.interface.recovery_feedback,
                    vanilla.interface.capability_hints, vanilla.grpo.diagnosis_weighting, vanilla.grpo.closed_loop])
    assert seal.interface.schema_cues and seal.grpo.diagnosis_weighting and seal.grpo.closed_loop
    assert not seal.interface.recovery_feedback and not seal.interface.capability_hints
    assert not reweight.interface.schema_cues and reweight.grpo.diagnosis_weighting and reweight.grpo.closed_loop
    assert placebo.grpo.shuffle_rewards  # vanilla in all else: the pre-registered placebo
    assert placebo.model_copy(update={"grpo": placebo.grpo.model_copy(update={"shuffle_rewards": False})}) == vanilla
    assert not vanilla.grpo.shuffle_rewards and not seal.grpo.shuffle_rewards
    assert list(design.SEEDS) == list(range(8))


def test_the_committed_held_out_set_is_the_designs_and_disjoint_from_training():
    """data/heldout/seal-vs-vanilla.txt is what --design selects: 24 miss_param tasks that decline their first turn
    and 24 base tasks of the eval split, spread over their API class sets; no training candidate is among them."""
    design = _design()
    committed = read_task_file(design.HELD_OUT_FILE)
    assert committed == design.held_out_ids() and len(set(committed)) == 48
    tasks = load_tasks(committed)
    assert sum(design.declines_first(task) for task in tasks) == 24
    assert sum(task.category == "base" for task in tasks) == 24
    assert len({tuple(sorted(task.involved_classes)) for task in tasks[:24]}) >= 12  # spread, not one class
    training = design.candidates("train")
    assert len(training["miss_param"]) == 41 and len(training["base"]) == 100
    assert not set(committed) & {*training["miss_param"], *training["base"]}


def test_stratified_takes_one_task_of_each_class_set_in_turn():
    design = _design()
    ids = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_3", "multi_turn_base_4"]
    by_classes = {}
    for task in load_tasks(ids):
        by_classes.setdefault(tuple(sorted(task.involved_classes)), []).append(task.id)
    chosen = design.stratified(ids, len(by_classes))
    assert {tuple(sorted(task.involved_classes)) for task in load_tasks(chosen)} == set(by_classes)


def test_the_power_of_the_sign_flip_test_over_seeds():
    """5 pairs can never reach p < 0.05 (the smallest p is 2/32); with 8 pairs the power grows with the effect and
    a null effect is rejected about as often as alpha allows."""
    design = _design()
    assert design.sign_flip_power(50, 1, pairs=5) == 0.0
    assert design.sign_flip_power(0, 10, pairs=8) <= 0.06
    assert design.sign_flip_power(5, 10, pairs=8) < design.sign_flip_power(15, 10, pairs=8)
    assert design.detectable(8.5, pairs=8) == pytest.approx(11, abs=1)
    assert design.detectable(8.5, pairs=5) is None


def test_the_frontier_keeps_tasks_solved_sometimes_at_most_eight_of_each_kind():
    design = _design()
    kinds = {"miss_param": [f"m{i}" for i in range(12)], "base": ["b0", "b1", "b2"]}
    rates = {**{f"m{i}": 0.5 for i in range(12)}, "m0": 0.0, "m1": 1.0, "b0": 0.25, "b1": 0.0}
    assert design.choose_frontier(rates, kinds) == [f"m{i}" for i in range(2, 10)] + ["b0"]


def _played(passes: list[int], samples: int = 4, ids=("multi_turn_base_0", "multi_turn_base_1",
                                                      "multi_turn_miss_param_2", "multi_turn_miss_param_3")) -> dict:
    """Held-out plays: task i's samples pass ``passes[i]`` times; first turns abstain when they pass."""
    return {ids[i]: {"greedy": [n > 0, ["pass", "pass"]],
                     "samples": [[j < n, ["correct_abstention" if j < n else "spurious_tool_call", "pass"]]
                                 for j in range(samples)]}
            for i, n in enumerate(passes)}


def test_the_held_out_comparison_is_withheld_until_every_primary_run_is_evaluated(tmp_path):
    """The pre-registration's rule, then its analysis: per seed each arm's score and the paired difference, the
    sign-flip test over the seeds' differences with the two-level bootstrap interval, the spread and correlation
    measured and the effect they let the test detect, the secondary metrics (by category too), and the last
    quarter of the training rewards compared over seeds."""
    design = _design()
    records = design.Records(tmp_path)
    rising, flat = [0.25, 0.5, 0.5, 0.75], [0.25, 0.25, 0.25, 0.25]
    for seed in design.SEEDS:
        for arm in design.PRIMARY:
            record = {"arm": arm, "seed": seed, "training": {
                "rewards": rising if arm == "seal" else flat, "trajectories": [8] * 4, "updated": 4, "minutes": 20.0}}
            if not (arm == "seal" and seed == 7):  # SEAL passes its last task (miss_param) once on odd seeds
                record["held_out"] = _played([4, 2, 0, seed % 2] if arm == "seal" else [3, 2, 0, 0])
            records.put(f"{arm}-seed{seed}", record)
    withheld = design.summarize(records)
    assert withheld["held_out"] == {"withheld": "1 primary runs not yet evaluated"}
    assert withheld["training"]["seal-seed0"]["trend"]["tau"] > 0
    records.put("seal-seed7", {**records.get("seal-seed7"), "held_out": _played([4, 2, 0, 1])})
    held_out = design.summarize(records)["held_out"]
    assert held_out["per_seed"]["seal"] == [pytest.approx((6 + seed % 2) / 16) for seed in design.SEEDS]
    primary, power = held_out["primary"], held_out["power"]
    assert primary["differences"] == [pytest.approx((1 + seed % 2) / 16) for seed in design.SEEDS]
    assert primary["mean"] == pytest.approx(1.5 / 16) and primary["p"] == pytest.approx(2 / 256)
    assert primary["low"] <= primary["mean"] <= primary["high"]
    assert power["pair_sd"] == pytest.approx(0.0334, abs=1e-3) and power["seed_sd"]["vanilla"] == 0
    assert power["correlation"] is None  # vanilla's scores do not vary
    assert power["detectable_points"] == design.detectable(100 * power["pair_sd"], 8)
    seal = held_out["secondary"]["seal"]
    assert seal["greedy"] == pytest.approx(0.625) and seal["no_call"] == 0
    # abstention counts the miss_param tasks' first turns only (the base tasks' abstaining first turns do not count)
    assert seal["abstention"] == pytest.approx(1 / 16) and held_out["secondary"]["vanilla"]["abstention"] == 0
    abstention = held_out["secondary_differences"]["abstention"]
    assert abstention["per_seed"] == [pytest.approx((seed % 2) / 8) for seed in design.SEEDS]
    assert abstention["p"] == pytest.approx(2 / 16)  # four equal positive differences, four zeros
    assert seal["by_category"] == {"base": pytest.approx(0.75), "miss_param": pytest.approx(1 / 16)}
    assert held_out["secondary"]["vanilla"]["by_category"] == {"base": pytest.approx(5 / 8), "miss_param": 0.0}
    last = held_out["training_last_quarter"]
    assert last["per_seed"]["seal"] == [0.75] * 8 and last["mean"] == pytest.approx(0.5) and last["p"] < 0.01


def test_the_summary_prints_the_pre_registered_table(tmp_path, capsys):
    design = _design()
    records = design.Records(tmp_path)
    for seed in design.SEEDS:
        for arm in design.PRIMARY:
            passes = [4, seed % 3, 1, 0] if arm == "seal" else [3, 2, seed % 2, 0]
            records.put(f"{arm}-seed{seed}", {"arm": arm, "seed": seed, "held_out": _played(passes), "training": {
                "rewards": [0.5] * 4, "trajectories": [8] * 4, "updated": 4, "minutes": 20.0}})
    records.put("base", {"held_out": _played([0, 0, 0, 0])})
    design.print_summary(design.summarize(records))
    out = capsys.readouterr().out
    assert "| SEAL - vanilla | " in out and "two-level bootstrap" in out and "paired seeds' correlation" in out
    assert "the test detects" in out and "by category base" in out and "last quarter of the steps" in out
    assert "base model: 0.0% (below 5%" in out and "pre-registered placebo" in out

    for seed in design.SEEDS:  # the placebo arm's runs, once the rule called for them
        records.put(f"placebo-seed{seed}", {"arm": "placebo", "seed": seed, "held_out": _played([1, 0, 0, 0]),
                                            "training": {"rewards": [0.5] * 4, "trajectories": [8] * 4, "updated": 4,
                                                         "minutes": 20.0}})
    summary = design.summarize(records)
    placebo = summary["held_out"]["placebo"]
    assert placebo["per_seed"] == [pytest.approx(1 / 16)] * 8
    assert placebo["vanilla"]["mean"] == pytest.approx(statistics.fmean(summary["held_out"]["per_seed"]["vanilla"]) - 1 / 16)
    assert placebo["seal"]["p"] == pytest.approx(2 / 256)  # SEAL beats the placebo on every seed
    assert placebo["secondary"] == {"greedy": 0.25, "abstention": pytest.approx(0.0), "no_call": 0.0}
    assert placebo["training_quarters"] == [0.5, 0.5]
    passes = summary["held_out"]["passes_by_task"]
    assert passes["placebo"] == {"multi_turn_base_0": 8} and passes["base"] == {}
    assert passes["vanilla"] == {"multi_turn_base_0": 24, "multi_turn_base_1": 16, "multi_turn_miss_param_2": 4}
    assert summary["held_out"]["base_secondary"]["greedy"] == 0
    design.print_summary(summary)
    out = capsys.readouterr().out
    assert "below 5%" not in out and "vanilla - placebo" in out and "seal - placebo" in out
    assert "placebo base_0 8; base none" in out and "placebo: greedy 25.0%" in out


def test_the_placebo_arm_runs_only_when_the_base_model_sits_at_the_floor(tmp_path):
    design = _design()
    records = design.Records(tmp_path)
    assert not design.needs_placebo(records)  # no base model played yet
    records.put("base", {"held_out": _played([1, 0, 0, 0])})  # 1 of 16 samples: 6.25%
    assert not design.needs_placebo(records)
    records.put("base", {"held_out": _played([0, 0, 0, 0])})
    assert design.needs_placebo(records)


def test_a_runs_record_holds_what_seals_parts_did(tmp_path, smol_tokenizer):
    """training_record reads a real store: per step the weights, rho per label, label counts and the interface
    version, beside the reward curve."""
    from seal_lite.core.recipe import Recipe
    from seal_lite.engines.store import Store
    from seal_lite.step.algorithm import SealStep

    design = _design()
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    recipe = Recipe()
    recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn, recipe.diagnoser.mode = 4, 1, "off"
    store = Store(tmp_path / "seal.db")
    step = SealStep(recipe, store, {task.id: task}, None)
    for _ in range(2):  # every episode answers in text
        step.generator = ScriptedGenerator(smol_tokenizer, [["Sure."]] * 4)
        step([task.id])
    record = design.training_record(tmp_path)
    assert record["rewards"] == [0.0, 0.0] and record["labels"] == [{"empty_turn_model_response": 4}] * 2
    assert record["interface_version"] == [1.0, 2.0]  # 4 empty turns >= the quickstart's 3: a guideline
    assert [row["version"] for row in record["interface_versions"]] == [1, 2]
    assert len(record["rho"]["empty_turn_model_response"]) == 2 and len(record["weights"]["mean"]) == 2


def test_a_frontier_too_small_to_draw_a_step_stops_the_experiment_before_any_run(tmp_path):
    """A screen that keeps fewer tasks than a step draws ends the script with the reason, not a crash in a run."""
    design = _design()
    records = design.Records(tmp_path / "records")
    records.put("frontier", {"frontier": ["multi_turn_base_19"], "rates": {"multi_turn_base_19": 0.25}})
    with pytest.raises(SystemExit, match="kept 1 training tasks"):
        design.run(tmp_path / "out", records, list(design.PRIMARY))
    assert not (tmp_path / "out").exists()
