"""Issue 41's experiment, pre-registered in docs/results/seal-vs-vanilla.md: SEAL against vanilla GRPO on tasks where SEAL's labels
act (two-turn miss_param tasks whose first turn must be declined, beside base tasks), seeds paired, power stated.

The design was fixed before anything ran: the arms, the candidate training tasks, the 48 held-out tasks
(``--design`` writes them to data/heldout/seal-vs-vanilla.txt and prints the power table of the pre-registration).
Then, each part recorded under --records (docs/results/seal-vs-vanilla/, committed) as soon as it is done, so the
same command after a stop goes on where it stopped:

1. the screen of the candidates with the base model, and the frontier it gives (``frontier.json``);
2. per seed, vanilla then SEAL: the run (under --out, not in git), its per-step record (rewards, weights, rho,
   label counts, interface versions), then its held-out plays, greedy and ``SAMPLES`` samples (``ARM-seedN.json``);
3. the base model's held-out plays (``base.json``);
4. if the base model passes less than ``PLACEBO_FLOOR`` of them, the pre-registered placebo: a vanilla arm trained
   on shuffled rewards (``grpo.shuffle_rewards``), per seed as in 2;
5. the summary: training curves at any time; the held-out comparison only once every primary run is evaluated
   (the pre-registration's rule), then the primary test and the secondary metrics (with the placebo, each arm
   against it).

    .venv/bin/python scripts/seal_vs_vanilla.py --design
    nohup .venv/bin/python scripts/seal_vs_vanilla.py --out runs/seal-vs-vanilla >> runs/seal-vs-vanilla.log 2>&1 &
    .venv/bin/python scripts/seal_vs_vanilla.py --summary-only
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_experiment import Records, machine, quarters, seal_lite, seed_means, seed_test, sets, two_level_bootstrap  # noqa: E402

RECIPE = "recipes/cpu-learn.yaml"
# every arm: the recipe with the first two user turns, 12 steps, rule labels
COMMON = ["rollout.max_turns=2", "grpo.steps=12", "diagnoser.mode=off"]
OFF = {"interface.schema_cues": "false", "interface.recovery_feedback": "false", "interface.capability_hints": "false",
       "grpo.diagnosis_weighting": "false", "grpo.closed_loop": "false"}
ARMS = {  # arm -> the values of the five method fields (the paper's SEAL: phi_schema, weighting, closed-loop rho)
    "vanilla": OFF,
    "seal": {**OFF, "interface.schema_cues": "true", "grpo.diagnosis_weighting": "true", "grpo.closed_loop": "true"},
    "reweight": {**OFF, "grpo.diagnosis_weighting": "true", "grpo.closed_loop": "true"},  # only if budget allows
    # the pre-registered placebo, run when the base model scores below PLACEBO_FLOOR: vanilla on shuffled rewards
    "placebo": {**OFF, "grpo.shuffle_rewards": "true"},
}
SEEDS = range(8)  # paired: a seed draws the same tasks in the same order in every arm
HELD_OUT_FILE = ROOT / "data" / "heldout" / "seal-vs-vanilla.txt"
HELD_OUT_PER_KIND = 24
SAMPLES = 4  # held-out samples per task at temperature 1, beside the greedy one
SAMPLE_SEED = 1000  # the held-out samples' random streams, the same for every model
SCREEN_SAMPLES, FRONTIER_PER_KIND = 4, 8
MIN_FRONTIER = 2  # the recipe's grpo.tasks_per_step: a step draws 2 distinct tasks
PRIMARY = ("vanilla", "seal")
PLACEBO_FLOOR = 0.05  # below this base pass rate, comparisons with the base model wait for a shuffled-reward arm


def declines_first(task) -> bool:
    """A miss_param task whose first turn lacks a parameter: its ground truth there is no call."""
    return task.category == "miss_param" and len(task.turns) >= 2 and task.ground_truth[0] == []


def candidates(split: str) -> dict[str, list[str]]:
    """The tasks of ``split`` of each kind: {"miss_param": those that decline first, "base": every base task}."""
    from seal_lite.envs.bfcl import load_tasks, split_ids

    tasks = load_tasks([task_id for task_id in split_ids(split)
                        if task_id.startswith(("multi_turn_miss_param_", "multi_turn_base_"))])
    return {"miss_param": [task.id for task in tasks if declines_first(task)],
            "base": [task.id for task in tasks if task.category == "base"]}


def stratified(task_ids: list[str], count: int) -> list[str]:
    """``count`` tasks spread over their sets of API classes: one task of each set in turn (sets in order of
    their first task, tasks in split order) until ``count`` are taken."""
    from seal_lite.envs.bfcl import load_tasks

    groups: dict[tuple, list[str]] = {}
    for task in load_tasks(task_ids):
        groups.setdefault(tuple(sorted(task.involved_classes)), []).append(task.id)
    chosen = []
    for layer in itertools.zip_longest(*groups.values()):
        chosen += [task_id for task_id in layer if task_id is not None]
    return chosen[:count]


def held_out_ids() -> list[str]:
    """The 48 held-out tasks: 24 that decline first and 24 base tasks of the eval split, stratified by classes."""
    kinds = candidates("eval")
    return [*stratified(kinds["miss_param"], HELD_OUT_PER_KIND), *stratified(kinds["base"], HELD_OUT_PER_KIND)]


def sign_flip_power(effect: float, pair_sd: float, pairs: int, alpha: float = 0.05, sims: int = 4000,
                    seed: int = 0) -> float:
    """Power of the primary test, an exact two-sided sign-flip test over ``pairs`` seed differences, when each
    difference is normal with mean ``effect`` and standard deviation ``pair_sd`` (simulated)."""
    import numpy as np

    draw = np.random.default_rng(seed)
    differences = draw.normal(effect, pair_sd, size=(sims, pairs))
    signs = np.array(list(itertools.product((1, -1), repeat=pairs)))
    observed = np.abs(differences.sum(axis=1))
    p = (np.abs(signs @ differences.T) >= observed - 1e-12).mean(axis=0)
    return float((p < alpha).mean())


def detectable(pair_sd: float, pairs: int, power: float = 0.8) -> int | None:
    """The smallest effect, in whole points, the primary test detects with ``power`` (None: none up to 60)."""
    return next((effect for effect in range(1, 61) if sign_flip_power(effect, pair_sd, pairs) >= power), None)


def power_table(seed_sds=(6.0, 8.0, 11.7), correlations=(0.0, 0.4), pairs=(5, 6, 8)) -> list[dict]:
    """The detectable effect for each spread of one seed's score, correlation of paired seeds and number of pairs."""
    rows = []
    for seed_sd, correlation in itertools.product(seed_sds, correlations):
        pair_sd = seed_sd * (2 * (1 - correlation)) ** 0.5
        rows.append({"seed_sd": seed_sd, "correlation": correlation, "pair_sd": pair_sd,
                     "detectable": {n: detectable(pair_sd, n) for n in pairs}})
    return rows


