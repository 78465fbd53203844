"""The run's store: one SQLite file per run (``<out>/seal.db``), written through sqlite-utils.

Tables (documented in docs/store.md):
    runs                one row: recipe, model, status, timing
    tasks               BFCL tasks used by the run
    steps               one row per SEAL step: reward, weights, loss, interface version
    trajectories        one row per rollout: reward, advantage, weight, messages
    turns               one row per ground-truth user turn of a trajectory: calls, results, label, cause
    diagnoses           the local diagnoser's answers, keyed by the content hash of the failure (a cache)
    interface_versions  the rendered training interface, version by version
    metrics             (step, name, value), namespaced like reward/mean or labels/pass
    checkpoints         one row per committed step: its checkpoint directory and the SEAL loop's state
    evaluations         ``seal-lite eval`` results: one row per (model evaluated, task), BFCL's and τ²-bench's
    screen              the frontier screen (``data.screen``): each task's passes out of its samples
    rescreens           the re-screens during training (``data.rescreen_every``), by the step they came before
    validations         validation during training (recipe section ``validation``): one row per (step, task)

A step's rollouts, turns and metrics are written in one transaction (``Database.atomic``: sqlite-utils'
own writes nest inside it as savepoints), so a crash leaves a whole step or nothing. Primary keys are explicit
and writes are upserts, so writing a step twice never duplicates rows. A step counts as done once its
``checkpoints`` row exists (written after the policy update and its checkpoint); ``rollback_after`` removes the
rows of steps a killed run did not finish, so a resumed run writes each step exactly once.

Opening. ``Store(path)`` opens for writing: it creates the file, or upgrades an older one, and sets WAL mode.
``Store.open_readonly(path)`` is for readers that must not write (a report, the message after a full disk): it
never writes, never changes the journal mode and creates no table and no file.

Schema versions. The file's ``PRAGMA user_version`` is its schema version; ``MIGRATIONS[n]`` takes a store from
version n to n + 1 and ``SCHEMA_VERSION`` (their count) is the version this code writes. Opening for writing runs
the missing migrations and sets the new version in one transaction; a store from a newer seal-lite is refused
with a ``RunError``, writable or not. Version 0 is a store written before the migrations existed (or an empty
file). ``runs.schema_version`` only records the version a run was started under. How to add a migration:
docs/store.md.

Reads for other modules, so that none of them writes SQL: ``steps``, ``trajectories``, ``trajectory``,
``turns``, ``turn_labels``, ``label_counts``, ``labels_by_step`` (step -> its turn labels), ``rewards_by_group``
((step, task) -> rewards), ``metrics`` (one name), ``metric_per_step`` (one name, aligned to ``steps``),
``metric_series`` (every name with a prefix and suffix, such as ``labels/<label>_rate``), ``step_count``,
``checkpoints``, ``last_checkpoint``, ``interface_versions``, ``diagnosis``, ``evaluations``, ``validations``,
``screen``, ``run``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

from seal_lite.core.errors import RunError

# The tables as version 1 creates them. Frozen: a later schema changes them through a new migration, never here.
_V1_TABLES = {
    "runs": (
        {"id": str, "name": str, "recipe": str, "model": str, "status": str, "started_at": float,
         "finished_at": float, "wall_time_s": float, "schema_version": int},
        "id",
    ),
    "tasks": ({"id": str, "category": str, "num_turns": int, "involved_classes": str}, "id"),
    "steps": (
        {"step": int, "started_at": float, "finished_at": float, "reward_mean": float, "loss": float,
         "weight_min": float, "weight_max": float, "interface_version": int, "num_trajectories": int},
        "step",
    ),
    "trajectories": (
        {"id": str, "step": int, "task_id": str, "group_index": int, "reward": float, "advantage": float,
         "weight": float, "weighted_advantage": float, "num_model_calls": int, "num_tokens": int,
         "num_model_tokens": int, "stop_reason": str, "interface_version": int, "messages": str},
        "id",
    ),
    "turns": (
        {"trajectory_id": str, "turn_index": int, "user_text": str, "model_calls": str, "results": str,
         "gt_calls": str, "label": str, "cause": str, "evidence": str, "diagnosis_key": str},
        ("trajectory_id", "turn_index"),
    ),
    "diagnoses": (
        {"key": str, "model": str, "status": str, "label": str, "cause": str, "culprit_call_index": int,
         "explanation": str, "recovery_hint": str, "redactions": int, "seconds": float, "error": str},
        "key",
    ),
    "interface_versions": (
        {"version": int, "parent": int, "step": int, "components": str, "system_prompt_cues": str,
         "guidelines": str, "statistics": str, "reason": str},
        "version",
    ),
    "metrics": ({"step": int, "name": str, "value": float}, ("step", "name")),
    "checkpoints": ({"step": int, "path": str, "seal_state": str, "created_at": float}, "step"),
    "evaluations": (
        {"model": str, "task_id": str, "category": str, "split": str, "valid": int, "turns_passed": int, "turns": int,
         "labels": str, "created_at": float, "benchmark": str, "reward": float, "detail": str},
        ("model", "task_id"),
    ),
    "screen": ({"task_id": str, "samples": int, "passes": int, "seconds": float, "created_at": float}, "task_id"),
    "rescreens": ({"step": int, "task_id": str, "samples": int, "passes": int, "seconds": float, "created_at": float},
                  ("step", "task_id")),
}


def _create_v1_tables(db: sqlite_utils.Database) -> None:
    """0 -> 1: the tables of version 1. A store written before the migrations existed may lack the tables and
    columns added during version 1's life (screen, rescreens; evaluations.benchmark, reward, detail): they are
    added empty, as that code added them on opening."""
    for name, (columns, pk) in _V1_TABLES.items():
        table = db[name]
        if not table.exists():
            table.create(columns, pk=pk)
            continue
        present = table.columns_dict
        for column, kind in columns.items():
            if column not in present:
                table.add_column(column, kind)
    db["turns"].create_index(["label"], if_not_exists=True)
    db["trajectories"].create_index(["step"], if_not_exists=True)


def _add_validations(db: sqlite_utils.Database) -> None:
    """1 -> 2: the validations table (validation during training; step 0: before the first step)."""
    db["validations"].create({"step": int, "task_id": str, "category": str, "valid": int, "turns_passed": int,
                              "turns": int, "labels": str, "created_at": float}, pk=("step", "task_id"))


# MIGRATIONS[n] takes a store from schema version n to n + 1. Append one to change the schema (docs/store.md).
MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (_create_v1_tables, _add_validations)
SCHEMA_VERSION = len(MIGRATIONS)


class Store:
    """Nouns and verbs over the run database. The library never prints; callers decide what to show."""

    def __init__(self, path: str | Path):
        """Open the store at ``path`` for writing: create it, or upgrade an older one to ``SCHEMA_VERSION``."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(self.path)
        _checked_version(self.db, self.path)  # before anything is written to a file this code does not understand
        self.db.conn.execute("PRAGMA journal_mode=WAL")
        _upgrade(self.db, self.path)

    @classmethod
    def open_readonly(cls, path: str | Path) -> Store:
        """Open an existing store only to read it: nothing is written, created or upgraded (the disk may be
        full). An older store is read as it is; a newer one is refused. Meant for short reads: see _read_uri."""
        path = Path(path)
        if not path.is_file():
            raise RunError(f"{path} does not exist; pass a run directory made by `seal-lite run`")
        store = cls.__new__(cls)
        store.path = path
        store.db = sqlite_utils.Database(sqlite3.connect(_read_uri(path), uri=True))
        _checked_version(store.db, path)
        return store

    # --- run -------------------------------------------------------------------------------------------
    def start_run(self, name: str, recipe: dict, model: str) -> None:
        self.db["runs"].upsert(
            {"id": name, "name": name, "recipe": json.dumps(recipe), "model": model, "status": "running",
             "started_at": time.time(), "schema_version": SCHEMA_VERSION},
            pk="id",
        )

    def finish_run(self, name: str, status: str, wall_time_s: float) -> None:
        self.db["runs"].update(name, {"status": status, "finished_at": time.time(), "wall_time_s": wall_time_s})

    def run(self) -> dict:
        rows = list(self.db["runs"].rows)
        if not rows:
            raise LookupError(f"{self.path} holds no run")
        return rows[0]

    # --- writes -----------------------------------------------------------------------------------------
    def save_tasks(self, tasks: list[dict]) -> None:
        with self.db.atomic():
            self.db["tasks"].upsert_all(tasks, pk="id")

    def save_interface_version(self, version: dict) -> None:
        with self.db.atomic():
            self.db["interface_versions"].upsert(_encode(version), pk="version", alter=True)

    def save_step(self, step: dict, trajectories: list[dict], turns: list[dict], metrics: dict[str, float],
                  diagnoses: list[dict] = (), interface_version: dict | None = None) -> None:
        """Write one step's rows, and the interface version it produced, in a single transaction."""
        with self.db.atomic():
            self.db["steps"].upsert(step, pk="step")
            self.db["trajectories"].upsert_all([_encode(t) for t in trajectories], pk="id")
            self.db["turns"].upsert_all([_encode(t) for t in turns], pk=("trajectory_id", "turn_index"), alter=True)
            self.db["diagnoses"].upsert_all(list(diagnoses), pk="key")
            if interface_version:
                self.save_interface_version(interface_version)
            self._upsert_metrics(step["step"], metrics)

    def save_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self.db.atomic():
            self._upsert_metrics(step, metrics)

    def _upsert_metrics(self, step: int, metrics: dict[str, float]) -> None:
        rows = [{"step": step, "name": name, "value": float(value)} for name, value in metrics.items()]
        self.db["metrics"].upsert_all(rows, pk=("step", "name"))

    def commit_checkpoint(self, step: int, path: str, seal_state: dict) -> None:
        """Mark ``step`` done: its checkpoint is complete on disk and ``seal_state`` restores the loop."""
        with self.db.atomic():
            self.db["checkpoints"].upsert({"step": step, "path": path, "seal_state": json.dumps(seal_state),
                                           "created_at": time.time()}, pk="step")

    def last_checkpoint(self) -> dict | None:
        rows = list(self.db["checkpoints"].rows_where(order_by="step desc", limit=1))
        return _decode(rows[0], "seal_state") if rows else None

    def rollback_after(self, step: int) -> int:
        """Delete everything written by steps after ``step`` (an unfinished step of a killed run); return how many
        steps were removed. Diagnoses stay: they are a content-keyed cache, valid whatever step asked."""
        removed = self.db.execute("select count(*) from steps where step > ?", [step]).fetchone()[0]
        with self.db.atomic():
            self.db.execute("delete from turns where trajectory_id in (select id from trajectories where step > ?)",
                            [step])
            for table in ("trajectories", "steps", "metrics", "interface_versions", "checkpoints", "rescreens",
                          "validations"):
                self.db.execute(f"delete from {table} where step > ?", [step])
        return removed

    def save_evaluations(self, rows: list[dict]) -> None:
        with self.db.atomic():
            self.db["evaluations"].upsert_all([_encode(row) for row in rows], pk=("model", "task_id"))

    def evaluations(self) -> list[dict]:
        rows = self.db["evaluations"].rows_where(order_by="model, task_id")
        return [_decode(row, "labels") for row in rows]

    def save_validations(self, step: int, rows: list[dict]) -> None:
        """The held-out results of the validation after ``step`` (0: before the first step), in one transaction."""
        now = time.time()
        with self.db.atomic():
            self.db["validations"].upsert_all([_encode({**row, "step": step, "created_at": now}) for row in rows],
                                              pk=("step", "task_id"))

    def validations(self) -> list[dict]:
        rows = self.db["validations"].rows_where(order_by="step, task_id")
        return [_decode(row, "labels") for row in rows]

    def save_screen(self, row: dict, step: int = 0) -> None:
        """A task's screen result: before training (``step`` 0), or in the re-screen before ``step``."""
        with self.db.atomic():
            if step:
                self.db["rescreens"].upsert({**row, "step": step, "created_at": time.time()}, pk=("step", "task_id"))
            else:
                self.db["screen"].upsert({**row, "created_at": time.time()}, pk="task_id")

    def screen(self, step: int = 0) -> dict[str, dict]:
        """task id -> its screen row (samples, passes), for the tasks screened so far: before training (``step``
        0), or in the re-screen before ``step``."""
        if step:
            return {row["task_id"]: row for row in self.db["rescreens"].rows_where("step = ?", [step],
                                                                                   order_by="task_id")}
        return {row["task_id"]: row for row in self.db["screen"].rows_where(order_by="task_id")}

    def resume_run(self, name: str) -> None:
        self.db["runs"].update(name, {"status": "running", "finished_at": None})

    def update_step(self, step: int, values: dict) -> None:
        with self.db.atomic():
            self.db["steps"].update(step, values)

    # --- reads ------------------------------------------------------------------------------------------
    def steps(self) -> list[dict]:
        return list(self.db["steps"].rows_where(order_by="step"))

    def label_counts(self) -> dict[str, int]:
        rows = self.db.query("select label, count(*) as n from turns group by label order by n desc")
        return {row["label"]: row["n"] for row in rows}

    def trajectories(self, step: int | None = None) -> list[dict]:
        where, args = ("step = ?", [step]) if step is not None else (None, None)
        return list(self.db["trajectories"].rows_where(where, args, order_by="id"))

    def trajectory(self, trajectory_id: str) -> dict:
        try:
            return _decode(self.db["trajectories"].get(trajectory_id), "messages")
        except sqlite_utils.db.NotFoundError:
            raise LookupError(f"no trajectory {trajectory_id!r} in {self.path}") from None

    def diagnosis(self, key: str) -> dict | None:
        """A stored diagnoser answer for this failure's content hash, or None."""
        rows = list(self.db["diagnoses"].rows_where("key = ?", [key]))
        return rows[0] if rows else None

    def turns(self, trajectory_id: str) -> list[dict]:
        rows = self.db["turns"].rows_where("trajectory_id = ?", [trajectory_id], order_by="turn_index")
        turns = [_decode(row, "model_calls", "results", "gt_calls", "evidence") for row in rows]
        for turn in turns:  # the diagnoser's explanation, where it gave one
            turn["diagnosis"] = self.diagnosis(turn["diagnosis_key"]) if turn.get("diagnosis_key") else None
        return turns

    def turn_labels(self) -> dict[str, list[str]]:
        """trajectory id -> its turn labels in turn order."""
        labels: dict[str, list[str]] = {}
        for row in self.db.query("select trajectory_id, label from turns order by trajectory_id, turn_index"):
            labels.setdefault(row["trajectory_id"], []).append(row["label"])
        return labels

    def interface_versions(self) -> list[dict]:
        rows = self.db["interface_versions"].rows_where(order_by="version")
        return [_decode(row, "components", "guidelines", "statistics") for row in rows]

    def metrics(self, name: str) -> list[tuple[int, float]]:
        rows = self.db["metrics"].rows_where("name = ?", [name], order_by="step")
        return [(row["step"], row["value"]) for row in rows]

    def step_metrics(self, step: int) -> dict[str, float]:
        """Every metric ``step`` wrote, the update's included: name -> value, by name."""
        return {row["name"]: row["value"] for row in self.db["metrics"].rows_where("step = ?", [step], order_by="name")}

    def metric_per_step(self, name: str) -> list[float | None]:
        """The metric's value at each of ``steps()``, in order; None where that step did not write it."""
        values = dict(self.metrics(name))
        return [values.get(step["step"]) for step in self.steps()]

    def metric_series(self, prefix: str, suffix: str = "") -> dict[str, list[tuple[int, float]]]:
        """Every metric named ``prefix + key + suffix``: key -> [(step, value)] in step order. For example
        ``metric_series("labels/", "_rate")`` gives each label's share per step, ``metric_series("rho/")`` each
        label's utility. Matched exactly (SQL's LIKE would read ``_`` as a wildcard and ignore case)."""
        series: dict[str, list[tuple[int, float]]] = {}
        rows = self.db["metrics"].rows_where("substr(name, 1, ?) = ?", [len(prefix), prefix], order_by="step, name")
        for row in rows:
            name = row["name"]
            if name.endswith(suffix) and len(name) > len(prefix) + len(suffix):
                series.setdefault(name[len(prefix) : len(name) - len(suffix)], []).append((row["step"], row["value"]))
        return series

    def labels_by_step(self) -> dict[int, list[str]]:
        """step -> the labels of its trajectories' turns, in trajectory and turn order."""
        labels: dict[int, list[str]] = {}
        for row in self.db.query("select t.step, u.label from turns u join trajectories t on t.id = u.trajectory_id "
                                 "order by t.step, u.trajectory_id, u.turn_index"):
            labels.setdefault(row["step"], []).append(row["label"])
        return labels

    def rewards_by_group(self) -> dict[tuple[int, str], list[float]]:
        """(step, task id) -> the rewards of that task's group of trajectories, in trajectory id order."""
        rewards: dict[tuple[int, str], list[float]] = {}
        for row in self.db["trajectories"].rows_where(select="step, task_id, reward", order_by="id"):
            rewards.setdefault((row["step"], row["task_id"]), []).append(row["reward"])
        return rewards

    def step_count(self) -> int:
        """How many steps the store holds (0 for a file that has no tables yet)."""
        return self.db["steps"].count if self.db["steps"].exists() else 0

    def checkpoints(self) -> list[dict]:
        """The committed steps' checkpoint rows in step order, their seal_state decoded."""
        return [_decode(row, "seal_state") for row in self.db["checkpoints"].rows_where(order_by="step")]


