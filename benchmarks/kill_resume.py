"""Crash figures: SIGKILL `seal-lite run` at N seeded random moments across the phases of a step, resume each time,
and compare the final store with an uninterrupted run's.

    python benchmarks/kill_resume.py                   # 20 kills, seed 0
    python benchmarks/kill_resume.py --kills 40 --seed 1 --keep /tmp/kills

Every process is a real ``seal-lite run`` (its CLI, store, trainer and checkpoints) on a fast recipe: a tiny random
2-layer Llama with SmolLM2's tokenizer from a local directory, three real BFCL tasks, one turn, 12 new tokens,
and the real in-process diagnoser (SmolLM2-135M from its pip GGUF, one failure per step). A random model never
passes a task, so every update would be a no-op; as in tests/real/test_resume.py each sampled message is replaced by
the task's ground truth with probability 1/2, drawn from torch's RNG after the model generated, so groups mix
rewards 1 and 0, the LoRA and the optimizer really change, and an exact replay needs the restored RNG, weights
and optimizer. ``grpo.keep_checkpoints`` is 1, the most fragile setting (one checkpoint on disk at a time).

The phases of a step, as the harness marks them (each a span of wall time in the process):
    rollout     SEAL step called: tasks rolled out, verified, labelled
    diagnosis   the local model explains the step's new failures
    commit      a store transaction: the step's rows (before the update), or the step marked done with its
                checkpoint (after it), then old checkpoints pruned
    update      TRL's policy update, with its figures written to the store
    checkpoint  transformers writes the step's checkpoint (adapter, optimizer, RNG, trainer state)

Kill i aims at phase PHASES[i % 5] of the first or second step the process plays (diagnosis kills: of a step
not diagnosed yet, since a replayed step finds its diagnoses in the store's cache), at a uniformly random moment
of that phase's span as measured in the uninterrupted run. A timer thread in the process sends SIGKILL to it
(the process cannot react to it, as with ``kill -9`` from outside) and first logs the phase it landed in, which
is what the figures count: a phase shorter in this process than in the uninterrupted one lets the kill land in
a later phase. When a round's run has committed its last step, the next process finishes it (unless the kill
came after it had finished), its store is compared, and the next kill starts a new round in a fresh directory.

Figures:
    kills survived    the next process resumed the run and the round's final store equals the uninterrupted run's
    steps lost        steps of the uninterrupted run missing from a round's final store, or with rows missing
    steps duplicated  steps stored more than once: rows beyond the uninterrupted run's, or rows of no stored step
    steps redone      uncommitted steps whose rows a kill left behind, rolled back and played again on resume
    store equal       every table's deterministic content equals the uninterrupted run's (see ``content``)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent  # the harness imports tests.support from the repository
PHASES = ["rollout", "diagnosis", "commit", "update", "checkpoint"]
STEPS = 3

# ``seal-lite run`` with phase marks, the ground-truth mix, and an optional scheduled SIGKILL.
HARNESS = textwrap.dedent("""
    import json, os, signal, sys, threading, time

    spec = json.loads(sys.argv[1])
    events, kill = open(spec["events"], "a", buffering=1), spec["kill"]
    current, seen = {"phase": "start", "step": 0}, {}

    def log(**record):
        events.write(json.dumps({"t": time.monotonic(), **record}) + "\\n")

    def die():
        log(killed_in=current["phase"], step=current["step"])
        os.kill(os.getpid(), signal.SIGKILL)

    def mark(phase, step, edge):
        current.update(phase=phase if edge == "enter" else f"after {phase}", step=step)
        log(phase=phase, step=step, edge=edge)
        if edge == "enter" and kill and (kill["phase"], kill["step"]) == (phase, step):
            seen[phase] = seen.get(phase, 0) + 1
            if seen[phase] - 1 == kill["occurrence"]:
                threading.Timer(kill["delay"], die).start()

    def spans(phase, step_of):
        def wrap(function):
            def wrapped(*args, **kwargs):
                step = step_of(*args, **kwargs)
                mark(phase, step, "enter")
                try:
                    return function(*args, **kwargs)
                finally:
                    mark(phase, step, "exit")
            return wrapped
        return wrap

    import torch
    from transformers import Trainer

    from seal_lite.step import algorithm
    from seal_lite.engines.store import Store
    from tests.support.scripted_run import script_generation, sometimes_right
    from seal_lite.training import grpo

    script_generation(sometimes_right)  # a random policy never passes: mix in the ground truth, so updates happen

    call = algorithm.SealStep.__call__

    def seal_step(self, prompts):
        step = self.step + 1
        mark("rollout", step, "enter")
        batch = call(self, prompts)
        mark("update", step, "enter")  # the batch goes back to TRL, which updates the policy
        return batch

    algorithm.SealStep.__call__ = seal_step
    algorithm.SealStep._explain = spans("diagnosis", lambda self, *a, **k: self.step)(algorithm.SealStep._explain)
    Store.save_step = spans("commit", lambda self, row, *a, **k: row["step"])(Store.save_step)
    Trainer._save_checkpoint = spans("checkpoint", lambda self, *a, **k: self.state.global_step)(
        Trainer._save_checkpoint)
    grpo.CheckpointCallback.on_save = spans("commit", lambda self, args, state, *a, **k: state.global_step)(
        grpo.CheckpointCallback.on_save)

    from seal_lite.cli import main
    main(sys.argv[2:], prog_name="seal-lite")
