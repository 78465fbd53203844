"""The run store: a step is written whole or not at all, and writing it again duplicates nothing; an old store
upgrades with every row kept, a newer one is refused; a read-only store writes nothing; the reads other modules
use."""

import contextlib
import gzip
import sqlite3
from pathlib import Path

import pytest

from seal_lite.core.errors import RunError
from seal_lite.engines import store as store_module
from seal_lite.engines.store import SCHEMA_VERSION, Store


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


# --- versions and migrations ---------------------------------------------------------------------------------
# seal_v1.db.gz: the store of a two-step quickstart run (2 tasks x 4 rollouts, diagnoser on), written by the code
# of before the migrations (schema 1, user_version 0), vacuumed and gzipped.
STORE_V1 = Path(__file__).resolve().parent.parent / "data" / "seal_v1.db.gz"
SCHEMA = "select type, name, tbl_name, sql from sqlite_master order by name"
V1_SCHEMA = "select type, name, tbl_name, sql from sqlite_master where tbl_name != 'validations' order by name"


def old_store(tmp_path) -> Path:
    path = tmp_path / "run" / "seal.db"
    path.parent.mkdir()
    path.write_bytes(gzip.decompress(STORE_V1.read_bytes()))
    return path


def read(path, sql):
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


def every_row(path) -> dict[str, list]:
    tables = [name for (name,) in read(path, "select name from sqlite_master where type = 'table'")]
    return {table: read(path, f"select * from [{table}] order by rowid") for table in tables}


def test_a_new_store_has_the_schema_of_the_code_before_migrations_byte_for_byte_plus_the_later_tables(tmp_path):
    Store(tmp_path / "new.db")
    assert read(tmp_path / "new.db", V1_SCHEMA) == read(old_store(tmp_path), SCHEMA)
    assert [name for (name,) in read(tmp_path / "new.db", "select name from sqlite_master where type = 'table' "
                                     "and tbl_name = 'validations'")] == ["validations"]  # version 2
    assert read(tmp_path / "new.db", "pragma user_version") == [(SCHEMA_VERSION,)] == [(2,)]


def test_an_old_store_is_upgraded_and_keeps_every_row(tmp_path):
    path = old_store(tmp_path)
    before = every_row(path)
    assert read(path, "pragma user_version") == [(0,)] and len(before["trajectories"]) == 16
    store = Store(path)
    assert read(path, "pragma user_version") == [(SCHEMA_VERSION,)] and every_row(path) == {**before, "validations": []}
    assert [row["step"] for row in store.steps()] == [1, 2] and store.last_checkpoint()["step"] == 2
    Store(path)  # opening an up-to-date store changes nothing
    assert every_row(path) == {**before, "validations": []}


def test_an_old_store_without_the_late_tables_and_columns_gets_them_empty(tmp_path):
    path = old_store(tmp_path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        for column in ("benchmark", "reward", "detail"):
            db.execute(f"alter table evaluations drop column {column}")
        db.execute("drop table rescreens")
    store = Store(path)
    assert set(store.db["evaluations"].columns_dict) == set(Store(tmp_path / "new.db").db["evaluations"].columns_dict)
    assert store.db["rescreens"].exists() and store.screen(step=3) == {}


def test_migrations_run_in_order_in_one_transaction(tmp_path, monkeypatch):
    path = old_store(tmp_path)
    before = every_row(path)

    def add_note(db):
        db["steps"].add_column("note", str)

    def fail(db):
        raise RuntimeError("migration 4 failed")

    monkeypatch.setattr(store_module, "MIGRATIONS", (*store_module.MIGRATIONS, add_note, fail))
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 4)
    with pytest.raises(RuntimeError, match="migration 4 failed"):
        Store(path)
    assert read(path, "pragma user_version") == [(0,)] and every_row(path) == before  # nothing of 1 to 3 stayed
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:3])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 3)
    assert "note" in Store(path).db["steps"].columns_dict and read(path, "pragma user_version") == [(3,)]


