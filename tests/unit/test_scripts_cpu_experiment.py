"""scripts/cpu_experiment.py and scripts/cpu_sweep.py: the CPU experiment's arms, its statistics, summary and figure,
its table from the committed records, and the step-size sweep reading a run's store."""

import subprocess
import sys
from pathlib import Path

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.runs.tasks import read_task_file, task_file_path
from tests.helpers import load_script

ROOT = Path(__file__).parents[2]


def _cpu_experiment():
    return load_script("cpu_experiment")


def test_the_cpu_experiment_compares_seal_with_every_seal_part_off():
    """scripts/cpu_experiment.py's arms: SEAL is recipes/cpu-learn.yaml, vanilla GRPO is that recipe with
    exactly the parts recipes/ablation-vanilla-grpo.yaml turns off (and φ_err, φ_cap, which the paper lacks)."""
    from seal_lite.api import parse_overrides
    from seal_lite.runs.run_dir import recipe_differences

    experiment = _cpu_experiment()
    common = parse_overrides(tuple(experiment.COMMON))
    seal = load_recipe(ROOT / experiment.RECIPE, {**common, **parse_overrides(tuple(experiment.ARMS["SEAL"]))})
    vanilla = load_recipe(ROOT / experiment.RECIPE,
                          {**common, **parse_overrides(tuple(experiment.ARMS["vanilla GRPO"]))})
    assert sorted(recipe_differences(seal.model_dump(), vanilla.model_dump())) == [
        "grpo.closed_loop", "grpo.diagnosis_weighting", "interface.capability_hints", "interface.recovery_feedback",
        "interface.schema_cues"]
    assert seal.interface.schema_cues and seal.grpo.diagnosis_weighting and seal.grpo.closed_loop


