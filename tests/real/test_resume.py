"""Checkpoints and resume: a run killed with SIGKILL mid-step resumes, and the store holds each step once.

The runs are real ``seal-lite run`` processes (tiny random policy, real BFCL tasks, diagnoser off). The kills
are real SIGKILLs, sent by the process to itself at chosen points so the test is deterministic. A random
policy never passes a task, so each process replaces a sampled message by the task's ground truth with
probability 1/2 (``tests.support.scripted_run.sometimes_right``): the LoRA weights and optimizer moments really
change, and an exact replay after a resume needs the restored RNG, weights and optimizer.
"""

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import yaml
from safetensors.torch import load_file

from tests.helpers import IMPORT_TESTS

# Runs ``seal-lite run ARGS`` and SIGKILLs itself at POINT of step STEP:
#   after_rollouts  the step's trajectories are in the store, its policy update has not happened yet
#   before_commit   transformers has written the step's checkpoint, the store has not marked the step done
KILLER = IMPORT_TESTS + textwrap.dedent("""
    import os, signal, sys
    from seal_lite.engines.store import Store

    point, step = sys.argv[1], int(sys.argv[2])
    save_step, commit = Store.save_step, Store.commit_checkpoint

    from tests.support.scripted_run import script_generation, sometimes_right

    script_generation(sometimes_right)

    def killing_save_step(self, row, *args, **kwargs):
        save_step(self, row, *args, **kwargs)
        if point == "after_rollouts" and row["step"] == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def killing_commit(self, done, *args, **kwargs):
        if point == "before_commit" and done == step:
            os.kill(os.getpid(), signal.SIGKILL)
        commit(self, done, *args, **kwargs)

    Store.save_step, Store.commit_checkpoint = killing_save_step, killing_commit
    from seal_lite.cli import main
    main(sys.argv[3:], prog_name="seal-lite")
""")


@pytest.fixture
def recipe_file(tmp_path, tiny_model_dir):
    recipe = {
        "name": "resume", "seed": 3,
        "policy": {"model": tiny_model_dir, "dtype": "float32"},
        "data": {"task_ids": ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]},
        "rollout": {"num_generations": 4, "max_new_tokens": 12, "max_model_calls": 1, "max_turns": 1,
                    "parser": "lenient",  # the random model then wins some groups: updates really run
                    "backend": "transformers"},  # the engine the scripted policy is routed through
        "interface": {"tool_format": "signatures"},  # short prompts: this tests the store and checkpoints
        "diagnoser": {"mode": "off"},
        "grpo": {"steps": 3, "tasks_per_step": 1, "learning_rate": 1e-2},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _seal_lite(*args, kill=None):
    command = [sys.executable, "-c", KILLER, *map(str, kill or ("none", 0)), "run", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)  # a hang guard


def _rows(db, sql):
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def test_killed_run_resumes_with_each_step_once(tmp_path, recipe_file):
    """With a frontier screen and a re-screen before every step, so their state is resumed too."""
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    screens = ("--set", "data.screen=4", "--set", "data.rescreen_every=1")

    first = _seal_lite(recipe_file, *screens, "--out", killed, kill=("after_rollouts", 2))
    assert first.returncode == -signal.SIGKILL, first.stderr
    db = killed / "seal.db"
    # step 2's rollouts are stored, but only step 1 is done
    assert _rows(db, "select step from steps order by step") == [(1,), (2,)]
    assert _rows(db, "select step from checkpoints") == [(1,)]

    assert _rows(db, "select distinct step from rescreens") == [(2,)]
    second = _seal_lite(recipe_file, *screens, "--out", killed, kill=("before_commit", 3))
    assert second.returncode == -signal.SIGKILL, second.stderr
    assert "resuming" in second.stdout.lower()
    assert (killed / "checkpoints" / "checkpoint-3").is_dir()  # written, never committed
    assert _rows(db, "select step from checkpoints order by step") == [(1,), (2,)]

    third = _seal_lite(recipe_file, *screens, "--out", killed)
    assert third.returncode == 0, third.stderr
    assert _seal_lite(recipe_file, *screens, "--out", reference).returncode == 0

    # each step exactly once, every row belongs to a stored step, the run finished
    assert _rows(db, "select step from steps order by step") == [(1,), (2,), (3,)]
    assert _rows(db, "select step from checkpoints order by step") == [(1,), (2,), (3,)]
    assert _rows(db, "select step, count(*) from trajectories group by step") == [(1, 4), (2, 4), (3, 4)]
    assert _rows(db, "select count(*) from turns where trajectory_id not in (select id from trajectories)") == [(0,)]
    assert _rows(db, "select count(*) from metrics where step not in (select step from steps)") == [(0,)]
    assert _rows(db, "select count(*) from steps where loss is null") == [(0,)]
    assert _rows(db, "select status from runs") == [("finished",)]

    # resuming restored the policy, optimizer, RNG and loop state: the run is the uninterrupted one
    columns = "id, task_id, reward, advantage, weight, num_tokens, messages"
    ordered = f"select {columns} from trajectories order by id"
    assert _rows(db, ordered) == _rows(reference / "seal.db", ordered)
    assert _rows(db, "select count(distinct reward) from trajectories where advantage != 0") == [(2,)]
    rho = "select step, name, value from metrics where name like 'rho/%' order by step, name"
    assert _rows(db, rho) == _rows(reference / "seal.db", rho)
    rescreens = "select step, task_id, samples, passes from rescreens order by step, task_id"
    assert _rows(db, rescreens) == _rows(reference / "seal.db", rescreens)
    assert [step for step, *_ in _rows(db, rescreens)] == [2, 2, 2, 3, 3, 3]  # the slice, before steps 2 and 3
    frontier = "select step, value from metrics where name = 'screen/frontier_tasks' order by step"
    assert _rows(db, frontier) == _rows(reference / "seal.db", frontier)
    resumed = load_file(killed / "adapter" / "adapter_model.safetensors")
    uninterrupted = load_file(reference / "adapter" / "adapter_model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    assert all((resumed[name] == uninterrupted[name]).all() for name in resumed)
    assert any(name.endswith("lora_B.weight") and resumed[name].abs().max() > 0 for name in resumed)  # it trained


def test_finished_run_is_not_resumed_and_other_recipe_is_refused(tmp_path, recipe_file):
    out = tmp_path / "run"
    assert _seal_lite(recipe_file, "--out", out, "--set", "grpo.steps=1", kill=("after_rollouts", 1)).returncode
    other = _seal_lite(recipe_file, "--out", out, "--set", "grpo.steps=2")
    assert other.returncode == 1
    assert "grpo.steps" in other.stderr and "--overwrite" in other.stderr
    assert _seal_lite(recipe_file, "--out", out, "--set", "grpo.steps=1").returncode == 0
    again = _seal_lite(recipe_file, "--out", out, "--set", "grpo.steps=1")
    assert again.returncode == 1 and "finished" in again.stderr
    stored = json.loads(_rows(out / "seal.db", "select recipe from runs")[0][0])
    assert stored["grpo"]["steps"] == 1
