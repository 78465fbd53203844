"""A whole SEAL run: the task slice, the policy, the diagnoser and the rollout engine around ``loop.SealStep``.

``run`` is what ``seal-lite run`` calls. It takes the run directory's lock, starts or resumes the run's store,
loads the policy, screens the slice when the recipe asks, then hands ``SealStep`` (Algorithm 1's body,
seal_lite/step/algorithm.py) to TRL's trainer (seal_lite/training/grpo.py), which calls it once per step for the
rollouts and applies the update. After each step a checkpoint is committed to the store, so a killed run
resumes from its last committed step; a full disk stops it with a message saying what is committed.

This module is the only one that knows both the step and the trainer: ``loop`` never imports TRL.

Under ``accelerate launch`` (or ``seal-lite run --processes N``) every process runs ``run``: each loads the policy
and rolls out its share of each step's tasks, while rank 0 alone takes the lock, writes the store and the
checkpoints' commits, runs the diagnoser and decides where to resume, handing its decisions to the others
(seal_lite/engines/distributed.py; docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import random
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from seal_lite.core.errors import RunError
from seal_lite.core.recipe import Recipe, RecipeError
from seal_lite.core.types import NoProgress, Progress
from seal_lite.engines import distributed
from seal_lite.engines.model_sources import resolve_gguf
from seal_lite.engines.rollout_engine import rollout_backend, rollout_engine
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import Task, load_tasks, split_ids
from seal_lite.step.algorithm import SealStep
from seal_lite.step.diagnoser import Diagnoser


def select_task_ids(recipe: Recipe) -> list[str]:
    """The run's task slice: explicit ids, or the first ``num_tasks`` of the split after a seeded shuffle."""
    if recipe.data.task_ids:
        return list(recipe.data.task_ids)
    ids = split_ids(recipe.data.split, recipe.data.categories)
    random.Random(recipe.seed).shuffle(ids)
    return ids[: recipe.data.num_tasks]


def slice_tasks(recipe: Recipe, task_ids: list[str]) -> dict[str, Task]:
    """The run's tasks by id, cut to ``rollout.max_turns``."""
    return {task.id: task.truncated(recipe.rollout.max_turns) for task in load_tasks(task_ids)}



@dataclass
class RunSummary:
    db_path: Path
    steps: int
    reward_mean: float
    label_counts: dict[str, int]
    weight_min: float
    weight_max: float
    wall_time_s: float
    loss: list[float]
    rewards: list[float]  # reward/mean of each step


@contextlib.contextmanager
def _diagnoser(recipe: Recipe, store: Store | None):
    if recipe.diagnoser.mode == "off" or store is None:  # several processes: rank 0's diagnoser answers for all
        yield None
        return
    model_path = resolve_gguf(recipe.diagnoser.model, "diagnoser.model") if recipe.diagnoser.mode != "url" else ""
    with Diagnoser(recipe.diagnoser, model_path, lookup=store.diagnosis) as diagnoser:
        yield diagnoser


class ScreenError(RunError):
    """The frontier screen left fewer tasks than a step needs."""


def screen_slice(recipe: Recipe, store: Store, tasks: dict[str, Task], policy, out_dir: Path,
                 progress: Progress = NoProgress()) -> dict[str, float]:
    """Pass rate per task of the run's slice under the base policy (``data.screen`` samples each); tasks already
    in the store's screen table are not played again."""
    from transformers import set_seed

    from seal_lite.step.screen import screen_tasks

    set_seed(recipe.seed)  # transformers samples with torch's RNG: the same recipe screens the same way
    with rollout_engine(recipe, policy.model, policy.tokenizer, out_dir, policy.generation_mode) as (generator, _):
        return screen_tasks(list(tasks.values()), generator, recipe, store, progress.task_screened)


def frontier_task_ids(recipe: Recipe, pass_rates: dict[str, float]) -> list[str]:
    """The screened tasks training draws from; a ScreenError, with the fix, if they cannot fill a step."""
    from seal_lite.step.screen import frontier

    kept = frontier(pass_rates)
    if len(kept) < recipe.grpo.tasks_per_step:
        solved = sum(rate == 1.0 for rate in pass_rates.values())
        raise ScreenError(
            f"the screen kept {len(kept)} of {len(pass_rates)} tasks ({solved} always solved, "
            f"{len(pass_rates) - len(kept) - solved} never), fewer than grpo.tasks_per_step "
            f"({recipe.grpo.tasks_per_step}); raise data.num_tasks or data.screen, or lower grpo.tasks_per_step")
    return kept


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