def _checked_version(db: sqlite_utils.Database, path: Path) -> int:
    """The store's schema version; a RunError if a newer seal-lite wrote it (this code cannot know its tables)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RunError(f"{path} has store schema version {version}, newer than this seal-lite's {SCHEMA_VERSION}: "
                       "upgrade seal-lite to open it")
    return version


def _upgrade(db: sqlite_utils.Database, path: Path) -> None:
    """Run the migrations the store lacks and set its new version, all in one transaction: a failure leaves the
    store as it was."""
    if _checked_version(db, path) == SCHEMA_VERSION:
        return
    with _write_transaction(db):
        version = _checked_version(db, path)  # again under the write lock: another process may have upgraded it
        for migrate in MIGRATIONS[version:]:
            migrate(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


@contextlib.contextmanager
def _write_transaction(db: sqlite_utils.Database):
    """A transaction that takes the write lock at once (BEGIN IMMEDIATE), so what it reads first cannot change
    before it writes; committed at the end, rolled back on any error. sqlite-utils' writes inside it join it."""
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.conn.rollback()
        raise
    db.conn.commit()


def _read_uri(path: Path) -> str:
    """The SQLite URI that reads ``path`` without writing. While a connection has a store open, its ``-wal``
    file exists and a ``mode=ro`` reader shares it, seeing every committed write. Without one, nothing has the
    file open and its whole content is in it: it is read ``immutable``, since a ``mode=ro`` reader would create
    the ``-wal`` and ``-shm`` files beside it, which a full disk may refuse. An immutable reader does not see
    later writes, hence short reads only."""
    wal = path.with_name(path.name + "-wal")
    return f"{path.resolve().as_uri()}?mode=ro" + ("" if wal.exists() else "&immutable=1")


def _decode(row: dict, *columns: str) -> dict:
    return {key: json.loads(value) if key in columns and value is not None else value for key, value in row.items()}


def _encode(row: dict) -> dict:
    """JSON-encode nested values so every column is a plain SQLite type."""
    return {key: json.dumps(value) if isinstance(value, (list, dict)) else value for key, value in row.items()}
