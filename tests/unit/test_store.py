"""The run store: a step is written whole or not at all, and writing it again duplicates nothing."""

import sqlite3

import pytest

from seal_lite.engines.store import Store


def step_rows(turn_value="ok"):
    step = {"step": 1, "reward_mean": 0.5}
    trajectories = [{"id": "s1-t-g0", "step": 1, "task_id": "t", "reward": 1.0, "messages": [{"role": "user"}]}]
    turns = [{"trajectory_id": "s1-t-g0", "turn_index": 0, "label": "pass", "user_text": turn_value}]
    return step, trajectories, turns, {"reward/mean": 0.5}


def test_a_failing_write_leaves_no_part_of_the_step(tmp_path):
    store = Store(tmp_path / "seal.db")
    step, trajectories, turns, metrics = step_rows(turn_value=object())  # sqlite cannot bind an object
    with pytest.raises(sqlite3.ProgrammingError):
        store.save_step(step, trajectories, turns, metrics)
    assert store.steps() == [] and store.trajectories() == [] and store.metrics("reward/mean") == []


def test_writing_a_step_twice_keeps_one_copy(tmp_path):
    store = Store(tmp_path / "seal.db")
    for _ in range(2):
        store.save_step(*step_rows())
    assert len(store.steps()) == 1 and len(store.trajectories()) == 1
    assert store.label_counts() == {"pass": 1} and store.metrics("reward/mean") == [(1, 0.5)]