def arm_settings(arm: str, seed: int, frontier: list[str]) -> list[str]:
    """The recipe fields a run of ``arm`` sets: the common ones, the frontier, the seed and the arm's own."""
    return [*COMMON, f"data.task_ids=[{','.join(frontier)}]", "data.screen=null", f"seed={seed}",
            *(f"{key}={value}" for key, value in ARMS[arm].items())]


def choose_frontier(rates: dict[str, float], kinds: dict[str, list[str]]) -> list[str]:
    """The tasks solved in some but not all screen samples, at most ``FRONTIER_PER_KIND`` of each kind in split
    order."""
    return [task_id for ids in kinds.values()
            for task_id in [task_id for task_id in ids if 0 < rates.get(task_id, 0) < 1][:FRONTIER_PER_KIND]]


def screen(out: Path, records: Records) -> list[str]:
    """Phase 1: screen the candidates with the base model under the vanilla arm's view; the frontier."""
    from seal_lite.engines.store import Store
    from seal_lite.step.screen import pass_rates

    if (record := records.get("frontier")) is not None:
        return record["frontier"]
    kinds = candidates("train")
    ids = [*kinds["miss_param"], *kinds["base"]]
    seal_lite("screen", RECIPE, "--out", str(out / "screen"), "--samples", str(SCREEN_SAMPLES),
              *sets(arm_settings("vanilla", 0, ids)))
    rates = pass_rates(Store(out / "screen" / "seal.db").screen())
    frontier = choose_frontier(rates, kinds)
    records.put("frontier", {"frontier": frontier, "rates": rates, "samples": SCREEN_SAMPLES, "machine": machine()})
    return frontier