""")


def make_tiny_model(path: Path) -> None:
    """tests/conftest.py's tiny_model_dir: a random 2-layer Llama with SmolLM2's real tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from seal_lite.engines.model_sources import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"), clean_up_tokenization_spaces=False)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def write_recipe(path: Path, model_dir: Path) -> None:
    recipe = {
        "name": "kill-resume", "seed": 3,
        "policy": {"model": str(model_dir), "dtype": "float32"},
        "data": {"task_ids": ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]},
        "rollout": {"num_generations": 4, "max_new_tokens": 12, "max_model_calls": 1, "max_turns": 1,
                    "parser": "lenient", "backend": "transformers"},  # the engine the scripted policy goes through
        "interface": {"tool_format": "signatures"},
        # answers must not depend on the machine's load: a request never times out here
        "diagnoser": {"mode": "in_process", "model": "smollm2-135m", "max_per_step": 1, "max_tokens": 32,
                      "n_threads": 1, "timeout_s": 3600},
        "grpo": {"steps": STEPS, "tasks_per_step": 1, "learning_rate": 1e-2, "keep_checkpoints": 1},
    }
    path.write_text(yaml.safe_dump(recipe))


def play(recipe: Path, out: Path, events: Path, kill: dict | None) -> subprocess.CompletedProcess:
    spec = json.dumps({"events": str(events), "kill": kill})
    command = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + HARNESS, spec, "run",
               str(recipe), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"},
                          timeout=3600, check=False)  # a hang guard


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def phase_spans(events: list[dict]) -> dict[str, list[float]]:
    """Seconds each phase lasted, per occurrence: from its mark to the next mark."""
    spans: dict[str, list[float]] = {}
    marks = [event for event in events if "phase" in event]
    for mark, following in zip(marks, marks[1:]):
        if mark["edge"] == "enter":
            spans.setdefault(mark["phase"], []).append(following["t"] - mark["t"])
    return spans


# --- the store's deterministic content ------------------------------------------------------------------------

# Columns that record when or how long, not what: left out of the comparison.
WALL_CLOCK = {"runs": {"started_at", "finished_at", "wall_time_s"}, "steps": {"started_at", "finished_at"},
              "diagnoses": {"seconds"}, "checkpoints": {"created_at"}, "evaluations": {"created_at"}}
# Metrics that count time (time/*, TRL's step_time) or what the diagnoser's cache saved: a replayed step finds the
# answers its killed first attempt stored, so it asks fewer questions, with the same answers.
COST_METRICS = ("time/", "grpo/step_time", "diagnoser/cached", "diagnoser/asked", "diagnoser/seconds",
                "diagnoser/invalid", "diagnoser/failed", "diagnoser/redactions", "diagnoser/skipped",
                "diagnoser/restarts")


