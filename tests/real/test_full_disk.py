"""A full disk while a step's checkpoint is written or the step is committed: the run stops with one clear message
(no traceback), and the next run resumes from the last committed step.

Two ways to fill the disk, both at the real write call sites of a real ``seal-lite run`` (tiny random policy, real
BFCL tasks, diagnoser off):

* simulated, needs no privilege (runs everywhere): torch.save, which transformers calls for the checkpoint's
  optimizer, scheduler and RNG files, writes half the file and raises OSError(ENOSPC) as a full disk does; and
  the store's commit raises sqlite3's SQLITE_FULL "database or disk is full", as sqlite does;
* real: the run directory is on a 64 MiB tmpfs, filled with a ballast file just before the write, so every writer
  (safetensors, torch.save, json, sqlite) meets the kernel's own ENOSPC. Mounting needs root or an unprivileged
  user namespace (``unshare -Urm``); without either the test is skipped.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import yaml

# Runs ``seal-lite run ARGS`` with the disk "full" at WHERE of step STEP (WHERE: checkpoint, the write of the step's
# checkpoint; commit, the store's commit of the step) in one of two ways (HOW): simulated (raise as a full disk does)
# or fill (write a ballast file BALLAST until the disk is really full).
HARNESS = textwrap.dedent("""
    import errno, os, sqlite3, sys

    import torch
    from transformers import Trainer

    from seal_lite.engines.store import Store

    how, where, step, ballast = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    save, save_checkpoint, commit = torch.save, Trainer._save_checkpoint, Store.commit_checkpoint

    def fill():
        with open(ballast, "wb", buffering=0) as out:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        out.write(b"\\0" * size)
                except OSError as error:
                    assert error.errno == errno.ENOSPC, error

    def full_save(obj, path, *args, **kwargs):
        if how == "simulated" and where == "checkpoint" and f"checkpoint-{step}" in str(path):
            with open(path, "wb") as out:
                out.write(b"PK\\x03\\x04 half a file")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return save(obj, path, *args, **kwargs)

    def filling_save_checkpoint(self, *args, **kwargs):
        if how == "fill" and where == "checkpoint" and self.state.global_step == step:
            fill()
        return save_checkpoint(self, *args, **kwargs)

    def full_commit(self, done, *args, **kwargs):
        if where == "commit" and done == step:
            if how == "fill":
                fill()
            else:
                error = sqlite3.OperationalError("database or disk is full")
                error.sqlite_errorcode, error.sqlite_errorname = sqlite3.SQLITE_FULL, "SQLITE_FULL"
                raise error
        return commit(self, done, *args, **kwargs)

    torch.save, Trainer._save_checkpoint, Store.commit_checkpoint = full_save, filling_save_checkpoint, full_commit
    from seal_lite.cli import main
    main(sys.argv[5:], prog_name="seal-lite")
""")

STEPS = 3


@pytest.fixture
def recipe_file(tmp_path, tiny_model_dir):
    recipe = {
        "name": "full-disk", "seed": 1,
        "policy": {"model": tiny_model_dir, "dtype": "float32"},
        "data": {"task_ids": ["multi_turn_base_0", "multi_turn_base_1"]},
        "rollout": {"num_generations": 2, "max_new_tokens": 8, "max_model_calls": 1, "max_turns": 1},
        "interface": {"tool_format": "signatures"},
        "diagnoser": {"mode": "off"},
        "grpo": {"steps": STEPS, "tasks_per_step": 1, "keep_checkpoints": 1},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _command(how, where, step, ballast, recipe, out):
    return [sys.executable, "-c", HARNESS, how, where, str(step), str(ballast), "run", str(recipe), "--out", str(out)]


def _rows(db, sql):
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def _assert_stopped_cleanly(result, committed: int):
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1, result.stderr[-3000:]
    assert "is full" in error[0] and f"step {committed} of {STEPS} is its last committed step" in error[0]
    assert f"it resumes after step {committed}" in error[0]


def _assert_whole_run(db, checkpoints):
    """Each step once, nothing of an uncommitted step left, the run finished."""
    assert _rows(db, "select step from steps order by step") == [(step,) for step in range(1, STEPS + 1)]
    assert _rows(db, "select step from checkpoints order by step") == [(step,) for step in range(1, STEPS + 1)]
    assert _rows(db, "select step, count(*) from trajectories group by step") == [(s, 2) for s in range(1, STEPS + 1)]
    assert _rows(db, "select count(*) from turns where trajectory_id not in (select id from trajectories)") == [(0,)]
    assert _rows(db, "select count(*) from steps where loss is null") == [(0,)]
    assert _rows(db, "select status from runs") == [("finished",)]
    assert [path.name for path in checkpoints.glob("*checkpoint-*")] == [f"checkpoint-{STEPS}"]  # keep_checkpoints: 1


def test_full_disk_at_checkpoint_then_at_commit_simulated(tmp_path, recipe_file):
    out = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "200"}

    first = subprocess.run(_command("simulated", "checkpoint", 2, "-", recipe_file, out), capture_output=True,
                           text=True, env=env, timeout=900)
    _assert_stopped_cleanly(first, committed=1)
    assert "OSError: [Errno 28] No space left on device" in first.stderr
    assert _rows(out / "seal.db", "select step from checkpoints") == [(1,)]
    assert (out / "checkpoints" / "checkpoint-2").is_dir()  # half written, never committed

    second = subprocess.run(_command("simulated", "commit", 3, "-", recipe_file, out), capture_output=True,
                            text=True, env=env, timeout=900)
    assert "resuming" in second.stdout
    _assert_stopped_cleanly(second, committed=2)
    assert "database or disk is full" in second.stderr
    assert _rows(out / "seal.db", "select step from checkpoints order by step") == [(1,), (2,)]

    third = subprocess.run([sys.executable, "-m", "seal_lite", "run", str(recipe_file), "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=900)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "resuming" in third.stdout
    _assert_whole_run(out / "seal.db", out / "checkpoints")


def _namespace_prefix(probe_dir) -> list[str] | None:
    """How to run a command in a private mount namespace where it may mount a tmpfs: as root (unshare -m), else in
    an unprivileged user namespace (unshare -Urm); None if neither works here (tried on a 1 MiB tmpfs)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    for prefix in (["unshare", "-m"], ["unshare", "-Urm"]) if os.geteuid() == 0 else (["unshare", "-Urm"],):
        probe = subprocess.run([*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe_dir)],
                               capture_output=True, timeout=120)
        if probe.returncode == 0:
            return prefix
    return None