def training_record(run_dir: Path) -> dict:
    """A run's steps: reward, trajectories, minutes, whether it updated, and what SEAL's parts did: the weights'
    range and mean, rho per label, label counts and the interface version."""
    from cpu_experiment import training

    from seal_lite.core import metrics as m
    from seal_lite.engines.store import Store

    store = Store(run_dir / "seal.db")
    labels = store.labels_by_step()
    return {**training(run_dir),
            "weights": {name: store.metric_per_step(metric.name) for name, metric in
                        (("min", m.WEIGHT_MIN), ("mean", m.WEIGHT_MEAN), ("max", m.WEIGHT_MAX))},
            "rho": {label: [value for _, value in series] for label, series in store.metric_series("rho/").items()},
            "labels": [{label: step_labels.count(label) for label in sorted(set(step_labels))}
                       for _, step_labels in sorted(labels.items())],
            "interface_version": store.metric_per_step(m.INTERFACE_VERSION.name),
            "interface_versions": [{key: row[key] for key in ("version", "step", "reason")}
                                   for row in store.interface_versions()]}


def held_out_tasks():
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.runs.tasks import read_task_file

    return [task.truncated(2) for task in load_tasks(read_task_file(HELD_OUT_FILE))]


def play_held_out(recipe, adapter: Path | None, work_dir: Path, tasks=None, samples: int = SAMPLES,
                  chunk: int = 4) -> dict[str, dict]:
    """Each held-out task played greedily and ``samples`` times at the recipe's temperature, under the plain
    signatures view with evaluation's rules: task id -> {"greedy": [valid, labels], "samples": [[valid, labels]]}."""
    from seal_lite.core.interface import evaluation_interface
    from seal_lite.runs.evaluate_bfcl import evaluate, evaluation_engine, evaluation_rollout
    from seal_lite.step.rollout import by_shared_prefix, rollout_groups
    from seal_lite.step.verifier import diagnose_episode

    tasks = tasks if tasks is not None else held_out_tasks()
    sampled = evaluation_rollout(recipe.rollout).model_copy(update={"temperature": recipe.rollout.temperature})
    interface = evaluation_interface("signatures")
    work_dir.mkdir(parents=True, exist_ok=True)
    with evaluation_engine(recipe, adapter, work_dir) as generator:
        played = {result.task_id: {"greedy": [result.valid, result.labels], "samples": []}
                  for result in evaluate(tasks, generator, recipe.rollout, view="signatures")}
        if hasattr(generator, "reseed"):  # llama.cpp: the same random streams for every model
            generator.reseed(SAMPLE_SEED)
        ordered = by_shared_prefix(tasks)
        for start in range(0, len(ordered), chunk):
            part = ordered[start : start + chunk]
            for task, group in zip(part, rollout_groups([(task, interface) for task in part], samples, generator,
                                                       sampled), strict=True):
                for trajectory in group:
                    diagnosis = diagnose_episode(task, trajectory.turns)
                    played[task.id]["samples"].append([diagnosis.valid, diagnosis.labels])
    return played


def pass_rate(played: dict[str, dict], key: str = "samples") -> dict[str, float]:
    """task id -> the share of its samples (or its greedy play) whose verdict passed."""
    return {task_id: statistics.fmean(valid for valid, _ in plays[key]) if key == "samples"
            else float(plays["greedy"][0]) for task_id, plays in played.items()}


def label_share(played: dict[str, dict], label: str, turn: int | None = None, category: str | None = None) -> float:
    """The share of the sampled plays' turns (only turn ``turn``, and only tasks of ``category``, if given) labelled
    ``label``."""
    turns = [labels[index] for task_id, plays in played.items() if category in (None, category_of(task_id))
             for _, labels in plays["samples"]
             for index in (range(len(labels)) if turn is None else [turn]) if index < len(labels)]
    return turns.count(label) / max(1, len(turns))


