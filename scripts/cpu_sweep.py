"""Step size on the frontier (issue 17): short SEAL runs of recipes/cpu-learn.yaml over learning rates and LoRA ranks.

Every run trains on the experiment's frontier (the tasks the recipe names, or, if it names none, those of a screen
into OUT/screen, which this script reuses or makes), for --steps steps, seed 0, with lora_alpha = 2 x rank. The
table shows what decides a step size: the reward in the first and last quarter of the steps, how many steps updated
the policy, and the means over the run of the KL to the reference, the policy's entropy, the LoRA norm, the
gradient norm and the llama.cpp / torch log-prob gap (a policy that moves too fast drifts from the engine that
samples for it). Each run's figures are written to a small record under --records (docs/results/cpu-sweep/,
committed) when it finishes, and the stores stay under --out, so the same command resumes, on this machine or
another. The recipe's own learning rate and rank at seed 0 is the experiment's SEAL run (OUT/seal-seed0): with a
constant learning rate and the same seed, its first --steps steps are that sweep run, so the sweep reads them there
instead of training them again (that row waits until the experiment has trained it).

    .venv/bin/python scripts/cpu_sweep.py --rates 5e-5,1e-4,3e-4 --ranks 8,16 --steps 10 --out runs/cpu-experiment
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from cpu_experiment import (
    COMMON,
    RECIPE,
    ROOT,
    Records,
    frontier_ids,
    machine,
    on_frontier,
    quarters,
    seal_lite,
    sets,
    training,
)

WATCHED = ("grpo/kl", "grpo/entropy", "grpo/lora_norm", "grpo/grad_norm", "grpo/engine/logprob_gap_mean")


def run_figures(run_dir: Path, steps: int) -> dict:
    """The sweep's figures of the run's first ``steps`` steps."""
    from seal_lite.engines.store import Store

    run = training(run_dir, first=steps)
    first, last = quarters(run["rewards"])
    figures = {"first": first, "last": last, "steps": len(run["rewards"]), "updated": run["updated"]}
    store = Store(run_dir / "seal.db")
    for name in WATCHED:
        values = [value for step, value in store.metrics(name) if step <= steps]
        figures[name] = statistics.fmean(values) if values else None
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("--rates", default="5e-5,1e-4,3e-4", help="comma-separated learning rates")
    parser.add_argument("--ranks", default="8,16", help="comma-separated LoRA ranks")
    parser.add_argument("--steps", type=int, default=10, help="SEAL steps per run")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cpu-experiment", help="the stores (not in git)")
    parser.add_argument("--records", type=Path, default=ROOT / "docs" / "results" / "cpu-sweep",
                        help="each run's figures, to commit (default: %(default)s)")
    args = parser.parse_args()
    from seal_lite.core.recipe import load_recipe
    from seal_lite.runs.run_dir import run_status

    common = [*COMMON, *args.overrides]
    kept = frontier_ids(args.recipe, args.out, common)
    train = [*common, *on_frontier(kept), f"grpo.steps={args.steps}"]
    recipe = load_recipe(ROOT / args.recipe)
    # runs with other overrides are not the recipe's sweep: their records stay beside their stores
    records = Records(args.records if not args.overrides else args.out / "sweep" / "records")
    rows = []
    for rate in args.rates.split(","):
        for rank in (int(r) for r in args.ranks.split(",")):
            name = f"lr{rate}-r{rank}-steps{args.steps}"
            figures = records.get(name)
            if figures is None:
                run_dir = args.out / "sweep" / f"lr{rate}-r{rank}"
                the_recipe = (float(rate), rank, 2 * rank) == (
                    recipe.grpo.learning_rate, recipe.policy.lora_r, recipe.policy.lora_alpha)
                if the_recipe and not args.overrides:
                    run_dir = args.out / "seal-seed0"
                    if run_status(run_dir) != "finished":
                        print(f"lr {rate}, rank {rank}: waits for the experiment's {run_dir} (cpu_experiment.py)")
                        continue
                    print(f"lr {rate}, rank {rank}: the first {args.steps} steps of {run_dir}")
                elif run_status(run_dir) != "finished":
                    seal_lite("run", args.recipe, "--out", str(run_dir), *sets([
                        *train, f"grpo.learning_rate={rate}", f"policy.lora_r={rank}",
                        f"policy.lora_alpha={2 * rank}"]))
                figures = {**run_figures(run_dir, args.steps), "machine": machine()}
                records.put(name, figures)
            rows.append((rate, rank, figures))
    print(f"\nfrontier: {len(kept)} tasks; {args.steps} steps per run, seed 0")
    print("\n| lr | rank | reward, first quarter | last quarter | steps updated | " +
          " | ".join(name.removeprefix("grpo/") for name in WATCHED) + " |")
    print("|---|---|---|---|---|" + "---|" * len(WATCHED))
    for rate, rank, figures in rows:
        watched = " | ".join("-" if figures[name] is None else f"{figures[name]:.3g}" for name in WATCHED)
        print(f"| {rate} | {rank} | {figures['first']:.2f} | {figures['last']:.2f} | "
              f"{figures['updated']} of {figures['steps']} | {watched} |")


if __name__ == "__main__":
    main()