def test_the_cpu_experiments_intervals_and_summary(tmp_path):
    """The statistics docs/results/cpu-learn.md reports: bootstrap intervals of a mean, quarters of a reward curve, seeds as
    the unit of every comparison of arms (a two-level bootstrap, exact tests over seeds, the minimum detectable
    effect), and the summary and figure drawn from runs and evaluations."""
    experiment = _cpu_experiment()
    low, high = experiment.bootstrap_interval([0.0, 1.0] * 20)
    assert low < 0.5 < high and high - low < 0.4
    wide = experiment.bootstrap_interval([0.0, 1.0] * 3)
    assert wide[1] - wide[0] > high - low  # fewer values, a wider interval
    assert experiment.quarters([0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]) == (0.0, 1.0)
    assert experiment.quarters([0.25]) == (0.25, 0.25)
    with pytest.raises(ValueError, match="different tasks"):
        experiment.per_task_means([{"a": 1.0}, {"b": 1.0}])
    assert experiment.quarter_counts([0.5, 0.25, 0.75, 1.0], [8, 8, 4, 4]) == {"first": [4, 8], "last": [4, 4]}

    # the audit's figures from the committed held-out counts: 2, 6, 4 against 2, 2, 5 solved of 16
    vanilla, seal = ([{f"t{i}": float(i < solved) for i in range(16)} for solved in counts]
                     for counts in ((2, 6, 4), (2, 2, 5)))
    assert experiment.seed_means(vanilla) == [2 / 16, 6 / 16, 4 / 16]
    assert experiment.seed_test([2, 2, 5], [2, 6, 4]) == (pytest.approx(0.7), pytest.approx(0.1))  # 14 of 20 splits
    assert experiment.seed_test([1, 2, 3], [0]) == (0.25, 0.25)  # 3 seeds above a fixed score: 2 of 8 sign flips
    assert experiment.seed_test([1, -1, 2], [0])[0] == 0.75
    assert experiment.minimum_detectable_effect(0.1) == pytest.approx(0.280, abs=0.001)  # 1.96 + 0.84 errors
    both = experiment.two_level_bootstrap(seal, vanilla)
    tasks_only = experiment.bootstrap_interval(
        list(experiment.per_task_means(seal)[t] - experiment.per_task_means(vanilla)[t] for t in seal[0]))
    assert both["low"] < -1 / 16 < both["high"]
    assert both["high"] - both["low"] > tasks_only[1] - tasks_only[0]  # the seeds widen it
    assert both["se"] == pytest.approx((both["high"] - both["low"]) / 3.92, rel=0.15)
    # paired seeds drawn together: b is a shifted by 0.25 on every task of every seed, so the paired difference
    # never varies, while arms resampled apart mix one arm's good seeds with the other's bad ones
    shifted = [{task: value - 0.25 for task, value in run.items()} for run in vanilla]
    together = experiment.two_level_bootstrap(vanilla, shifted, paired=True)
    apart = experiment.two_level_bootstrap(vanilla, shifted)
    assert together["low"] == pytest.approx(0.25) == pytest.approx(together["high"]) and apart["high"] - apart["low"] > 0.1
    one_run = experiment.two_level_bootstrap([{"a": 1.0, "b": 0.0}])  # a single run: tasks alone vary
    assert one_run["low"] == 0.0 and one_run["high"] == 1.0
    difference = experiment.seed_difference(seal, [{task: 0.0 for task in seal[0]}])
    assert difference["floor"] and difference["seeds"] == [3, 1] and difference["seed_p"] == 0.25
    assert not experiment.distinguishable(difference)  # every seed above a floor, yet 3 seeds cannot show it

    tasks = [f"multi_turn_base_{i}" for i in range(30)]
    base = {task: {"accuracy": 0.0, "turn_pass_rate": 0.0} for task in tasks}
    better = [{task: {"accuracy": float((i + seed) % 3 == 0), "turn_pass_rate": 1.0} for i, task in enumerate(tasks)}
              for seed in range(5)]
    runs = {arm: {seed: {"rewards": [0.125 * seed, 0.25, 0.375, 0.5, gain + 0.01 * seed], "trajectories": [8] * 5,
                         "updated": 3, "signal_share": 0.5}
                  for seed in range(5)} for arm, gain in (("vanilla GRPO", 0.375), ("SEAL", 0.625))}
    scores = {"official": {"base": [base], "vanilla GRPO": [base] * 5, "SEAL": better}}
    resampled = {"by_task": {"multi_turn_base_0": 1.0, "multi_turn_base_1": 0.25, "multi_turn_base_2": 0.0,
                             "multi_turn_base_3": 0.25}, "samples": 8, "seed": 100}
    summary = experiment.summarize(tasks[:4], runs, scores, resampled)
    on_training = summary["base_on_training_tasks"]
    assert on_training["mean"] == 0.375 and on_training["low"] < 0.375 < on_training["high"] <= 1.0
    assert summary["training"]["SEAL"]["gain"]["mean"] == pytest.approx(0.625 - 0.115 * 2)
    assert summary["training"]["SEAL"]["seeds"][2]["passed"] == {"first": [2, 8], "last": [5, 8]}
    seal_seed0 = summary["training"]["SEAL"]["seeds"][0]  # 0, 0.25, 0.375, 0.5, 0.625: the one rising order of 120
    assert seal_seed0["trend"]["tau"] == 1.0 and seal_seed0["trend"]["p_rise"] == pytest.approx(1 / 120)
    versus = summary["seal_against_vanilla"]
    assert versus["seeds"] == [0, 1, 2, 3, 4] and versus["first"]["p"] == 1.0  # the same first quarters
    # every SEAL seed's last quarter above every vanilla seed's: only that split and its mirror are as extreme
    assert versus["last"]["p"] == pytest.approx(2 / 252) and versus["last"]["smallest_p"] == pytest.approx(2 / 252)
    arms = summary["held_out"]["official"]["arms"]
    assert arms["SEAL"]["accuracy"]["mean"] == pytest.approx(1 / 3) and arms["base"]["accuracy"]["mean"] == 0
    assert arms["SEAL"]["accuracy"]["per_seed"] == [pytest.approx(1 / 3)] * 5
    difference = summary["held_out"]["official"]["differences"]["SEAL - vanilla GRPO"]["accuracy"]
    assert difference["tasks"] == 30 and difference["seed_p"] == pytest.approx(2 / 252)
    assert experiment.distinguishable(difference)
    assert not experiment.distinguishable(summary["held_out"]["official"]["differences"]["vanilla GRPO - base"]["accuracy"])
    experiment.draw(summary, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
    training_only = experiment.summarize(tasks[:4], runs, {})  # --summary-only before any evaluation
    assert training_only["held_out"] == {} and training_only["training"]["SEAL"]["seeds"][0]["trend"]["tau"] == 1.0
    experiment.draw(training_only, tmp_path / "training.png")
    assert (tmp_path / "training.png").stat().st_size > 10_000


def test_the_cpu_experiment_tabulates_its_committed_records(tmp_path):
    """The experiment's summary comes from the small records committed under --records, not from the stores (which
    a new machine lacks): --summary-only with two runs' records and the base model's gives their table, and the
    frontier is the recipe's named tasks, without a screen."""
    experiment = _cpu_experiment()
    assert experiment.frontier_ids(experiment.RECIPE, tmp_path, experiment.COMMON) == read_task_file(
        task_file_path(load_recipe(ROOT / experiment.RECIPE).data.task_file))
    assert not (tmp_path / "screen").exists()
    held_out = experiment.held_out_ids(2)
    records = experiment.Records(tmp_path / "records")
    for name, arm, solved in (("vanilla-seed0", "vanilla GRPO", 0.0), ("seal-seed0", "SEAL", 1.0)):
        records.put(name, {"arm": arm, "seed": 0, "training": {"rewards": [0.25, 0.5, 0.75, solved],
                                                               "trajectories": [4] * 4, "updated": 4, "minutes": 9.0,
                                                               "signal_share": 0.5},
                           "held_out": {"official": {task: {"accuracy": solved, "turn_pass_rate": solved}
                                                     for task in held_out}}})
    records.put("base", {"resample": {"by_task": {"multi_turn_base_19": 0.5}, "samples": 8, "seed": 100},
                         "held_out": {"official": {task: {"accuracy": 0.0, "turn_pass_rate": 0.5}
                                                   for task in held_out}}})
    done = subprocess.run([sys.executable, "scripts/cpu_experiment.py", "--seeds", "0", "--eval-tasks", "2",
                           "--summary-only", "--records", str(tmp_path / "records"), "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = records.get("summary")
    assert summary["training"]["SEAL"]["seeds"]["0"]["last_quarter"] == 1.0
    assert summary["training"]["vanilla GRPO"]["seeds"]["0"]["last_quarter"] == 0.0
    arms = summary["held_out"]["official"]["arms"]
    assert list(arms) == ["base", "vanilla GRPO", "SEAL"] and arms["SEAL"]["accuracy"]["mean"] == 1.0
    assert arms["base"]["turn_pass_rate"]["mean"] == 0.5
    assert summary["base_on_training_tasks"]["mean"] == 0.5
    assert "| SEAL | 0 | 0.25 0.50 0.75 1.00 | 0.25 | 1.00 | 1 -> 4 of 4 | τ +1.00, p = 0.042 |" in done.stdout
    assert "SEAL against vanilla GRPO, seeds 0, permutation test over seeds: first quarter p = 1" in done.stdout
    assert (tmp_path / "out" / "cpu-experiment.png").stat().st_size > 10_000


def test_the_step_size_sweep_reads_a_runs_store(tmp_path, monkeypatch):
    """scripts/cpu_sweep.py (issue 17's lr and rank sweep) shares the experiment's screen and statistics, and reads
    the reward quarters and the watched metrics of a run's first --steps steps from its store (so the experiment's
    longer SEAL run can stand for the recipe's own step size); a metric never logged shows as missing."""
    from seal_lite.engines.store import Store

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sweep = load_script("cpu_sweep")
    store = Store(tmp_path / "seal.db")
    for step, reward in enumerate([0.0, 0.25, 0.5, 0.75], start=1):
        store.db["steps"].insert({"step": step, "reward_mean": reward}, alter=True)
        store.db["metrics"].insert_all([{"step": step, "name": "grpo/update_skipped", "value": float(step == 1)},
                                        {"step": step, "name": "grpo/entropy", "value": 0.5 + step}], alter=True)
    figures = sweep.run_figures(tmp_path, steps=4)
    assert (figures["first"], figures["last"], figures["steps"], figures["updated"]) == (0.0, 0.75, 4, 3)
    assert figures["grpo/entropy"] == 3.0 and figures["grpo/kl"] is None
    first_two = sweep.run_figures(tmp_path, steps=2)
    assert (first_two["first"], first_two["last"], first_two["steps"], first_two["updated"]) == (0.0, 0.25, 2, 1)
    assert first_two["grpo/entropy"] == 2.0


def test_the_rise_script_records_a_runs_steps_and_its_trend_and_tabulates_records(tmp_path, monkeypatch):
    """scripts/cpu_rise.py (issue 40): a finished run's per-step figures and the trend test with the steps as units,
    read from its store; --summary-only tabulates the committed records without running anything."""
    from seal_lite.core.trend import reward_trend
    from seal_lite.engines.store import Store

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    rise = load_script("cpu_rise")
    store = Store(tmp_path / "run" / "seal.db")
    store.start_run("cpu-learn", {}, "qwen2.5-coder-0.5b")
    rewards = [0.25, 0.5, 0.375, 0.75, 0.875]
    for step, reward in enumerate(rewards, start=1):
        store.db["steps"].insert({"step": step, "reward_mean": reward, "loss": 0.1 * step,
                                  "started_at": 60.0 * step, "finished_at": 60.0 * step + 30}, alter=True)
        store.db["metrics"].insert_all([{"step": step, "name": "sampling/drawn_groups_with_signal", "value": 0.5},
                                        {"step": step, "name": "grpo/lora_change", "value": 0.2 / step}], alter=True)
    store.finish_run("cpu-learn", "finished", 200.0)
    record = rise.record_of(tmp_path / "run", "recipes/cpu-learn.yaml", 3)
    trend = reward_trend(rewards)
    assert record["trend"] == {"tau": trend.tau, "p_rise": trend.p_rise} and record["rewards"] == rewards
    assert record["minutes"] == 2.5 and record["signal"] == [0.5] * 5 and record["lora_change"][1] == 0.1
    assert (record["first_quarter"], record["last_quarter"]) == (0.25, 0.875)
    assert "--set seed=3" in record["command"]

    records = tmp_path / "records"
    rise.Records(records).put("cpu-learn-seed3", record)
    done = subprocess.run([sys.executable, "scripts/cpu_rise.py", "--seeds", "3", "--summary-only", "--records",
                           str(records)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"   3      5      2.5     0.25    0.88  {trend.tau:+.2f}  {trend.p_rise:.2g}" in done.stdout


def test_stopping_an_experiment_stops_the_seal_lite_command_it_waits_on(tmp_path):
    """kill of the script must not leave its seal-lite command writing into the store the next start resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    fake = tmp_path / "seal_lite"  # ``python -m seal_lite`` in ROOT = tmp_path finds this one first
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("import os, pathlib, time\n"
                                      "pathlib.Path('child.pid').write_text(str(os.getpid()))\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                               "from pathlib import Path\nfrom tests.helpers import load_script\n"
                               f"script = load_script('cpu_experiment'); script.ROOT = Path({str(tmp_path)!r})\n"
                               "script.seal_lite('run')\n"], stdout=subprocess.DEVNULL)
    pid_file = tmp_path / "child.pid"
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as stat:  # a killed child of a dead parent may linger as a zombie
            if stat.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the seal-lite command outlived the stopped experiment")