def test_a_store_from_a_newer_seal_lite_is_refused_untouched(tmp_path):
    path = tmp_path / "seal.db"
    writer = Store(path)
    writer.db.execute(f"pragma user_version = {SCHEMA_VERSION + 1}")
    writer.db.close()  # its write-ahead log goes into the file now, not whenever the collector frees the connection
    content = path.read_bytes()
    for open_store in (Store, Store.open_readonly):
        with pytest.raises(RunError, match=f"schema version {SCHEMA_VERSION + 1}, newer .* upgrade seal-lite"):
            open_store(path)
    assert path.read_bytes() == content


# --- read-only opening ----------------------------------------------------------------------------------------
def test_a_read_only_store_writes_creates_and_upgrades_nothing(tmp_path):
    path = old_store(tmp_path)
    path.chmod(0o444)
    content, files = path.read_bytes(), sorted(path.parent.iterdir())
    store = Store.open_readonly(path)
    assert store.step_count() == 2 and [row["step"] for row in store.checkpoints()] == [1, 2]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store.save_metrics(1, {"reward/mean": 1.0})
    assert path.read_bytes() == content and sorted(path.parent.iterdir()) == files  # no -wal, no -shm either
    empty = tmp_path / "empty.db"
    empty.touch()
    assert Store.open_readonly(empty).step_count() == 0 and empty.stat().st_size == 0
    with pytest.raises(RunError, match="does not exist"):
        Store.open_readonly(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_a_read_only_store_sees_what_an_open_writer_committed(tmp_path):
    writer = Store(tmp_path / "seal.db")
    writer.save_step(*step_rows())
    writer.commit_checkpoint(1, "checkpoints/step-1", {"rho": {}})
    reader = Store.open_readonly(tmp_path / "seal.db")
    assert reader.step_count() == 1 and reader.checkpoints()[0]["seal_state"] == {"rho": {}}


# --- the reads other modules use ------------------------------------------------------------------------------
def test_metric_series_matches_prefix_and_suffix_exactly(tmp_path):
    store = Store(tmp_path / "seal.db")
    store.save_metrics(2, {"labels/pass_rate": 0.5, "labels/pass": 3, "labels/passXrate": 9, "Labels/a_rate": 9,
                           "labels/_rate": 9, "rho/pass": 1.2})
    store.save_metrics(1, {"labels/pass_rate": 0.25, "labels/wrong_args_rate": 0.75})
    assert store.metric_series("labels/", "_rate") == {"pass": [(1, 0.25), (2, 0.5)], "wrong_args": [(1, 0.75)]}
    assert store.metric_series("rho/") == {"pass": [(2, 1.2)]}


def test_labels_by_step_rewards_by_group_and_checkpoints(tmp_path):
    store = Store(tmp_path / "seal.db")
    for step, rewards in ((2, [1.0, 0.0]), (1, [0.0, 0.0])):
        trajectories = [{"id": f"s{step}-t-g{g}", "step": step, "task_id": "t", "reward": r}
                        for g, r in enumerate(rewards)]
        turns = [{"trajectory_id": t["id"], "turn_index": i, "label": f"{t['id']}/{i}"} for t in trajectories
                 for i in (1, 0)]
        store.save_step({"step": step}, trajectories, turns, {})
        store.commit_checkpoint(step, f"checkpoints/step-{step}", {"step": step})
    assert store.labels_by_step() == {1: ["s1-t-g0/0", "s1-t-g0/1", "s1-t-g1/0", "s1-t-g1/1"],
                                      2: ["s2-t-g0/0", "s2-t-g0/1", "s2-t-g1/0", "s2-t-g1/1"]}
    assert store.rewards_by_group() == {(1, "t"): [0.0, 0.0], (2, "t"): [1.0, 0.0]}
    assert [(row["step"], row["seal_state"]) for row in store.checkpoints()] == [(1, {"step": 1}), (2, {"step": 2})]
    assert store.step_count() == 2
