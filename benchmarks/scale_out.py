"""Rollout throughput of one SEAL run in 1 process and in 2 (``seal-lite run --processes N``) on this machine.

Each run is the real command on the same recipe: the quickstart's policy (SmolLM2-135M: its pip GGUF for the
rollouts on a CPU, llama.cpp with the current LoRA), real BFCL tasks, diagnoser off (rollouts are what is measured),
``--steps`` steps of ``--tasks`` tasks x G=4. With 2 processes each rolls out half of every step's tasks and the
store gathers them all. The processes split the machine's cores: a process's torch and llama.cpp use cores / N
threads (OMP_NUM_THREADS; ``seal-lite`` gives llama.cpp cores / processes-on-this-machine itself).

Throughput = trajectories stored / seconds the steps spent rolling out (each step's ``time/rollout_s``: from the
step's start until every process's groups are verified and gathered, diagnoser off), summed over the steps.
Wall time (start-up, model loading and the policy updates included) is printed beside it.

    python benchmarks/scale_out.py [--tasks 4] [--steps 2] [--max-new-tokens 48] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def play(processes: int, out: Path, args) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    overrides = {"name": "scale-out", "data.num_tasks": args.tasks * args.steps, "grpo.tasks_per_step": args.tasks,
                 "grpo.steps": args.steps, "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_turns": 1,
                 "rollout.max_model_calls": 2, "diagnoser.mode": "off"}
    command = [sys.executable, "-m", "seal_lite", "run", "--out", str(out), "--processes", str(processes),
               *[item for key, value in overrides.items() for item in ("--set", f"{key}={value}")]]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // processes))}
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=7200, check=False)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"seal-lite run --processes {processes} failed:\n{result.stderr[-3000:]}")
    with sqlite3.connect(out / "seal.db") as db:
        trajectories = db.execute("select count(*) from trajectories").fetchone()[0]
        rollout_s = db.execute("select sum(value) from metrics where name = 'time/rollout_s'").fetchone()[0]
        tokens = db.execute("select sum(num_model_tokens) from trajectories").fetchone()[0]
    return {"processes": processes, "threads": max(1, cores // processes), "trajectories": trajectories,
            "rollout_s": rollout_s, "model_tokens": tokens, "wall_s": wall,
            "throughput": trajectories / rollout_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step (even, so 2 processes share it)")
    parser.add_argument("--steps", type=int, default=2, help="SEAL steps per run")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="rollout.max_new_tokens")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="scale-out-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for processes in (1, 2):
        out = work / f"processes-{processes}"
        shutil.rmtree(out, ignore_errors=True)
        print(f"seal-lite run --processes {processes} ...", flush=True)
        rows.append(play(processes, out, args))
    print(f"\n{'processes':>9} {'threads':>7} {'trajectories':>12} {'rollout s':>9} {'traj/s':>7} {'wall s':>7}")
    for row in rows:
        print(f"{row['processes']:>9} {row['threads']:>7} {row['trajectories']:>12} {row['rollout_s']:>9.1f} "
              f"{row['throughput']:>7.3f} {row['wall_s']:>7.1f}")
    print(f"rollout throughput, 2 processes / 1: {rows[1]['throughput'] / rows[0]['throughput']:.2f}x")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
