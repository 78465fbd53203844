"""A run directory's life: its lock, starting or resuming its store, checkpoints, and a full disk.

``run_directory`` holds the directory's lock for a run and cleans up after it: a run that stored no step removes
what it created, and a full disk becomes a ``DiskFullError`` that says what is committed and how to resume.
``open_run`` starts the store's run or checks that a stored one is the same recipe; ``resume_point`` finds the
last committed checkpoint and removes what later, unfinished steps left behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import sqlite3
from pathlib import Path

from filelock import FileLock, Timeout

from seal_lite.core.errors import RunError
from seal_lite.core.recipe import Recipe
from seal_lite.core.recipe_sections import ValidationConfig
from seal_lite.engines import distributed
from seal_lite.engines.store import Store


@contextlib.contextmanager
def run_directory(out_dir: Path, recipe: Recipe):
    """Hold ``out_dir``'s lock (rank 0) while the run inside runs. If it fails before storing a step, the
    directories it created are removed; a full disk is raised as ``DiskFullError``."""
    created = next((path for path in reversed((out_dir, *out_dir.parents)) if not path.exists()), None)
    lock = FileLock(out_dir / "run.lock")  # an OS lock: a killed process releases it

    def take_lock() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise RunMismatchError(f"another seal-lite process is running {out_dir}; wait for it or stop it") from None

    distributed.on_main(take_lock)
    try:
        yield
    except BaseException as error:
        lock.release()
        removed = created is not None and _stored_steps(out_dir) == 0
        if removed:
            remove_created(out_dir, created)
        cause = disk_full(error, out_dir) if isinstance(error, Exception) else None
        if cause is not None:
            raise DiskFullError(disk_full_message(out_dir, recipe, cause, removed)) from error
        raise
    lock.release()


class RunMismatchError(RunError):
    """An existing run directory holds a run of another recipe; resuming it would mix two experiments."""


class DiskFullError(RunError):
    """The disk holding the run filled up while the run wrote to it; the message says what is committed and how
    to resume."""


FULL_BELOW = 16 * 2**20  # bytes free under which a failed write without an errno (torch.save) counts as a full disk


def disk_full(error: BaseException, out_dir: Path) -> BaseException | None:
    """The error in ``error``'s chain that says the disk is full, or None.

    Writers say it differently: OSError ENOSPC (json, open().write, shutil), sqlite's SQLITE_FULL "database or disk
    is full", safetensors' "StorageFull"; torch.save only says "file write failed", so a failed write counts as
    a full disk when the disk of ``out_dir`` is (nearly) full too."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for link in chain:
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return link
        if isinstance(link, sqlite3.Error) and getattr(link, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return link
        if any(text in str(link) for text in ("No space left on device", "StorageFull", "database or disk is full")):
            return link
    for link in chain:
        if isinstance(link, (OSError, RuntimeError)) and "writ" in str(link).lower() and _free_bytes(out_dir) < FULL_BELOW:
            return link
    return None


def _free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62


def disk_full_message(out_dir: Path, recipe: Recipe, cause: BaseException, removed: bool) -> str:
    summary = f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:300]}"
    free = f"{_free_bytes(out_dir) / 2**20:.1f} MiB free"
    if removed:
        return (f"the disk holding {out_dir} is full ({free}; {summary}). No step was stored, so the run directory "
                "was removed; free some space and run the same command again.")
    step, path = _committed_step(out_dir)
    size = _tree_bytes(out_dir / path) if path else 0
    need = f" (each checkpoint takes about {size / 2**20:.0f} MiB)" if size else ""
    return (f"the disk holding {out_dir} is full ({free}; {summary}). The run stopped; step {step} of "
            f"{recipe.grpo.steps} is its last committed step. Free some space{need}, then run the same command "
            f"again: it resumes after step {step}.")


def _committed_step(out_dir: Path) -> tuple[int, str | None]:
    """The last committed step and its checkpoint's path, read without writing (the disk may be full)."""
    try:
        row = Store.open_readonly(out_dir / "seal.db").last_checkpoint()
    except (sqlite3.Error, RunError):
        return 0, None
    return (row["step"], row["path"]) if row else (0, None)


def _stored_steps(out_dir: Path) -> int | None:
    """How many step rows the run's store holds (None: unknown), read without writing."""
    if not (out_dir / "seal.db").exists():
        return 0
    try:
        return Store.open_readonly(out_dir / "seal.db").step_count()
    except (sqlite3.Error, RunError):
        return None


