"""Does the training reward rise within 30 minutes on 2 cores? Runs of one CPU recipe, one seed after another,
each judged by the trend test with the steps as units (seal_lite/core/trend.py), as docs/results/rise-within-30-minutes.md reports.

Each run goes to OUT/<recipe name>-seed<N>; the same command after a stop resumes the unfinished run (seal-lite
run's checkpoints) and skips recorded ones. Each finished run's record, RECORDS/<recipe name>-seed<N>.json
(committed: the stores stay out of git), holds its per-step reward, share of drawn groups with a learning
signal, loss and LoRA change, the minutes its steps took, the machine, and the trend test.

    .venv/bin/python scripts/cpu_rise.py --recipe recipes/cpu-learn.yaml --seeds 0,1,2 --out runs
    .venv/bin/python scripts/cpu_rise.py --recipe recipes/cpu-learn.yaml --seeds 0,1,2 --summary-only
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_experiment import Records, machine, quarters

ROOT = Path(__file__).resolve().parent.parent


def finished(run_dir: Path) -> bool:
    from seal_lite.engines.store import Store

    return (run_dir / "seal.db").exists() and Store.open_readonly(run_dir / "seal.db").run().get("status") == "finished"


def record_of(run_dir: Path, recipe: str, seed: int) -> dict:
    """The finished run's per-step figures and its trend test."""
    from seal_lite.core import metrics as m
    from seal_lite.core.trend import reward_trend
    from seal_lite.engines.store import Store

    store = Store.open_readonly(run_dir / "seal.db")
    steps = store.steps()
    rewards = [step["reward_mean"] for step in steps]
    trend = reward_trend(rewards)
    first, last = quarters(rewards)
    return {"recipe": recipe, "seed": seed, "machine": machine(),
            "command": f".venv/bin/seal-lite run {recipe} --set seed={seed} --out {run_dir}",
            "rewards": rewards, "signal": store.metric_per_step(m.DRAWN_GROUPS_WITH_SIGNAL.name),
            "loss": [s["loss"] for s in steps], "lora_change": store.metric_per_step(m.LORA_CHANGE.name),
            "groups_rolled_out": store.metric_per_step(m.GROUPS_ROLLED_OUT.name),
            "step_minutes": [(s["finished_at"] - s["started_at"]) / 60 for s in steps],
            "minutes": sum(s["finished_at"] - s["started_at"] for s in steps) / 60,
            "wall_minutes": store.run()["wall_time_s"] / 60, "first_quarter": first, "last_quarter": last,
            "trend": {"tau": trend.tau, "p_rise": trend.p_rise}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="recipes/cpu-learn.yaml")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=ROOT / "runs")
    parser.add_argument("--records", type=Path, default=ROOT / "docs" / "results" / "cpu-rise")
    parser.add_argument("--summary-only", action="store_true", help="run nothing; tabulate the records")
    args = parser.parse_args()
    from seal_lite.core.recipe import load_recipe

    name = load_recipe(args.recipe).name
    records = Records(args.records)
    for seed in [int(seed) for seed in args.seeds.split(",")]:
        key = f"{name}-seed{seed}"
        if args.summary_only or records.get(key):
            continue
        run_dir = args.out / key
        if not finished(run_dir):  # a new run, or the same command resuming an unfinished one
            subprocess.run([str(ROOT / ".venv" / "bin" / "seal-lite"), "run", args.recipe, "--set", f"seed={seed}",
                            "--out", str(run_dir)], check=True)
        records.put(key, record_of(run_dir, args.recipe, seed))
    found = [records.get(f"{name}-seed{seed}") for seed in args.seeds.split(",")]
    found = [record for record in found if record]
    print(f"{'seed':>4}  {'steps':>5}  {'minutes':>7}  {'first q':>7}  {'last q':>6}  {'tau':>5}  p (steps as units)")
    for record in found:
        trend = record["trend"]
        print(f"{record['seed']:>4}  {len(record['rewards']):>5}  {record['minutes']:>7.1f}  "
              f"{record['first_quarter']:>7.2f}  {record['last_quarter']:>6.2f}  {trend['tau']:>+5.2f}  "
              f"{trend['p_rise']:.2g}")
    if len(found) > 1:
        taus = [record["trend"]["tau"] for record in found]
        print(f"mean tau {statistics.fmean(taus):+.2f} over {len(found)} seeds; {sum(t > 0 for t in taus)} of "
              f"{len(found)} rising; {sum(r['trend']['p_rise'] < 0.05 for r in found)} told apart from chance")


if __name__ == "__main__":
    main()