def _disk_full_message(out_dir: Path, recipe: Recipe, cause: BaseException, removed: bool) -> str:
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
        with contextlib.closing(sqlite3.connect(f"file:{out_dir / 'seal.db'}?mode=ro", uri=True)) as db:
            row = db.execute("select step, path from checkpoints order by step desc limit 1").fetchone()
    except sqlite3.Error:
        return 0, None
    return (row[0], row[1]) if row else (0, None)


def _stored_steps(out_dir: Path) -> int | None:
    """How many step rows the run's store holds (None: unknown), read without writing."""
    if not (out_dir / "seal.db").exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{out_dir / 'seal.db'}?mode=ro", uri=True)) as db:
            if not db.execute("select count(*) from sqlite_master where name = 'steps'").fetchone()[0]:
                return 0
            return db.execute("select count(*) from steps").fetchone()[0]
    except sqlite3.Error:
        return None


def _remove_created(out_dir: Path, created: Path) -> None:
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


def _resume_point(store: Store, out_dir: Path, updates: int) -> dict | None:
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


def _prune_checkpoints(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints, once the newest is committed (transformers' own rotation runs before
    the commit, and could delete the last committed checkpoint of a run killed in between). A checkpoint is
    renamed before it is deleted, so a kill mid-deletion never leaves a half checkpoint under its own name."""
    checkpoints = sorted(directory.glob("checkpoint-*"), key=lambda path: int(path.name.rsplit("-", 1)[1]))
    for old in checkpoints[:-keep]:
        doomed = old.rename(old.with_name(f".removing-{old.name}"))
        shutil.rmtree(doomed)


def run(recipe: Recipe, out_dir: Path, progress: Progress = NoProgress()) -> RunSummary:
    """Run the whole SEAL loop for ``recipe`` and write everything to ``out_dir/seal.db``.

    If ``out_dir`` already holds an unfinished run of the same recipe, it resumes from its last committed step:
    the policy, optimizer, RNG and loop state come back from that step's checkpoint, and the rows of any step
    after it are removed first, so every step is in the store exactly once.

    A run that stops before it stored any step removes the directory it created: nothing is left to resume.
    A full disk stops it with ``DiskFullError``, whose message says what is committed and how to resume.

    Started by a launcher in several processes, every process calls this; rank 0 does all of the above (lock,
    store, removal, messages) and every process returns the same summary.
    """
    distributed.init()
    problems = recipe.process_problems(distributed.world_size())
    if problems:
        raise RecipeError("\n".join(problems))
    started = time.time()
    out_dir = Path(out_dir)
    if not distributed.is_main():
        distributed.on_main(lambda: None)  # rank 0 has the run directory and its lock (or fails for all)
        return _run(recipe, out_dir, NoProgress(), started)
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
        summary = _run(recipe, out_dir, progress, started)
    except BaseException as error:
        lock.release()
        removed = created is not None and _stored_steps(out_dir) == 0
        if removed:
            _remove_created(out_dir, created)
        cause = disk_full(error, out_dir) if isinstance(error, Exception) else None
        if cause is not None:
            raise DiskFullError(_disk_full_message(out_dir, recipe, cause, removed)) from error
        raise
    lock.release()
    return summary


def _open_run(recipe: Recipe, store: Store, out_dir: Path) -> bool:
    """Start the run in its store, or check that the stored one is this recipe's and resume it; whether it
    resumes."""
    resuming = run_status(out_dir) is not None
    if resuming:
        differences = recipe_differences(json.loads(store.run()["recipe"]), recipe.model_dump())
        if differences:
            raise RunMismatchError(f"{out_dir} holds a run of another recipe (differs in {', '.join(differences)}); "
                                   f"use the same recipe to resume it, another --out, or --overwrite")
        store.resume_run(recipe.name)
    else:
        store.start_run(recipe.name, recipe.model_dump(), recipe.policy.model)
    return resuming


def _run(recipe: Recipe, out_dir: Path, progress: Progress, started: float) -> RunSummary:
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy

    store = Store(out_dir / "seal.db") if distributed.is_main() else None  # one writer: rank 0
    resuming = distributed.on_main(lambda: _open_run(recipe, store, out_dir))
    try:
        task_ids = select_task_ids(recipe)
        tasks = slice_tasks(recipe, task_ids)
        if store is not None:
            store.save_tasks([
                {"id": t.id, "category": t.category, "num_turns": len(t.turns),
                 "involved_classes": ",".join(t.involved_classes)}
                for t in tasks.values()
            ])
        distributed.on_main(lambda: resolve_model(recipe.policy.model))  # converted or downloaded once, by rank 0
        policy = load_policy(resolve_model(recipe.policy.model), recipe)
        if recipe.data.screen:  # train only on the tasks the base policy solves sometimes but not always
            task_ids = distributed.on_main(
                lambda: frontier_task_ids(recipe, screen_slice(recipe, store, tasks, policy, out_dir, progress)))
            if not recipe.data.rescreen_every:  # a re-screen plays the whole slice again
                tasks = {task_id: tasks[task_id] for task_id in task_ids}
        # imported after the policy is loaded: the Unsloth backend must patch trl before anything imports it
        from seal_lite.training.grpo import CheckpointCallback, StoreCallback, build_trainer, updates_per_step

        updates = updates_per_step(recipe)
        checkpoint = distributed.on_main(lambda: _resume_point(store, out_dir, updates) if resuming else None)
        with _diagnoser(recipe, store) as diagnoser:  # a served diagnoser stops here, also on error and Ctrl-C
            seal_step = SealStep(recipe, store, tasks, None, progress, diagnoser, task_ids)
            if checkpoint:
                seal_step.restore(checkpoint["seal_state"])
            progress.run_started(seal_step.step, f"policy {policy.backend}, rollouts {rollout_backend(recipe)}"
                                 + (f", {distributed.world_size()} processes" if distributed.world_size() > 1 else ""))

            def commit(step: int, directory: str) -> None:
                distributed.barrier()  # every process has written its part of the checkpoint (its RNG state)
                if store is not None:
                    store.commit_checkpoint(step, str(Path(directory).relative_to(out_dir)), seal_step.state())
                    _prune_checkpoints(out_dir / "checkpoints", recipe.grpo.keep_checkpoints)

            callbacks = [CheckpointCallback(commit, updates)]
            if store is not None:
                callbacks.insert(0, StoreCallback(store, updates, seal_step))
            trainer = build_trainer(policy, recipe, task_ids, seal_step, str(out_dir / "checkpoints"), callbacks)
            with rollout_engine(recipe, trainer.model, policy.tokenizer, out_dir, policy.generation_mode) as (
                    generator, sync):
                seal_step.generator, seal_step.sync_policy = generator, sync
                # 9. the policy updates, one per SEAL step (TRL calls seal_step for the rollouts of each)
                trainer.train(resume_from_checkpoint=str(out_dir / checkpoint["path"]) if checkpoint else None)
        trainer.save_model(str(out_dir / "adapter"))  # written by rank 0 (transformers' should_save)
    except BaseException:
        if store is not None:
            with contextlib.suppress(sqlite3.Error, OSError):  # a full disk refuses this too; "running" resumes
                store.finish_run(recipe.name, "failed", time.time() - started)
        raise
    return distributed.on_main(lambda: _finish(recipe, store, started))


def _finish(recipe: Recipe, store: Store, started: float) -> RunSummary:
    wall = time.time() - started
    store.finish_run(recipe.name, "finished", wall)
    steps = store.steps()
    return RunSummary(
        db_path=store.path,
        steps=len(steps),
        reward_mean=sum(s["reward_mean"] for s in steps) / max(1, len(steps)),
        label_counts=store.label_counts(),
        weight_min=min((s["weight_min"] for s in steps), default=1.0),
        weight_max=max((s["weight_max"] for s in steps), default=1.0),
        wall_time_s=wall,
        loss=[s["loss"] for s in steps],
        rewards=[s["reward_mean"] for s in steps],
    )