def remove_created(out_dir: Path, created: Path) -> None:
    """Remove the run directory, then its parents up to ``created`` while they are empty (another run may have
    put its own directory beside this one meanwhile)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    for parent in out_dir.parents:
        if not parent.is_relative_to(created):
            break
        try:
            parent.rmdir()
        except OSError:
            break


def _tree_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) if path.is_dir() else 0


def recipe_differences(stored: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two resolved recipes."""
    names = []
    for key in sorted(set(stored) | set(current)):
        a, b = stored.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            names += recipe_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            names.append(f"{prefix}{key}")
    return names


def run_status(out_dir: Path) -> str | None:
    """The status of the run stored in ``out_dir`` (running, failed, finished), or None if there is none."""
    path = Path(out_dir) / "seal.db"
    if not path.exists():
        return None
    try:
        return Store(path).run()["status"]
    except LookupError:
        return None


def choose_run_dir(recipe: Recipe, out_dir: Path | None, overwrite: bool) -> tuple[Path, str | None]:
    """Where a run of ``recipe`` goes, and the status of the unfinished run it resumes there (None: a new run).
    ``out_dir`` defaults to runs/<name>, or runs/<name>-2, -3, ... when a finished run is there. With
    ``overwrite`` the run stored there is deleted first; without it a finished run there is refused."""
    if out_dir is None:
        out_dir = recipe.out_dir() if overwrite else _first_unfinished(recipe.out_dir())
    status = run_status(out_dir)
    if status is not None and overwrite:
        for suffix in ("", "-wal", "-shm"):
            (out_dir / f"seal.db{suffix}").unlink(missing_ok=True)
        shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
        return out_dir, None
    if status == "finished":
        raise RunError(f"{out_dir} holds a finished run; choose another --out or pass --overwrite")
    return out_dir, status


def _first_unfinished(base: Path) -> Path:
    """base, or base-2, -3, ...: the first that holds no finished run."""
    candidate, n = base, 1
    while run_status(candidate) == "finished":
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def resume_point(store: Store, out_dir: Path, updates: int) -> dict | None:
    """The newest committed checkpoint, after removing what later, unfinished steps left behind."""
    checkpoint = store.last_checkpoint()
    step = checkpoint["step"] if checkpoint else 0
    if checkpoint and not (out_dir / checkpoint["path"]).is_dir():
        raise RunMismatchError(f"{out_dir}: the checkpoint of step {step} ({checkpoint['path']}) is missing; "
                               f"start again with --overwrite")
    store.rollback_after(step)
    for directory in (out_dir / "checkpoints").glob("checkpoint-*"):
        if int(directory.name.rsplit("-", 1)[1]) > step * updates:  # written by a step that did not commit
            shutil.rmtree(directory)
    for directory in (out_dir / "checkpoints").glob(".removing-*"):  # a pruning that was interrupted
        shutil.rmtree(directory)
    return checkpoint


def prune_checkpoints(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints, once the newest is committed (transformers' own rotation runs before
    the commit, and could delete the last committed checkpoint of a run killed in between). A checkpoint is
    renamed before it is deleted, so a kill mid-deletion never leaves a half checkpoint under its own name."""
    checkpoints = sorted(directory.glob("checkpoint-*"), key=lambda path: int(path.name.rsplit("-", 1)[1]))
    for old in checkpoints[:-keep]:
        doomed = old.rename(old.with_name(f".removing-{old.name}"))
        shutil.rmtree(doomed)


# recipe sections that change where a run reports, not what it computes: a run resumes under other values (and a
# run stored before the section existed resumes too)
NOT_THE_EXPERIMENT = ("logging",)


def open_run(recipe: Recipe, store: Store, out_dir: Path) -> bool:
    """Start the run in its store, or check that the stored one is this recipe's and resume it; whether it
    resumes."""
    resuming = run_status(out_dir) is not None
    if resuming:
        stored = json.loads(store.run()["recipe"])
        stored.setdefault("validation", ValidationConfig().model_dump())  # stored before the section existed: off
        differences = [name for name in recipe_differences(stored, recipe.model_dump())
                       if name.split(".")[0] not in NOT_THE_EXPERIMENT]
        if differences:
            raise RunMismatchError(f"{out_dir} holds a run of another recipe (differs in {', '.join(differences)}); "
                                   f"use the same recipe to resume it, another --out, or --overwrite")
        store.resume_run(recipe.name)
    else:
        store.start_run(recipe.name, recipe.model_dump(), recipe.policy.model)
    return resuming
