"""Interface components on versus off: per-label failure rates per step, same seed and budget.

Runs the quickstart recipe twice through the CLI (or reads two existing runs): once with phi_schema, phi_err and
phi_cap on, once with all three off; everything else equal (seed, tasks, G, steps; the diagnoser off so both
arms cost the same). Prints, for each step, the mean reward and the rate of each failure label
(labels/<label>_rate, stored by the loop), and the interface versions each arm went through.

    .venv/bin/python benchmarks/interface_ablation.py [--steps 3] [--out runs/ablation] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import sqlite_utils

SMOKE = str(Path(__file__).resolve().parent.parent / "recipes" / "smoke.yaml")  # SmolLM2-135M: the quickstart when measured

ARMS = {
    "components on": ["interface.schema_cues=true", "interface.recovery_feedback=true", "interface.capability_hints=true"],
    "components off": ["interface.schema_cues=false", "interface.recovery_feedback=false",
                       "interface.capability_hints=false"],
}


def run_arm(name: str, settings: list[str], steps: int, out: Path, extra: list[str]) -> None:
    command = [sys.executable, "-m", "seal_lite", "run", SMOKE, "--out", str(out), "--overwrite",
               "--set", f"grpo.steps={steps}", "--set", "diagnoser.mode=off"]
    for setting in settings + extra:
        command += ["--set", setting]
    print(f"running {name}: {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def summarise(name: str, out: Path) -> None:
    db = sqlite_utils.Database(out / "seal.db")
    rows = db.execute("select step, name, value from metrics where name = 'reward/mean' or "
                      "(name like 'labels/%_rate') order by step, name").fetchall()
    per_step: dict[int, dict[str, float]] = {}
    for step, metric, value in rows:
        per_step.setdefault(step, {})[metric.removeprefix("labels/").removesuffix("_rate")] = value
    labels = sorted({label for values in per_step.values() for label in values} - {"reward/mean"})
    print(f"\n{name} ({out}):")
    print(f"  {'step':>4s} {'reward':>7s} " + " ".join(f"{label[:18]:>18s}" for label in labels))
    for step, values in sorted(per_step.items()):
        print(f"  {step:4d} {values.get('reward/mean', 0):7.3f} " +
              " ".join(f"{values.get(label, 0):18.3f}" for label in labels))
    for version in db["interface_versions"].rows_where(order_by="version"):
        print(f"  interface v{version['version']} (step {version['step']}): {version['reason']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/ablation"))
    parser.add_argument("--reuse", action="store_true", help="summarise existing runs in --out without running")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="more recipe overrides for both arms, e.g. --set policy.model=qwen2.5-coder-0.5b")
    args = parser.parse_args()
    for name, settings in ARMS.items():
        out = args.out / name.replace(" ", "-")
        if not args.reuse:
            run_arm(name, settings, args.steps, out, args.extra)
        summarise(name, out)


if __name__ == "__main__":
    main()