def secondary_metrics(played: dict[str, dict]) -> dict[str, float]:
    """One model's pre-registered secondary metrics: the greedy pass rate, abstention accuracy (the miss_param tasks'
    first turns, which must be declined, labelled ``correct_abstention``) and the no-call rate (turns labelled
    ``empty_turn_model_response``)."""
    return {"greedy": statistics.fmean(pass_rate(played, "greedy").values()),
            "abstention": label_share(played, "correct_abstention", turn=0, category="miss_param"),
            "no_call": label_share(played, "empty_turn_model_response")}


def summarize(records: Records) -> dict:
    """The training curves so far, and, once every primary run is evaluated, the pre-registered comparison."""
    from seal_lite.core.trend import reward_trend

    runs = {(arm, seed): record for arm in ARMS for seed in SEEDS if (record := records.get(f"{arm}-seed{seed}"))}
    summary = {"training": {}}
    for (arm, seed), record in runs.items():
        curve = record["training"]
        trend = reward_trend(curve["rewards"])
        summary["training"][f"{arm}-seed{seed}"] = {
            "rewards": curve["rewards"], "updated": curve["updated"], "minutes": curve["minutes"],
            "trend": {"tau": trend.tau, "p_rise": trend.p_rise} if trend else None}
    evaluated = {key for key, record in runs.items() if record.get("held_out")}
    missing = [f"{arm}-seed{seed}" for arm in PRIMARY for seed in SEEDS if (arm, seed) not in evaluated]
    if missing:
        summary["held_out"] = {"withheld": f"{len(missing)} primary runs not yet evaluated"}
        return summary
    scores = {arm: [pass_rate(runs[arm, seed]["held_out"]) for seed in SEEDS] for arm in PRIMARY}
    per_seed = {arm: seed_means(scores[arm]) for arm in PRIMARY}
    primary = paired_comparison(scores["seal"], scores["vanilla"])
    differences, pair_sd = primary["differences"], statistics.stdev(primary["differences"])
    by_seed = {arm: [secondary_metrics(runs[arm, seed]["held_out"]) for seed in SEEDS] for arm in PRIMARY}
    secondary = {arm: {name: [row[name] for row in rows] for name in rows[0]} for arm, rows in by_seed.items()}
    summary["held_out"] = {
        "per_seed": per_seed,
        "primary": primary,
        # the pre-registration's power inputs as measured here, and the smallest effect they let the test detect
        "power": {"seed_sd": {arm: statistics.stdev(per_seed[arm]) for arm in PRIMARY},
                  "correlation": _correlation(per_seed["seal"], per_seed["vanilla"]), "pair_sd": pair_sd,
                  "detectable_points": detectable(100 * pair_sd, len(differences))},
        "secondary": {arm: {
            **{name: statistics.fmean(values) for name, values in secondary[arm].items()},
            "by_category": {category: statistics.fmean(
                statistics.fmean(rate for task_id, rate in score.items() if category_of(task_id) == category)
                for score in scores[arm]) for category in sorted({category_of(task_id) for task_id in scores[arm][0]})},
        } for arm in PRIMARY},
        # SEAL - vanilla on each secondary metric, seeds paired as in the primary test; reported without a claim
        "secondary_differences": {name: _paired_seeds(secondary["seal"][name], secondary["vanilla"][name])
                                  for name in secondary["seal"]},
        "training_last_quarter": _last_quarters(runs)}
    passes = {arm: passes_by_task(runs[arm, seed]["held_out"] for seed in SEEDS) for arm in PRIMARY}
    if all(("placebo", seed) in evaluated for seed in SEEDS):  # the placebo rule's arm, once all its seeds are in
        played = [runs["placebo", seed]["held_out"] for seed in SEEDS]
        placebo = [pass_rate(one) for one in played]
        rows = [secondary_metrics(one) for one in played]
        curves = [quarters(runs["placebo", seed]["training"]["rewards"]) for seed in SEEDS]
        summary["held_out"]["placebo"] = {
            "per_seed": seed_means(placebo), **{arm: paired_comparison(scores[arm], placebo) for arm in PRIMARY},
            "secondary": {name: statistics.fmean(row[name] for row in rows) for name in rows[0]},
            "training_quarters": [statistics.fmean(first for first, _ in curves),
                                  statistics.fmean(last for _, last in curves)]}
        passes["placebo"] = passes_by_task(played)
    if base := records.get("base"):
        summary["held_out"]["base"] = base_pass_rate(base)
        summary["held_out"]["base_secondary"] = secondary_metrics(base["held_out"])
        passes["base"] = passes_by_task([base["held_out"]])
    summary["held_out"]["passes_by_task"] = passes  # which held-out tasks the sampled passes came from
    return summary


