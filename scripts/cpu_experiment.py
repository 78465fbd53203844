"""The CPU experiment of docs/results/cpu-learn.md: base vs vanilla GRPO vs SEAL on Qwen2.5-Coder-0.5B's frontier tasks.

1. The frontier: the tasks the recipe names (``data.task_ids`` or ``data.task_file``, the result of an earlier
   screen), or, if it names none, a screen: ``seal-lite screen RECIPE --out OUT/screen`` plays k samples of every
   candidate training task with the base model and keeps the tasks solved in some but not all samples. Every run
   trains on exactly those tasks, so the arms differ only in method. The screen kept tasks for their pass rates, so the base model's own
   rate on them is measured again, afresh (8 samples a task, another seed, the vanilla arm's plain view): the base
   arm on the training tasks (OUT/base-resample-seed100).
2. Train, per seed: vanilla GRPO (the recipe with SEAL's parts off, as recipes/ablation-vanilla-grpo.yaml turns them
   off) and SEAL (the recipe), at the same rollout budget: the recipe's steps x tasks per step x G, and the same
   dynamic-sampling allowance. Both use the rule labels (diagnoser off), as the paper does.
3. Evaluate every trained run, and the base model, greedily on the same held-out tasks (the first N
   base-category tasks of data/eval_ids.txt), under the official view (BFCL's surface) and, with
   ``--views official,signatures``, under the one-line signatures the recipe trains with (not a BFCL score, and
   marked so).
4. Summarize, with the seeds as the unit of every comparison of arms: the training reward in the first and the
   last quarter of each run's steps and its trend with the steps as units (Kendall's τ, by permutation), per arm
   the mean gain over seeds (95% bootstrap interval over seeds), beside the base model's resampled pass rate on
   the same tasks; SEAL against vanilla GRPO by a permutation test over seeds; held-out strict accuracy and turn
   pass rate per arm (the mean over seeds with a two-level bootstrap interval: seeds, then tasks) and the
   differences between arms with that interval, an exact test over seeds (which with 3 seeds against 3 can never
   give p < 0.10) and the effect detectable with 80% power; a figure (OUT/cpu-experiment.png) and
   RECORDS/summary.json.

The stores (the runs, checkpoints, evaluations) live under --out and stay out of git; what the summary needs is
written, as each part finishes, to small JSON records under --records (docs/results/cpu-experiment/, committed):
one per run (its training curve and its held-out scores under each view) and one for the base model. A run is
evaluated as soon as it has trained, so a machine lost between sessions loses at most the part in progress. The
same command after a stop resumes: a recorded part is never redone, a committed step or a finished evaluation in
--out is reused, and adding a seed runs only that seed. ``--summary-only`` runs nothing and tabulates the records
(while the experiment runs elsewhere, or on another machine).

    .venv/bin/python scripts/cpu_experiment.py --seeds 0,1,2 --views official,signatures --out runs/cpu-experiment
    .venv/bin/python scripts/cpu_experiment.py --seeds 0,1,2 --summary-only
    .venv/bin/python scripts/cpu_experiment.py --seeds 0 --set grpo.steps=4 --eval-tasks 2 --records /tmp/records
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "recipes/cpu-learn.yaml"
COMMON = ["diagnoser.mode=off"]
ARMS = {  # arm -> its overrides of the recipe
    "vanilla GRPO": ["interface.schema_cues=false", "interface.recovery_feedback=false",
                     "interface.capability_hints=false", "grpo.diagnosis_weighting=false", "grpo.closed_loop=false"],
    "SEAL": [],
}
SLUG = {"vanilla GRPO": "vanilla", "SEAL": "seal"}
ARM_NAMES = {  # what each arm ran (the paper's SEAL runs had phi_schema on and phi_err, phi_cap off)
    "SEAL": "SEAL = recipes/cpu-learn.yaml: phi_schema, phi_err and phi_cap on, diagnosis weighting, closed-loop rho",
    "vanilla GRPO": "vanilla GRPO = the same with those five parts off",
}
RESAMPLE = {"samples": 8, "seed": 100}  # the base model's fresh pass rate on the frontier tasks
# the rollout fields a base model's evaluation takes from the recipe (a run's evaluation reads its own recipe)
EVAL_ROLLOUT = ("max_new_tokens", "max_model_calls", "max_calls_per_turn", "max_response_tokens", "max_turns",
                "max_context_tokens")


# ---- statistics (pure) -------------------------------------------------------------------------------------------

def bootstrap_interval(values: list[float], level: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    draw = random.Random(seed)
    means = sorted(statistics.fmean(draw.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(tail * resamples)], means[min(resamples - 1, int((1 - tail) * resamples))]


def quarter_split(values: list) -> tuple[list, list]:
    """The first and the last quarter of a run's per-step values (at least one step each)."""
    size = max(1, len(values) // 4)
    return values[:size], values[-size:]


def quarters(rewards: list[float]) -> tuple[float, float]:
    """Mean reward of the first and of the last quarter of the steps."""
    first, last = quarter_split(rewards)
    return statistics.fmean(first), statistics.fmean(last)


def per_task_means(runs: list[dict[str, float]]) -> dict[str, float]:
    """task id -> its score averaged over the runs (seeds) that evaluated it; every run must hold the same tasks."""
    tasks = set(runs[0])
    if any(set(run) != tasks for run in runs):
        raise ValueError("the runs were evaluated on different tasks")
    return {task: statistics.fmean(run[task] for run in runs) for task in sorted(tasks)}


def seed_means(runs: list[dict[str, float]]) -> list[float]:
    """Each run's (seed's) mean score over its tasks: the unit every comparison of arms counts."""
    return [statistics.fmean(run.values()) for run in runs]


def two_level_bootstrap(a: list[dict[str, float]], b: list[dict[str, float]] | None = None, level: float = 0.95,
                        resamples: int = 20_000, seed: int = 0, paired: bool = False) -> dict[str, float]:
    """Percentile bootstrap interval {"low", "high"} and standard error {"se"} of arm a's mean score (minus arm b's,
    if given), resampling both sources of chance: the seeds of each arm, then the tasks (the same draw of tasks for
    both arms, which share them). An arm of one run (the greedy base model) has no seeds to resample. ``paired``:
    a's and b's runs are pairs (the same seed), drawn together."""
    import numpy as np

    tasks = sorted(a[0])
    draw = np.random.default_rng(seed)
    columns = draw.multinomial(len(tasks), [1 / len(tasks)] * len(tasks), size=resamples)  # how often each task is drawn
    pairs = draw.multinomial(len(a), [1 / len(a)] * len(a), size=resamples) if paired else None

    def means(runs: list[dict[str, float]]) -> np.ndarray:
        table = np.array([[run[task] for task in tasks] for run in runs])  # seeds x tasks
        rows = pairs if paired else draw.multinomial(len(runs), [1 / len(runs)] * len(runs), size=resamples)
        return ((rows @ table) * columns).sum(axis=1) / (len(runs) * len(tasks))

    values = np.sort(means(a) - (means(b) if b else 0.0))
    tail = (1 - level) / 2
    return {"low": float(values[int(tail * resamples)]),
            "high": float(values[min(resamples - 1, int((1 - tail) * resamples))]), "se": float(values.std())}


def seed_test(a: list[float], b: list[float]) -> tuple[float, float]:
    """Exact two-sided test over seeds, and the smallest p it can give at these numbers of seeds.
    Two arms of several seeds: a permutation test of the difference in means (every split of the pooled seeds
    into groups of the arms' sizes; 3 against 3 gives 20 splits, so p >= 0.10). Against one fixed score (the greedy
    base model): a sign-flip test of the seeds' differences from it (3 seeds give 8 flips, so p >= 0.25)."""
    if len(b) == 1:
        differences = [value - b[0] for value in a]
        observed = abs(sum(differences))
        flips = list(itertools.product((1, -1), repeat=len(differences)))
        extreme = sum(abs(sum(sign * d for sign, d in zip(signs, differences))) >= observed - 1e-12
                      for signs in flips)
        return extreme / len(flips), 2 / len(flips)
    pooled, observed = a + b, abs(statistics.fmean(a) - statistics.fmean(b))
    splits = list(itertools.combinations(range(len(pooled)), len(a)))

    def gap(chosen: tuple[int, ...]) -> float:
        inside = [pooled[i] for i in chosen]
        outside = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        return abs(statistics.fmean(inside) - statistics.fmean(outside))

    extreme = sum(gap(chosen) >= observed - 1e-12 for chosen in splits)
    return extreme / len(splits), (2 if len(a) == len(b) else 1) / len(splits)


def minimum_detectable_effect(standard_error: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at ``alpha`` detects with ``power``, by the normal
    approximation: (z_{1-alpha/2} + z_power) * its standard error (2.80 standard errors at 5% and 80%). Optimistic
    with few seeds, and moot where the exact test over seeds cannot reach alpha at all (``seed_test``)."""
    normal = statistics.NormalDist()
    return (normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)) * standard_error


def quarter_counts(rewards: list[float], trajectories: list[int]) -> dict[str, list[int]]:
    """Trajectories passed and played in the first and the last quarter of the steps:
    {"first": [passed, played], "last": [passed, played]}. Rewards are 0 or 1, so a step's mean times its
    trajectories is its count of passes."""

    def count(part: list[tuple[float, int]]) -> list[int]:
        return [sum(round(reward * played) for reward, played in part), sum(played for _, played in part)]

    first, last = quarter_split(list(zip(rewards, trajectories)))
    return {"first": count(first), "last": count(last)}


def seed_difference(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict:
    """Arm a's held-out score minus arm b's on the same tasks, with the seeds as the unit: the mean, its two-level
    bootstrap interval, the exact test over seeds (with the smallest p it can give) and the minimum detectable
    effect at 80% power from the bootstrap's standard error. ``floor``: b scores 0 on every task, so no task can
    favour b (a test over tasks would be one-sided by construction)."""
    a_means, b_means = seed_means(a), seed_means(b)
    interval = two_level_bootstrap(a, b)
    p, smallest = seed_test(a_means, b_means)
    return {"mean": statistics.fmean(a_means) - statistics.fmean(b_means), "low": interval["low"],
            "high": interval["high"], "seeds": [len(a), len(b)], "tasks": len(a[0]), "seed_p": p,
            "smallest_p": smallest, "mde": minimum_detectable_effect(interval["se"]),
            "floor": all(value == 0 for run in b for value in run.values())}


def paired_seed_difference(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict:
    """Arm a's held-out score minus arm b's when a[i] and b[i] share seed i (the same tasks in the same order, the
    same sampling streams): the mean of the seeds' differences, its two-level bootstrap interval with the pairs
    drawn together, the exact two-sided sign-flip test over the pairs (with the smallest p it can give: 2 / 2^pairs),
    the standard deviation of a pair's difference and the minimum detectable effect at 80% power."""
    differences = [statistics.fmean(x.values()) - statistics.fmean(y.values()) for x, y in zip(a, b, strict=True)]
    p, smallest = seed_test(differences, [0.0])
    interval = two_level_bootstrap(a, b, paired=True)
    return {"mean": statistics.fmean(differences), "low": interval["low"], "high": interval["high"],
            "differences": differences, "pairs": len(differences), "tasks": len(a[0]), "seed_p": p,
            "smallest_p": smallest, "pair_sd": statistics.stdev(differences) if len(differences) > 1 else None,
            "mde": minimum_detectable_effect(interval["se"])}


def distinguishable(difference: dict) -> bool:
    """Told apart from chance: the two-level interval leaves out 0 and the test over seeds gives p < 0.05."""
    return (difference["low"] > 0 or difference["high"] < 0) and difference["seed_p"] < 0.05


# ---- the steps ---------------------------------------------------------------------------------------------------

def seal_lite(*args: str) -> None:
    """Run one seal-lite command and wait for it. Stopping the experiment (``kill``/``pkill`` of this script)
    stops the command too: left running, it would go on writing into a store the next start resumes."""
    print("$ seal-lite " + " ".join(args), flush=True)
    signal.signal(signal.SIGTERM, _stop)
    subprocess.run([sys.executable, "-m", "seal_lite", *args], check=True, cwd=ROOT)  # kills it on an exception


def _stop(signum, frame) -> None:
    raise SystemExit(128 + signum)


def sets(overrides: list[str]) -> list[str]:
    return [word for override in overrides for word in ("--set", override)]


def frontier_ids(recipe: str, out: Path, overrides: list[str], stored_only: bool = False) -> list[str]:
    """The tasks every run trains on: those the recipe (with ``overrides``) names (data.task_ids, or the ids of its
    data.task_file), else the frontier of a screen of its candidates (data.num_tasks of data.split), screened into
    OUT/screen unless ``stored_only``."""
    from seal_lite.api import parse_overrides
    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.store import Store
    from seal_lite.runs.tasks import read_task_file, task_file_path
    from seal_lite.step.screen import frontier, pass_rates

    data = load_recipe(ROOT / recipe, parse_overrides(tuple(overrides))).data
    named = data.task_ids or (read_task_file(task_file_path(data.task_file)) if data.task_file else None)
    if named:
        return list(named)
    if not stored_only:
        seal_lite("screen", recipe, "--out", str(out / "screen"), *sets(overrides))
    return frontier(pass_rates(Store(out / "screen" / "seal.db").screen()))


def on_frontier(kept: list[str]) -> list[str]:
    """The overrides that train on exactly the frontier tasks, without screening again."""
    return [f"data.task_ids=[{','.join(kept)}]", "data.screen=null"]


def resampled_base(recipe: str, out: Path, train: list[str]) -> dict:
    """The base model's pass rate on the training tasks, played afresh (``RESAMPLE``) under the vanilla arm's plain
    view: {"by_task": {task id: pass rate}, "samples", "seed"}."""
    from seal_lite.engines.store import Store
    from seal_lite.step.screen import pass_rates

    path = out / f"base-resample-seed{RESAMPLE['seed']}"
    seal_lite("screen", recipe, "--out", str(path), "--samples", str(RESAMPLE["samples"]),
              *sets([*train, f"seed={RESAMPLE['seed']}", *ARMS["vanilla GRPO"]]))
    return {"by_task": pass_rates(Store(path / "seal.db").screen()), **RESAMPLE}


def held_out_ids(count: int) -> list[str]:
    ids = (ROOT / "data" / "eval_ids.txt").read_text().split()
    return [task_id for task_id in ids if task_id.startswith("multi_turn_base_")][:count]


def evaluation(path: Path) -> dict[str, dict[str, float]]:
    """task id -> {accuracy, turn_pass_rate} (0 or 1, and the share of turns passed) of one evaluation JSON."""
    (tasks,) = json.loads(path.read_text())["tasks"].values()
    return {task["task_id"]: {"accuracy": float(task["valid"]), "turn_pass_rate": task["turns_passed"] / task["turns"]}
            for task in tasks}


def training(run_dir: Path, first: int | None = None) -> dict:
    """The run's mean reward per step, how many steps updated the policy (the others had no signal), and the
    minutes its steps took (rollouts and updates; a pause or another job on the machine counts too); of its
    ``first`` steps only, if given."""
    from seal_lite.engines.store import Store

    store = Store(run_dir / "seal.db")
    last = first if first is not None else float("inf")
    shares = [value for step, value in store.metrics("grpo/groups_with_signal") if step <= last]
    steps = [step for step in store.steps() if step["step"] <= last]
    return {"rewards": [step["reward_mean"] for step in steps],
            "trajectories": [step["num_trajectories"] for step in steps],
            "minutes": sum(step["finished_at"] - step["started_at"] for step in steps if step["finished_at"]) / 60,
            "updated": sum(1 for step, skipped in store.metrics("grpo/update_skipped")
                           if step <= last and skipped == 0),
            "signal_share": statistics.fmean(shares) if shares else None}


def machine() -> str:
    """The CPU a record was measured on (its figures are minutes of this machine)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return f"{os.cpu_count()} cores, {names[0] if names else platform.processor() or 'unknown CPU'}"


class Records:
    """The committed records of the experiment's parts: RECORDS/NAME.json, one small JSON object each."""

    def __init__(self, directory: Path):
        self.directory = directory

    def get(self, name: str) -> dict | None:
        path = self.directory / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def put(self, name: str, record: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=RECIPE, help="the SEAL arm's recipe (default: %(default)s)")
    parser.add_argument("--seeds", default="0,1,2",
                        help="comma-separated seeds, one run per arm each; empty (--seeds '') for the base model only")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out base tasks evaluated")
    parser.add_argument("--views", default="official", help="comma-separated: official, signatures")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field for the screen and every run (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cpu-experiment", help="the stores (not in git)")
    parser.add_argument("--records", type=Path, default=ROOT / "docs" / "results" / "cpu-experiment",
                        help="the records of finished parts and summary.json, to commit (default: %(default)s)")
    parser.add_argument("--summary-only", action="store_true",
                        help="run nothing: tabulate the records (while the experiment runs, or on another machine)")
    args = parser.parse_args()
    from seal_lite.api import parse_overrides
    from seal_lite.runs.run_dir import run_status

    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    views = args.views.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    records = Records(args.records)
    common = [*COMMON, *args.overrides]
    kept = frontier_ids(args.recipe, args.out, common, args.summary_only)
    print(f"frontier: {len(kept)} tasks: {' '.join(kept)}", flush=True)
    train = [*common, *on_frontier(kept)]
    held_out = held_out_ids(args.eval_tasks)

    recipe = yaml.safe_load((ROOT / args.recipe).read_text())
    rollout = {**recipe.get("rollout", {}), **{key.split(".", 1)[1]: value for key, value
                                               in parse_overrides(tuple(args.overrides)).items()
                                               if key.startswith("rollout.")}}
    base_sets = [f"rollout.{key}={json.dumps(rollout[key])}" for key in EVAL_ROLLOUT if key in rollout]

    def scored(record: dict) -> dict[str, dict]:
        """The record's held-out scores under this run's views that cover exactly this run's held-out tasks."""
        return {view: by_task for view, by_task in record["held_out"].items()
                if view in views and sorted(by_task) == sorted(held_out)}

    def evaluate(record: dict, name: str, target: str, *eval_sets: str) -> None:
        """Add to ``record`` its held-out scores under each view it lacks (after `seal-lite eval TARGET` if
        OUT/NAME-VIEW-evalN.json is missing), writing the record after each."""
        if args.summary_only:
            return
        for view in views:
            if view in scored(record):
                continue
            path = args.out / f"{name}-{view}-eval{args.eval_tasks}.json"
            if not path.exists():
                seal_lite("eval", target, "--split", ",".join(held_out), "--view", view, *eval_sets,
                          "--json-file", str(path))
            record["held_out"][view] = evaluation(path)
            records.put(name, record)

    # a seed's two runs, each trained then evaluated at once, then the base model; a stop loses one part at most
    runs: dict[str, dict[int, dict]] = {}
    scores: dict[str, dict[str, list[dict]]] = {}  # view -> arm -> its evaluations, one per seed
    for seed in seeds:
        for arm, overrides in ARMS.items():
            name = f"{SLUG[arm]}-seed{seed}"
            run_dir = args.out / name
            record = records.get(name)
            if record is None:
                if args.summary_only:
                    continue
                if run_status(run_dir) != "finished":
                    seal_lite("run", args.recipe, "--out", str(run_dir),
                              *sets([*train, f"seed={seed}", *overrides]))
                record = {"arm": arm, "seed": seed, "overrides": [*train, f"seed={seed}", *overrides],
                          "machine": machine(), "training": training(run_dir), "held_out": {}}
                records.put(name, record)
            if run_status(run_dir) == "finished":
                evaluate(record, name, str(run_dir))
            runs.setdefault(arm, {})[seed] = record["training"]
            for view, by_task in scored(record).items():
                scores.setdefault(view, {}).setdefault(arm, []).append(by_task)

    base = records.get("base")
    if base is None and not args.summary_only:
        base = {"machine": machine(), "resample": resampled_base(args.recipe, args.out, train), "held_out": {}}
        records.put("base", base)
    if base is not None:
        # greedy decoding: the base model's score does not depend on the seed
        evaluate(base, "base", recipe["policy"]["model"], *sets(base_sets))
        for view, by_task in scored(base).items():
            scores.setdefault(view, {})["base"] = [by_task]
    scores = {view: dict(sorted(by_arm.items(), key=lambda item: item[0] != "base"))
              for view, by_arm in scores.items()}
    summary = summarize(kept, runs, scores, base["resample"] if base else None)
    records.put("summary", summary)
    print_tables(summary)
    draw(summary, args.out / "cpu-experiment.png")


def summarize(frontier: list[str], runs: dict, scores: dict, base: dict | None = None) -> dict:
    """Everything the tables and the figure show, from the runs' training records, the evaluations and the base
    model's resampled pass rates on the training tasks. Seeds are the unit of every comparison of arms."""
    from seal_lite.core.trend import reward_trend

    summary = {"frontier": frontier, "training": {}, "held_out": {}}
    if base:
        low, high = bootstrap_interval(list(base["by_task"].values()))
        summary["base_on_training_tasks"] = {**base, "mean": statistics.fmean(base["by_task"].values()), "low": low,
                                             "high": high}
    for arm, by_seed in runs.items():
        gains = []
        for run in by_seed.values():
            run["first_quarter"], run["last_quarter"] = quarters(run["rewards"])
            gains.append(run["last_quarter"] - run["first_quarter"])
            run["passed"] = quarter_counts(run["rewards"], run["trajectories"])
            trend = reward_trend(run["rewards"])
            run["trend"] = {"tau": trend.tau, "p_rise": trend.p_rise} if trend else None
        low, high = bootstrap_interval(gains)
        summary["training"][arm] = {"seeds": by_seed, "gain": {"mean": statistics.fmean(gains), "low": low,
                                                               "high": high}}
    # the seeds both arms trained: the same seed draws the same tasks in the same order in both arms
    seeds = sorted(set(runs.get("SEAL", {})) & set(runs.get("vanilla GRPO", {})))
    if seeds:
        def per_seed(arm: str, key: str) -> list[float]:
            return [runs[arm][seed][key] for seed in seeds]

        summary["seal_against_vanilla"] = {"seeds": seeds, **{
            part: dict(zip(("p", "smallest_p"), seed_test(per_seed("SEAL", f"{part}_quarter"),
                                                          per_seed("vanilla GRPO", f"{part}_quarter"))))
            for part in ("first", "last")}}
    for view, by_arm in scores.items():
        table = summary["held_out"][view] = {"arms": {}, "differences": {}}
        for arm, evaluations in by_arm.items():
            table["arms"][arm] = {"seeds": len(evaluations)}
            for metric in ("accuracy", "turn_pass_rate"):
                runs_by_task = [{task: row[metric] for task, row in run.items()} for run in evaluations]
                per_task_means(runs_by_task)  # the same tasks in every run
                interval = two_level_bootstrap(runs_by_task)
                means = seed_means(runs_by_task)
                table["arms"][arm][metric] = {"mean": statistics.fmean(means), "low": interval["low"],
                                              "high": interval["high"],
                                              "per_seed": means, "tasks": len(runs_by_task[0])}
        for a, b in (("SEAL", "vanilla GRPO"), ("SEAL", "base"), ("vanilla GRPO", "base")):
            if a in by_arm and b in by_arm:
                table["differences"][f"{a} - {b}"] = {
                    metric: seed_difference(*([{task: row[metric] for task, row in run.items()} for run in by_arm[arm]]
                                              for arm in (a, b)))
                    for metric in ("accuracy", "turn_pass_rate")}
    return summary


def _interval(stat: dict, scale: float = 100, digits: int = 1) -> str:
    mean, low, high = (scale * stat[key] for key in ("mean", "low", "high"))
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def print_tables(summary: dict) -> None:
    print(f"\nfrontier: {len(summary['frontier'])} training tasks")
    print(f"arms: {ARM_NAMES['SEAL']}; {ARM_NAMES['vanilla GRPO']}")
    print("\n| arm | seed | reward per step | first quarter | last quarter | passed, first -> last "
          "| trend (steps as units) | steps with an update | minutes of steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, record in summary["training"].items():
        for seed, run in record["seeds"].items():
            rewards = " ".join(f"{reward:.2f}" for reward in run["rewards"])
            (first, played), (last, _) = run["passed"]["first"], run["passed"]["last"]
            trend = f"τ {run['trend']['tau']:+.2f}, p = {run['trend']['p_rise']:.2g}" if run["trend"] else "-"
            print(f"| {arm} | {seed} | {rewards} | {run['first_quarter']:.2f} | {run['last_quarter']:.2f} | "
                  f"{first} -> {last} of {played} | {trend} | {run['updated']} of {len(run['rewards'])} "
                  f"| {run.get('minutes', float('nan')):.0f} |")
    if "base_on_training_tasks" in summary:
        base = summary["base_on_training_tasks"]
        print(f"\nbase model on these tasks, {base['samples']} fresh samples a task (seed {base['seed']}): pass rate "
              f"{_interval(base, scale=1, digits=2)} (95% bootstrap interval over tasks)")
    print("\n| arm | seeds | first quarter | last quarter | gain, last - first (mean [95% bootstrap over seeds]) |")
    print("|---|---|---|---|---|")
    for arm, record in summary["training"].items():
        seeds = record["seeds"].values()
        first = statistics.fmean(run["first_quarter"] for run in seeds)
        last = statistics.fmean(run["last_quarter"] for run in seeds)
        gain = _interval(record["gain"], scale=1, digits=3) if len(seeds) > 1 else f"{record['gain']['mean']:.3f}"
        print(f"| {arm} | {len(seeds)} | {first:.3f} | {last:.3f} | {gain} |")
    if "seal_against_vanilla" in summary:
        versus = summary["seal_against_vanilla"]
        print(f"\nSEAL against vanilla GRPO, seeds {', '.join(map(str, versus['seeds']))}, permutation test over "
              "seeds: " + "; ".join(f"{part} quarter p = {versus[part]['p']:.2g} (at best "
                                    f"{versus[part]['smallest_p']:.2g})" for part in ("first", "last")))
    for view, table in summary["held_out"].items():
        print(f"\nheld out, {view} view: % [95% two-level bootstrap: seeds, then tasks]")
        print("\n| arm | seeds | strict accuracy % | per seed | turn pass rate % |")
        print("|---|---|---|---|---|")
        for arm, row in table["arms"].items():
            per_seed = ", ".join(f"{100 * value:.1f}" for value in row["accuracy"]["per_seed"])
            print(f"| {arm} | {row['seeds']} | {_interval(row['accuracy'])} | {per_seed} "
                  f"| {_interval(row['turn_pass_rate'])} |")
        print("\n| difference (same tasks) | strict accuracy, points [two-level 95%] | test over seeds, p (at best) "
              "| smallest effect detectable (80% power) | told apart from chance |")
        print("|---|---|---|---|---|")
        for name, metrics in table["differences"].items():
            accuracy = metrics["accuracy"]
            mde = f"{100 * accuracy['mde']:.0f} points"
            if accuracy["smallest_p"] >= 0.05:
                mde += " (no test over these seeds reaches p < 0.05)"
            floor = " (the base scores 0 on every task)" if accuracy["floor"] else ""
            print(f"| {name}{floor} | {_points(accuracy['mean'])} [{_points(accuracy['low'])}, "
                  f"{_points(accuracy['high'])}] | {accuracy['seed_p']:.2g} ({accuracy['smallest_p']:.2g}) | {mde} "
                  f"| {'yes' if distinguishable(accuracy) else 'no'} |")


def draw(summary: dict, path: Path) -> None:
    """Training reward per step (each seed thin, the arm's mean over seeds thick) and held-out accuracy with its
    interval, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"vanilla GRPO": "tab:blue", "SEAL": "tab:orange", "base": "0.5"}
    views = list(summary["held_out"])
    figure, axes = plt.subplots(1, 1 + len(views), figsize=(5 + 3.5 * len(views), 3.6), squeeze=False)
    axes = axes[0]
    for arm, record in summary["training"].items():
        curves = [run["rewards"] for run in record["seeds"].values()]
        for curve in curves:
            axes[0].plot(range(1, len(curve) + 1), curve, color=colors[arm], alpha=0.3, linewidth=1)
        length = min(len(curve) for curve in curves)
        mean = [statistics.fmean(curve[i] for curve in curves) for i in range(length)]
        seeds = f"{len(curves)} seed{'s' * (len(curves) > 1)}"
        axes[0].plot(range(1, length + 1), mean, color=colors[arm], linewidth=2.5, label=f"{arm} ({seeds})")
    if "base_on_training_tasks" in summary:
        axes[0].axhline(summary["base_on_training_tasks"]["mean"], color=colors["base"], linestyle="--",
                        label="base model (fresh samples)")
    axes[0].set(xlabel="step", ylabel="training reward (frontier tasks)", ylim=(-0.02, 1.02))
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=8)
    for axis, view in zip(axes[1:], views):
        arms = summary["held_out"][view]["arms"]
        names = list(arms)
        means = [100 * arms[name]["accuracy"]["mean"] for name in names]
        errors = [[mean - 100 * arms[name]["accuracy"]["low"] for mean, name in zip(means, names)],
                  [100 * arms[name]["accuracy"]["high"] - mean for mean, name in zip(means, names)]]
        axis.bar(names, means, yerr=errors, capsize=4, color=[colors[name] for name in names])
        axis.set(title=f"held out, {view} view", ylabel="strict accuracy % (95% interval)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
