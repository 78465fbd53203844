"""Where a SEAL step's time goes, for the quickstart recipe (or any recipe with --set), printed as a table.

Runs the recipe in a temporary directory and reads the ``time/*`` metrics every step stores:
sync (exporting the LoRA for llama.cpp), render (chat template + tokenizer), prefill and decode (the rollout
engine), environment (BFCL tools), verify (official verdict + turn labels), diagnoser (the local llama.cpp
model), store (the step's SQLite transaction) and update (TRL's policy update and the checkpoint). ``--compare``
runs the recipe once per rollout backend (transformers, then llamacpp) and prints the wall times side by side.

    python benchmarks/step_profile.py                 # the quickstart, default backend
    python benchmarks/step_profile.py --compare       # transformers vs llama.cpp rollouts, same recipe
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.store import Store
from seal_lite.runs.train import run

PHASES = ["sync", "render", "prefill", "decode", "environment", "verify", "diagnoser", "store", "update"]
OVERHEAD = ["render", "environment", "verify", "store"]  # what the loop adds around generation and training


def profile_run(recipe) -> tuple[float, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory() as directory:
        started = time.time()
        run(recipe, Path(directory))
        wall = time.time() - started
        store = Store(Path(directory) / "seal.db")
        rows = []
        for step in store.steps():
            metrics = dict(store.db.execute("select name, value from metrics where step = ?", [step["step"]]).fetchall())
            row = {phase: metrics.get(f"time/{phase}_s", 0.0) for phase in PHASES}
            row["diagnoser"] = metrics.get("diagnoser/seconds", 0.0)
            row["total"] = metrics["time/rollout_s"] + metrics.get("time/update_s", 0.0)
            row["other"] = row["total"] - sum(row[phase] for phase in PHASES)
            rows.append(row)
    return wall, rows


def print_table(rows: list[dict[str, float]]) -> None:
    print(f"{'phase':12s}" + "".join(f"{'step ' + str(i + 1):>16s}" for i in range(len(rows))))
    for phase in [*PHASES, "other", "total"]:
        cells = "".join(f"{row[phase]:9.2f} s {100 * row[phase] / row['total']:4.1f}%" for row in rows)
        print(f"{phase:12s}{cells}")
    for label, phases in (("loop overhead (render+env+verify+store)", OVERHEAD),
                          ("... plus the LLM diagnoser", [*OVERHEAD, "diagnoser"])):
        shares = ", ".join(f"{100 * sum(row[p] for p in phases) / row['total']:.2f}%" for row in rows)
        print(f"{label}: {shares} of step time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", help="recipe file (default: the quickstart)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--compare", action="store_true", help="transformers vs llamacpp rollouts, same recipe")
    args = parser.parse_args()
    overrides = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.overrides)}
    backends = ["transformers", "llamacpp"] if args.compare else [None]
    walls = {}
    for backend in backends:
        recipe = load_recipe(args.recipe, overrides | ({"rollout.backend": backend} if backend else {}))
        wall, rows = profile_run(recipe)
        walls[backend or recipe.rollout.backend] = wall
        print(f"\n{recipe.name}, rollout.backend={recipe.rollout.backend}: {wall:.0f} s wall")
        print_table(rows)
    if args.compare:
        print(f"\nwall time: transformers {walls['transformers']:.0f} s, llamacpp {walls['llamacpp']:.0f} s "
              f"({walls['transformers'] / walls['llamacpp']:.2f}x)")


if __name__ == "__main__":
    main()