def passes_by_task(plays: Iterable[dict[str, dict]]) -> dict[str, int]:
    """task id -> how many of its sampled plays passed, over the given models' plays (tasks never passed left out)."""
    counts = Counter()
    for played in plays:
        counts.update({task_id: sum(valid for valid, _ in task["samples"]) for task_id, task in played.items()})
    return {task_id: count for task_id, count in sorted(counts.items()) if count}


def paired_comparison(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict:
    """Arm a minus arm b, seeds paired (each a task -> score dict): the per-seed differences, their mean with the
    two-level bootstrap interval (pairs, then tasks), and the exact sign-flip test over the seeds."""
    differences = [x - y for x, y in zip(seed_means(a), seed_means(b), strict=True)]
    p, smallest = seed_test(differences, [0.0])
    interval = two_level_bootstrap(a, b, paired=True)
    return {"mean": statistics.fmean(differences), "low": interval["low"], "high": interval["high"], "p": p,
            "smallest_p": smallest, "differences": differences}


def category_of(task_id: str) -> str:
    """A BFCL multi-turn task's category, from its id (multi_turn_miss_param_12 -> miss_param)."""
    return task_id.removeprefix("multi_turn_").rsplit("_", 1)[0]


def _correlation(a: list[float], b: list[float]) -> float | None:
    """Pearson's correlation of the paired seeds' scores (None when an arm's scores do not vary)."""
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:
        return None


def _paired_seeds(a: list[float], b: list[float]) -> dict:
    """a - b per seed, their mean and the exact sign-flip test over the seeds."""
    differences = [x - y for x, y in zip(a, b, strict=True)]
    return {"per_seed": differences, "mean": statistics.fmean(differences), "p": seed_test(differences, [0.0])[0]}


def _last_quarters(runs: dict) -> dict:
    """The training reward of the last quarter of the steps, per arm and seed, and SEAL - vanilla tested over the
    seeds (the pre-registration's secondary comparison of the training curves)."""
    last = {arm: [quarters(runs[arm, seed]["training"]["rewards"])[1] for seed in SEEDS] for arm in PRIMARY}
    paired = _paired_seeds(last["seal"], last["vanilla"])
    return {"per_seed": last, "mean": paired["mean"], "p": paired["p"]}


def print_summary(summary: dict) -> None:
    print("\n| run | reward per step | trend (steps as units) | steps with an update | minutes |")
    print("|---|---|---|---|---|")
    for name, run in summary["training"].items():
        trend = f"τ {run['trend']['tau']:+.2f}, p = {run['trend']['p_rise']:.2g}" if run["trend"] else "-"
        print(f"| {name} | {' '.join(f'{r:.2f}' for r in run['rewards'])} | {trend} | {run['updated']} "
              f"| {run['minutes']:.0f} |")
    held_out = summary["held_out"]
    if "withheld" in held_out:
        print(f"\nheld out: withheld until every primary run is evaluated ({held_out['withheld']})")
        return
    primary, power = held_out["primary"], held_out["power"]
    print("\n| held-out pass rate, % | " + " | ".join(f"seed {seed}" for seed in SEEDS) + " | mean |")
    print("|---|" + "---|" * (len(SEEDS) + 1))
    for arm in PRIMARY:
        values = held_out["per_seed"][arm]
        print(f"| {arm} | " + " | ".join(f"{100 * v:.1f}" for v in values) + f" | {100 * statistics.fmean(values):.1f} |")
    print("| SEAL - vanilla | " + " | ".join(f"{100 * d:+.1f}" for d in primary["differences"])
          + f" | {100 * primary['mean']:+.1f} |")
    print(f"primary: SEAL - vanilla {100 * primary['mean']:+.1f} points [{100 * primary['low']:+.1f}, "
          f"{100 * primary['high']:+.1f}] (two-level bootstrap, seeds then tasks), sign-flip test over seeds "
          f"p = {primary['p']:.2g} (at best {primary['smallest_p']:.2g})")
    correlation = "-" if power["correlation"] is None else f"{power['correlation']:+.2f}"
    detectable_points = power["detectable_points"]
    print(f"power as measured: one seed's SD {', '.join(f'{arm} {100 * sd:.1f}' for arm, sd in power['seed_sd'].items())}"
          f" points, paired seeds' correlation {correlation}, a pair's SD {100 * power['pair_sd']:.1f} points: the "
          "test detects " + (f"{detectable_points} points or more" if detectable_points else "no effect up to 60 points")
          + " with 80% power")
    for arm, row in held_out["secondary"].items():
        categories = ", ".join(f"{category} {100 * rate:.1f}%" for category, rate in row["by_category"].items())
        print(f"{arm}: greedy {100 * row['greedy']:.1f}%, abstention on the miss_param first turns "
              f"{100 * row['abstention']:.1f}%, no-call turns {100 * row['no_call']:.1f}%; by category {categories}")
    print("secondary, SEAL - vanilla per seed (no claim): " + "; ".join(
        f"{name} {100 * row['mean']:+.1f} points ({' '.join(f'{100 * d:+.1f}' for d in row['per_seed'])}), "
        f"sign-flip p = {row['p']:.2g}" for name, row in held_out["secondary_differences"].items()))
    last = held_out["training_last_quarter"]
    print(f"training reward, last quarter of the steps: SEAL - vanilla {100 * last['mean']:+.1f} points, sign-flip "
          f"test over seeds p = {last['p']:.2g}")
    if "base" in held_out:
        floor = held_out["base"] < PLACEBO_FLOOR and "placebo" not in held_out  # the pre-registration's placebo rule
        print(f"base model: {100 * held_out['base']:.1f}%" + (
            f" (below {100 * PLACEBO_FLOOR:.0f}%: a gain over it only says the weights changed; no comparison with it "
            "is reported before a vanilla arm trained on shuffled rewards, the pre-registered placebo)" if floor else ""))
    if "base_secondary" in held_out:
        row = held_out["base_secondary"]
        print(f"base model: greedy {100 * row['greedy']:.1f}%, abstention on the miss_param first turns "
              f"{100 * row['abstention']:.1f}%, no-call turns {100 * row['no_call']:.1f}%")
    if "placebo" in held_out:
        placebo = held_out["placebo"]
        print(f"placebo (vanilla on shuffled rewards) per seed: {', '.join(f'{100 * v:.1f}' for v in placebo['per_seed'])}")
        row, (first, last) = placebo["secondary"], placebo["training_quarters"]
        print(f"placebo: greedy {100 * row['greedy']:.1f}%, abstention on the miss_param first turns "
              f"{100 * row['abstention']:.1f}%, no-call turns {100 * row['no_call']:.1f}%; training reward (the real "
              f"verdicts), first quarter of the steps {first:.2f}, last {last:.2f}")
        for arm in PRIMARY:
            row = placebo[arm]
            print(f"{arm} - placebo: {100 * row['mean']:+.1f} points [{100 * row['low']:+.1f}, {100 * row['high']:+.1f}], "
                  f"sign-flip test over seeds p = {row['p']:.2g}: the gain of training on the real verdicts")
    print("held-out tasks the sampled plays passed (passes): " + "; ".join(
        f"{model} " + (", ".join(f"{task_id.removeprefix('multi_turn_')} {count}" for task_id, count in counts.items())
                       or "none")
        for model, counts in held_out["passes_by_task"].items()))


def needs_training(record: dict, run_dir: Path) -> bool:
    """Whether a run must (still) be trained: it has no training record, or it was trained but not yet played on
    the held-out tasks and its store is gone with the machine that ran it (the adapter those plays need with it)."""
    from seal_lite.runs.run_dir import run_status

    return "training" not in record or ("held_out" not in record and run_status(run_dir) != "finished")


def run(out: Path, records: Records, arms: list[str]) -> None:
    """Phases 1-4, each part skipped once recorded; a run left unfinished in --out resumes."""
    from seal_lite.api import parse_overrides
    from seal_lite.core.recipe import load_recipe

    frontier = screen(out, records)
    print(f"frontier: {len(frontier)} tasks: {' '.join(frontier)}", flush=True)
    if len(frontier) < MIN_FRONTIER:
        raise SystemExit(f"the screen kept {len(frontier)} training tasks (solved in some, not all, of "
                         f"{SCREEN_SAMPLES} samples), fewer than a step draws ({MIN_FRONTIER}): the pre-registered "
                         "design cannot train. Any change to it is an amendment, recorded in docs/results/seal-vs-vanilla.md "
                         "before a run starts.")
    for seed in SEEDS:
        for arm in arms:
            train_and_play(arm, seed, frontier, out, records)
    if records.get("base") is None:
        recipe = load_recipe(ROOT / RECIPE, parse_overrides(tuple(arm_settings("vanilla", 0, frontier))))
        records.put("base", {"machine": machine(), "held_out": play_held_out(recipe, None, out / "base-eval")})
    if needs_placebo(records):
        for seed in SEEDS:
            train_and_play("placebo", seed, frontier, out, records)


def train_and_play(arm: str, seed: int, frontier: list[str], out: Path, records: Records) -> None:
    """One run of ``arm`` and its held-out plays, each recorded as it ends (skipped once recorded)."""
    from seal_lite.runs.evaluate_bfcl import run_variants
    from seal_lite.runs.run_dir import run_status

    name, run_dir = f"{arm}-seed{seed}", out / f"{arm}-seed{seed}"
    record = records.get(name) or {}
    if needs_training(record, run_dir):
        if run_status(run_dir) != "finished":
            seal_lite("run", RECIPE, "--out", str(run_dir), *sets(arm_settings(arm, seed, frontier)))
        record = {"arm": arm, "seed": seed, "settings": arm_settings(arm, seed, frontier),
                  "machine": machine(), "training": training_record(run_dir)}
        records.put(name, record)
    if "held_out" not in record:
        _, recipe, [(_, adapter)] = run_variants(run_dir, {}, base=False, steps=())
        record["held_out"] = play_held_out(recipe, adapter, out / f"{name}-eval")
        records.put(name, record)


def needs_placebo(records: Records) -> bool:
    """The pre-registration's rule: the shuffled-reward arm runs when the base model's held-out pass rate is below
    PLACEBO_FLOOR (a gain over it would only say that the weights changed)."""
    base = records.get("base")
    return base is not None and base_pass_rate(base) < PLACEBO_FLOOR


def base_pass_rate(base: dict) -> float:
    """The base model's held-out pass rate (the primary metric)."""
    return statistics.fmean(pass_rate(base["held_out"]).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--design", action="store_true", help="write the held-out tasks and print the power table")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "seal-vs-vanilla", help="the stores (not in git)")
    parser.add_argument("--records", type=Path, default=ROOT / "docs" / "results" / "seal-vs-vanilla",
                        help="the records of finished parts (default: %(default)s)")
    parser.add_argument("--arms", default=",".join(PRIMARY), help="arms to run, in order (default: %(default)s)")
    parser.add_argument("--summary-only", action="store_true", help="run nothing: tabulate the records")
    args = parser.parse_args()
    if args.design:
        ids = held_out_ids()
        HELD_OUT_FILE.parent.mkdir(parents=True, exist_ok=True)
        HELD_OUT_FILE.write_text("# issue 41's held-out tasks: scripts/seal_vs_vanilla.py --design\n"
                                 + "\n".join(ids) + "\n")
        kinds = candidates("train")
        print(f"held out: {len(ids)} tasks -> {HELD_OUT_FILE.relative_to(ROOT)}")
        print(f"training candidates: {len(kinds['miss_param'])} miss_param that decline first, "
              f"{len(kinds['base'])} base")
        print("\n| one seed's score SD, points | correlation of paired seeds | SD of a pair's difference | "
              "detectable at 80% power: 5 pairs | 6 pairs | 8 pairs |")
        print("|---|---|---|---|---|---|")
        for row in power_table():
            cells = " | ".join(str(row["detectable"][n] or "never") for n in (5, 6, 8))
            print(f"| {row['seed_sd']:g} | {row['correlation']:g} | {row['pair_sd']:.1f} | {cells} |")
        return
    records = Records(args.records)
    if not args.summary_only:
        args.out.mkdir(parents=True, exist_ok=True)
        run(args.out, records, args.arms.split(","))
    summary = summarize(records)
    records.put("summary", summary)
    print_summary(summary)


if __name__ == "__main__":
    main()
