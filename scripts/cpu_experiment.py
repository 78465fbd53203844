"""The CPU experiment of docs/results.md: Qwen2.5-Coder-0.5B base vs vanilla GRPO vs SEAL.

Every condition trains from recipes/cpu-qwen0.5b.yaml for the same budget (steps x 2 tasks x G=4, tasks drawn
from all 100 base-category training tasks in a seeded order, the same for both methods of a seed), once per
seed, and is evaluated greedily on the same held-out subset (the first N base-category tasks of the eval split).
Vanilla GRPO is that recipe with SEAL's parts off (plain interface, no diagnosis weights, no closed-loop rho),
as in recipes/ablation-vanilla-grpo.yaml. Both use the rule labels (diagnoser off), as the paper does.

Each finished run and evaluation is kept under --out, so running the same command again after a crash or
Ctrl-C picks up where it stopped, and adding a seed only runs that seed. The last step prints the tables.

    .venv/bin/python scripts/cpu_experiment.py --seeds 0 --steps 6 --max-turns 2 --out runs/cpu-experiment
    .venv/bin/python scripts/cpu_experiment.py --seeds 0,1 --steps 6 --max-turns 1 --eval-tasks 48 \
        --out runs/cpu-experiment-turn1
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from seal_lite.diagnosis.labels import SUCCESS_LABELS
from seal_lite.runner import run_status
from seal_lite.store import Store

RECIPE = "recipes/cpu-qwen0.5b.yaml"
COMMON = ["diagnoser.mode=off"]
METHODS = {
    "vanilla GRPO": ["interface.schema_cues=false", "interface.recovery_feedback=false",
                     "interface.capability_hints=false", "grpo.diagnosis_weighting=false", "grpo.closed_loop=false"],
    "SEAL": [],
}
# the rollout budget of the recipe, for the base model's evaluation (a run's evaluation reads its own recipe)
ROLLOUT = ["max_new_tokens=96", "max_model_calls=6", "max_calls_per_turn=2", "max_context_tokens=4096"]
ROOT = Path(__file__).resolve().parent.parent


def seal_lite(*args: str) -> None:
    command = [sys.executable, "-m", "seal_lite", *args]
    print("$ seal-lite " + " ".join(args), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def sets(overrides: list[str]) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def held_out_ids(per_category: int) -> str:
    ids = (ROOT / "data" / "eval_ids.txt").read_text().split()
    return ",".join([i for i in ids if i.startswith("multi_turn_base_")][:per_category])


def evaluation(path: Path) -> dict:
    """Strict accuracy and turn pass rate (%) of one evaluation JSON, which holds one model."""
    (table,) = json.loads(path.read_text())["summary"].values()
    return {key: 100 * table["mean"][key] for key in ("accuracy", "turn_pass_rate")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds, one run per method each")
    parser.add_argument("--steps", type=int, default=6, help="SEAL steps per run (the fixed budget)")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out base tasks evaluated")
    parser.add_argument("--max-turns", type=int, default=2, help="user turns played per task, in training and "
                        "evaluation (the reward is the verdict on those turns)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cpu-experiment")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    ids = held_out_ids(args.eval_tasks)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = [f"grpo.steps={args.steps}", f"rollout.max_turns={args.max_turns}", *COMMON]

    base_json = args.out / f"base-eval{args.eval_tasks}.json"
    if not base_json.exists():  # greedy decoding: the base model's score does not depend on the seed
        rollout = [f"rollout.{k}" for k in ROLLOUT] + [f"rollout.max_turns={args.max_turns}"]
        seal_lite("eval", "qwen2.5-coder-0.5b", "--split", ids, *sets(rollout), "--json", str(base_json))
    results = {"base": {None: evaluation(base_json)}}
    training = {}
    for seed in seeds:
        for method, overrides in METHODS.items():
            name = f"{'seal' if method == 'SEAL' else 'vanilla'}-seed{seed}"
            run_dir, eval_json = args.out / name, args.out / f"{name}-eval{args.eval_tasks}.json"
            if not eval_json.exists():
                if run_status(run_dir) != "finished":
                    seal_lite("run", RECIPE, "--out", str(run_dir), *sets([*budget, f"seed={seed}", *overrides]))
                seal_lite("eval", str(run_dir), "--split", ids, "--json", str(eval_json))
            results.setdefault(method, {})[seed] = evaluation(eval_json)
            training.setdefault(method, {})[seed] = _training(run_dir)
    print_tables(results, training, seeds)


def _training(run_dir: Path) -> dict:
    """Per step: the mean reward; over the run: how many steps updated the policy (the others had no learning
    signal) and the share of training turns that passed."""
    store = Store(run_dir / "seal.db")
    labels = store.label_counts()
    passed = sum(n for label, n in labels.items() if label in SUCCESS_LABELS)
    return {"rewards": [step["reward_mean"] for step in store.steps()],
            "updated": sum(1 for _, skipped in store.metrics("grpo/update_skipped") if skipped == 0),
            "turn_pass_rate": 100 * passed / sum(labels.values())}


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {statistics.stdev(values):.1f}"


def print_tables(results: dict, training: dict, seeds: list[int]) -> None:
    print("\n| model | strict accuracy % | turn pass rate % | per seed (strict / turn) |")
    print("|---|---|---|---|")
    for method, by_seed in results.items():
        rows = list(by_seed.values())
        per_seed = ", ".join(f"s{seed}: {r['accuracy']:.1f} / {r['turn_pass_rate']:.1f}"
                             for seed, r in by_seed.items() if seed is not None) or "greedy, no seed"
        print(f"| {method} | {_spread([r['accuracy'] for r in rows])} | "
              f"{_spread([r['turn_pass_rate'] for r in rows])} | {per_seed} |")
    print("\n| training | seed | reward per step | steps with an update | turn pass rate % |")
    print("|---|---|---|---|---|")
    for method, by_seed in training.items():
        for seed in seeds:
            run = by_seed[seed]
            rewards = " ".join(f"{r:.2f}" for r in run["rewards"])
            print(f"| {method} | {seed} | {rewards} | {run['updated']} of {len(run['rewards'])} | "
                  f"{run['turn_pass_rate']:.1f} |")


if __name__ == "__main__":
    main()