def content(db: Path) -> dict[str, list[tuple]]:
    """Every table's rows, sorted, without wall-clock columns and cost metrics. Floats are compared exactly."""
    tables = {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        names = [row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")]
        for name in sorted(names):
            columns = [row[1] for row in connection.execute(f"pragma table_info({name})")
                       if row[1] not in WALL_CLOCK.get(name, set())]
            rows = connection.execute(f"select {', '.join(columns)} from {name}").fetchall()
            if name == "metrics":
                rows = [row for row in rows if not str(row[columns.index("name")]).startswith(COST_METRICS)]
            tables[name] = sorted(rows, key=repr)
    return tables


def differences(final: dict, reference: dict) -> list[str]:
    lines = []
    for table in sorted(set(final) | set(reference)):
        a, b = final.get(table, []), reference.get(table, [])
        if a != b:
            missing, extra = len([row for row in b if row not in a]), len([row for row in a if row not in b])
            lines.append(f"{table}: {missing} rows of the uninterrupted run missing, {extra} rows not in it")
    return lines


def step_counts(db: Path) -> dict[int, dict[str, int]]:
    """Per step number: rows in steps, checkpoints, trajectories and metrics (for lost/duplicated steps)."""
    counts: dict[int, dict[str, int]] = {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        for table in ("steps", "checkpoints", "trajectories", "metrics", "interface_versions"):
            for step, n in connection.execute(f"select step, count(*) from {table} group by step"):
                counts.setdefault(step, {})[table] = n
        orphans = connection.execute("select count(*) from turns where trajectory_id not in "
                                     "(select id from trajectories)").fetchone()[0]
    counts.setdefault(-1, {})["orphan turns"] = orphans
    return counts


def lost_and_duplicated(final: Path, reference: Path) -> tuple[list[int], list[int]]:
    a, b = step_counts(final), step_counts(reference)
    ref_metrics = _countable_metrics(reference)
    fin_metrics = _countable_metrics(final)
    lost, duplicated = [], []
    for step in sorted(set(a) | set(b)):
        if step == -1:
            continue
        mine, theirs = a.get(step, {}), b.get(step, {})
        mine = {**mine, "metrics": fin_metrics.get(step, 0)}
        theirs = {**theirs, "metrics": ref_metrics.get(step, 0)}
        if any(mine.get(table, 0) < n for table, n in theirs.items()):
            lost.append(step)
        if any(n > theirs.get(table, 0) for table, n in mine.items()):
            duplicated.append(step)
    if a.get(-1, {}).get("orphan turns"):
        duplicated.append(-1)
    return lost, duplicated


def _countable_metrics(db: Path) -> dict[int, int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        rows = connection.execute("select step, name from metrics").fetchall()
    counts = Counter(step for step, name in rows if not name.startswith(COST_METRICS))
    return dict(counts)


def run_status(db: Path) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        row = connection.execute("select status from runs").fetchone()
    return row[0] if row else None


def committed(db: Path) -> tuple[int, int]:
    """(last committed step, number of step rows stored)."""
    if not db.exists():
        return 0, 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            done = connection.execute("select coalesce(max(step), 0) from checkpoints").fetchone()[0]
            stored = connection.execute("select count(*) from steps").fetchone()[0]
    except sqlite3.Error:
        return 0, 0
    return done, stored


def adapters_equal(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    first, second = load_file(a / "adapter" / "adapter_model.safetensors"), load_file(b / "adapter" /
                                                                                      "adapter_model.safetensors")
    return first.keys() == second.keys() and all((first[name] == second[name]).all() for name in first)


# --- the benchmark --------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs to send (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (default 0)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    model_dir, recipe = work / "tiny-model", work / "recipe.yaml"
    if not (model_dir / "config.json").exists():
        make_tiny_model(model_dir)
    write_recipe(recipe, model_dir)

    print(f"uninterrupted run ({STEPS} steps) ...", flush=True)
    reference = work / "uninterrupted"
    shutil.rmtree(reference, ignore_errors=True)
    result = play(recipe, reference, work / "uninterrupted.events", None)
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return 1
    spans = phase_spans(read_events(work / "uninterrupted.events"))
    span = {phase: sum(times) / len(times) for phase, times in spans.items()}
    print("phase spans in the uninterrupted run (mean s): "
          + ", ".join(f"{phase} {span[phase]:.3f}" for phase in PHASES), flush=True)
    reference_content = content(reference / "seal.db")

    rng = random.Random(args.seed)
    rows, rounds, landed = [], [], Counter()
    round_index, out, processes = 0, None, 1
    for index in range(args.kills):
        if out is None:
            round_index += 1
            out = work / f"round-{round_index}"
            shutil.rmtree(out, ignore_errors=True)
            round_kills, diagnosed = [], 0
        done, stored = committed(out / "seal.db")
        phase = PHASES[index % len(PHASES)]
        # a step whose rows were ever stored has its diagnoses in the store's cache (a rollback keeps them), so its
        # replay skips the diagnoser: diagnosis kills aim at a step not diagnosed yet, where there is one
        first = max(done, diagnosed) + 1 if phase == "diagnosis" else done + 1
        step = min(STEPS, first + (rng.random() < 0.5))
        occurrence = rng.randrange(2) if phase == "commit" else 0  # the step's rows, or the step marked done
        delay = rng.random() * span[phase]
        events = work / f"kill-{index + 1:02d}.events"
        result = play(recipe, out, events, {"phase": phase, "step": step, "occurrence": occurrence, "delay": delay})
        processes += 1
        kill = next((event for event in read_events(events) if "killed_in" in event), None)
        resumed = "resuming" in result.stdout  # this process picked up what the previous kill left
        after, stored_after = committed(out / "seal.db")
        diagnosed = max(diagnosed, stored_after)
        row = {"kill": index + 1, "round": round_index, "aimed": f"{phase}{'/done' if occurrence else ''} s{step}",
               "delay_s": round(delay, 3), "landed": kill["killed_in"] if kill else "-",
               "landed_step": kill["step"] if kill else None, "returncode": result.returncode,
               "picked_up": resumed, "committed": f"{done} -> {after}",
               "left_uncommitted": max(0, stored_after - after)}
        rows.append(row)
        round_kills.append(row)
        if kill is None or result.returncode != -9:
            print(f"kill {index + 1}: the process was not killed (exit {result.returncode}):\n{result.stderr[-2000:]}",
                  file=sys.stderr)
        landed[row["landed"]] += 1
        print(f"kill {index + 1:2d}  round {round_index}  aimed {row['aimed']:<18} +{delay:6.3f}s  landed "
              f"{row['landed']:<18} step {row['landed_step']}  committed {row['committed']}", flush=True)
        if after == STEPS or index == args.kills - 1:  # finish the round: resume until the run is done
            if run_status(out / "seal.db") == "finished":  # the kill came after the run had finished (at exit)
                finished, picked_up, final_error = True, True, ""
            else:
                final = play(recipe, out, work / f"round-{round_index}-final.events", None)
                processes += 1
                finished, picked_up, final_error = final.returncode == 0, "resuming" in final.stdout, final.stderr[-2000:]
            round_content = content(out / "seal.db")
            lost, duplicated = lost_and_duplicated(out / "seal.db", reference / "seal.db")
            equal = round_content == reference_content
            rounds.append({"round": round_index, "kills": len(round_kills), "finished": finished,
                           "final_error": "" if finished else final_error, "lost": lost, "duplicated": duplicated,
                           "equal": equal, "differences": differences(round_content, reference_content),
                           "adapter_equal": finished and adapters_equal(out, reference)})
            # a kill is survived when the next process picked its run up and the round ends equal
            next_picked_up = [row["picked_up"] for row in round_kills[1:]] + [picked_up]
            for kill_row, picked_up in zip(round_kills, next_picked_up):
                kill_row["survived"] = picked_up and finished and equal
            out = None

    survived = sum(row.get("survived", False) for row in rows)
    redone = sum(row["left_uncommitted"] for row in rows)
    print()
    print(f"kills: {len(rows)} in {len(rounds)} rounds ({processes} seal-lite processes, "
          f"{time.time() - started:.0f} s in all)")
    print("landed in: " + ", ".join(f"{phase} {landed[phase]}" for phase in sorted(landed)))
    print(f"kills survived: {survived}/{len(rows)}")
    print(f"steps lost: {sum(len(r['lost']) for r in rounds)}, steps duplicated: "
          f"{sum(len(r['duplicated']) for r in rounds)}, steps redone after a kill: {redone}")
    for r in rounds:
        state = "equal" if r["equal"] else "DIFFERENT: " + "; ".join(r["differences"])
        print(f"round {r['round']}: {r['kills']} kills, finished {r['finished']}, final store {state} to the "
              f"uninterrupted run's, adapter {'equal' if r['adapter_equal'] else 'DIFFERENT'}")
        if not r["finished"]:
            print(f"  the resumed run failed:\n{r['final_error']}")
    (work / "kills.json").write_text(json.dumps({"kills": rows, "rounds": rounds, "spans": span}, indent=2))
    print(f"details: {work / 'kills.json'}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    ok = all(r["equal"] and r["adapter_equal"] and not r["lost"] and not r["duplicated"] for r in rounds)
    return 0 if ok and survived == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