# Inside the private mount namespace: mount the tmpfs, run the three runs, and report what happened to RESULTS
# (the tmpfs disappears with the namespace).
REAL = textwrap.dedent("""
    import json, os, shutil, sqlite3, subprocess, sys
    harness, recipe, disk, results = sys.argv[1:5]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", disk], check=True)
    out, ballast = os.path.join(disk, "run"), os.path.join(disk, "ballast")
    report = []
    for how, where, step in (("fill", "checkpoint", 2), ("fill", "commit", 3), ("none", "-", 0)):
        command = [sys.executable, "-c", harness, how, where, str(step), ballast, "run", recipe, "--out", out]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
        committed = [row[0] for row in sqlite3.connect(os.path.join(out, "seal.db")).execute(
            "select step from checkpoints order by step")]
        kept = sorted(name for name in os.listdir(os.path.join(out, "checkpoints")) if "checkpoint-" in name)
        report.append({"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
                       "committed": committed, "checkpoints": kept})
        if os.path.exists(ballast):
            os.remove(ballast)  # space is freed before the next run
    source = sqlite3.connect(os.path.join(out, "seal.db"))
    source.backup(sqlite3.connect(os.path.join(results, "seal.db")))
    with open(os.path.join(results, "report.json"), "w") as file:
        json.dump(report, file)
""")


def test_full_disk_on_a_real_small_file_system(tmp_path, recipe_file):
    (tmp_path / "probe").mkdir()
    prefix = _namespace_prefix(tmp_path / "probe")
    if prefix is None:
        pytest.skip("cannot mount a tmpfs here (neither root nor unprivileged user namespaces)")
    disk, results = tmp_path / "disk", tmp_path / "results"
    disk.mkdir()
    results.mkdir()
    done = subprocess.run([*prefix, sys.executable, "-c", REAL, HARNESS, str(recipe_file), str(disk), str(results)],
                          capture_output=True, text=True, timeout=2700)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second, third = json.loads((results / "report.json").read_text())

    _assert_stopped_cleanly(subprocess.CompletedProcess([], first["returncode"], first["stdout"], first["stderr"]), 1)
    assert first["committed"] == [1] and "checkpoint-2" in first["checkpoints"]
    assert "resuming" in second["stdout"]
    _assert_stopped_cleanly(subprocess.CompletedProcess([], second["returncode"], second["stdout"], second["stderr"]),
                            2)
    assert second["committed"] == [1, 2]
    assert third["returncode"] == 0 and "resuming" in third["stdout"], third["stderr"][-3000:]
    assert third["committed"] == [1, 2, 3] and third["checkpoints"] == [f"checkpoint-{STEPS}"]
    db = results / "seal.db"
    assert _rows(db, "select step from steps order by step") == [(1,), (2,), (3,)]
    assert _rows(db, "select step, count(*) from trajectories group by step") == [(1, 2), (2, 2), (3, 2)]
    assert _rows(db, "select status from runs") == [("finished",)]
