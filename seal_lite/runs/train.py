"""A whole SEAL run, wired: the task slice, the policy, the diagnoser and the rollout engine around ``SealStep``.

``run`` is what ``seal-lite run`` calls. Inside the run directory's lock (seal_lite/runs/run_dir.py) it starts or
resumes the run's store, loads the policy, screens the slice when the recipe asks (seal_lite/runs/tasks.py), then
hands ``SealStep`` (Algorithm 1's body, seal_lite/step/algorithm.py) to TRL's trainer (seal_lite/training/grpo.py),
which calls it once per step for the rollouts and applies the update. After each step a checkpoint is committed
to the store, so a killed run resumes from its last committed step. Before the commit of the steps the recipe's
``validation`` section names, the current policy plays the held-out slice and the best adapter is kept
(seal_lite/runs/validation.py).

This module is the only one that knows both the step and the trainer: the step never imports TRL.

Under ``accelerate launch`` (or ``seal-lite run --processes N``) every process runs ``run``: each loads the policy
and rolls out its share of each step's tasks, while rank 0 alone takes the lock, writes the store and the
checkpoints' commits, runs the diagnoser and decides where to resume, handing its decisions to the others
(seal_lite/engines/distributed.py; docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.recipe import Recipe, RecipeError
from seal_lite.core.types import NoProgress, Progress
from seal_lite.engines import distributed
from seal_lite.engines.model_sources import resolve_gguf
from seal_lite.engines.rollout_engine import rollout_choice, rollout_engine
from seal_lite.engines.store import Store
from seal_lite.engines.tracking import Tracker, open_tracker
from seal_lite.runs.evaluate_bfcl import best_step, scores_by_step
from seal_lite.runs.run_dir import open_run, prune_checkpoints, resume_point, run_directory
from seal_lite.runs.run_log import LOG_FILE, library_output
from seal_lite.runs.tasks import (
    frontier_task_ids,
    screen_slice,
    select_task_ids,
    slice_tasks,
    without_uninformative,
)
from seal_lite.runs.validation import Validator
from seal_lite.step.algorithm import SealStep
from seal_lite.step.diagnoser import Diagnoser


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
    signal: list[float | None] = ()  # per step, the share of the groups it drew whose rewards differ
    lora_change: list[float | None] = ()  # per step, how far its update moved the LoRA (0: no update)
    interface_changes: list[str] = ()  # each evolved version: 'after step N: what changed'
    explanations: int = 0  # failed turns the local diagnoser explained
    name: str = ""
    run_dir: Path | None = None
    validation: dict[int, dict[str, float]] = ()  # step -> the held-out slice's mean: accuracy, turn_pass_rate
    best: tuple[int, float] | None = None  # (step, score) of RUN/best-adapter, by validation.metric


@contextlib.contextmanager
def _diagnoser(recipe: Recipe, store: Store | None):
    if recipe.diagnoser.mode == "off" or store is None:  # several processes: rank 0's diagnoser answers for all
        yield None
        return
    model_path = resolve_gguf(recipe.diagnoser.model, "diagnoser.model") if recipe.diagnoser.mode != "url" else ""
    with Diagnoser(recipe.diagnoser, model_path, lookup=store.diagnosis) as diagnoser:
        yield diagnoser


@contextlib.contextmanager
def _tracker(recipe: Recipe, store: Store | None, out_dir: Path, resumed_at: int):
    if store is None:  # several processes: rank 0 reports for all
        yield Tracker()
        return
    with open_tracker(recipe.logging.report_to, out_dir, recipe.model_dump(), resumed_at) as tracker:
        yield tracker


def run(recipe: Recipe, out_dir: Path, progress: Progress = NoProgress(), verbose: bool = False) -> RunSummary:
    """Run the whole SEAL loop for ``recipe`` and write everything to ``out_dir/seal.db``.

    The libraries' warnings, log lines and progress bars go to ``out_dir/run.log`` (seal_lite/runs/run_log.py); with
    ``verbose`` they are shown on the terminal too.

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
    with run_directory(out_dir, recipe), library_output(out_dir / LOG_FILE, verbose):
        return _run(recipe, out_dir, progress, started)


def _run(recipe: Recipe, out_dir: Path, progress: Progress, started: float) -> RunSummary:
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy

    store = Store(out_dir / "seal.db") if distributed.is_main() else None  # one writer: rank 0
    resuming = distributed.on_main(lambda: open_run(recipe, store, out_dir))
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
            tasks = without_uninformative(tasks, progress if distributed.is_main() else NoProgress())
            task_ids = distributed.on_main(
                lambda: frontier_task_ids(recipe, screen_slice(recipe, store, tasks, policy, out_dir, progress)))
            if not recipe.data.rescreen_every:  # a re-screen plays the whole slice again
                tasks = {task_id: tasks[task_id] for task_id in task_ids}
        # imported after the policy is loaded: the Unsloth backend must patch trl before anything imports it
        from seal_lite.training.grpo import (
            CheckpointCallback,
            StoreCallback,
            TrackerCallback,
            build_trainer,
            updates_per_step,
        )

        updates = updates_per_step(recipe)
        checkpoint = distributed.on_main(lambda: resume_point(store, out_dir, updates) if resuming else None)
        resumed_at = checkpoint["step"] * updates if checkpoint else 0  # the trainer's global step
        with (_diagnoser(recipe, store) as diagnoser,  # a served diagnoser stops here, also on error and Ctrl-C
              _tracker(recipe, store, out_dir, resumed_at) as tracker):

            def commit(step: int, directory: str) -> None:
                distributed.barrier()  # every process has written its part of the checkpoint (its RNG state)
                if store is not None:
                    if validator:
                        validator(step)  # its rows go with the step: a resumed run rolls both back
                    store.commit_checkpoint(step, str(Path(directory).relative_to(out_dir)), seal_step.state())
                    if validator:
                        validator.settle()
                    prune_checkpoints(out_dir / "checkpoints", recipe.grpo.keep_checkpoints)

            # seal_step is built below, on the rollout engine that plays the trainer's model; TRL calls it from there
            callbacks = [CheckpointCallback(commit, updates)]
            if store is not None:
                callbacks.insert(0, StoreCallback(store, updates, lambda: seal_step.rollouts_done_at))
                if tracker.name != "none":
                    callbacks.insert(1, TrackerCallback(store, tracker, updates))  # after the store has the step
            trainer = build_trainer(policy, recipe, task_ids, lambda step_task_ids: seal_step(step_task_ids),
                                    str(out_dir / "checkpoints"), callbacks, tracker.trainer_settings())
            with rollout_engine(recipe, trainer.model, policy.tokenizer, out_dir, policy.generation_mode) as (
                    generator, sync):
                seal_step = SealStep(recipe, store, tasks, generator, progress, diagnoser, task_ids, sync_policy=sync)
                if checkpoint:
                    seal_step.restore(checkpoint["seal_state"])
                validator = _validator(recipe, store, out_dir, generator, sync, trainer, progress, tracker, updates)
                engine, why = rollout_choice(recipe)
                progress.run_started(seal_step.step, f"policy {policy.backend}, rollouts {engine} ({why})"
                                     + (f", {distributed.world_size()} processes" if distributed.world_size() > 1
                                        else "") + (f"; metrics also to {tracker.where}" if tracker.where else ""))
                if validator and 0 not in scores_by_step(store):
                    validator(0)  # the base policy, before the first step (validation.before_training)
                    validator.settle()
                # 9. the policy updates, one per SEAL step (TRL calls seal_step for the rollouts of each)
                trainer.train(resume_from_checkpoint=str(out_dir / checkpoint["path"]) if checkpoint else None)
        trainer.save_model(str(out_dir / "adapter"))  # written by rank 0 (transformers' should_save)
    except BaseException:
        if store is not None:
            with contextlib.suppress(sqlite3.Error, OSError):  # a full disk refuses this too; "running" resumes
                store.finish_run(recipe.name, "failed", time.time() - started)
        raise
    return distributed.on_main(lambda: _finish(recipe, store, started))


def _validator(recipe: Recipe, store: Store | None, out_dir: Path, generator, sync, trainer, progress: Progress,
               tracker: Tracker, updates: int) -> Validator | None:
    """The run's validation (recipe section ``validation``), or None; it first settles what a killed run left."""
    if not recipe.validation.every or store is None:  # several processes: refused by Recipe.process_problems
        return None
    validator = Validator(recipe, store, out_dir, generator, sync, trainer.save_model, progress,
                          report=lambda step, metrics: tracker.log(step * updates, metrics))
    validator.settle()
    return validator


def _finish(recipe: Recipe, store: Store, started: float) -> RunSummary:
    from seal_lite.core import metrics as m

    wall = time.time() - started
    store.finish_run(recipe.name, "finished", wall)
    steps = store.steps()

    def total(metric) -> int:
        return int(sum(value or 0 for value in store.metric_per_step(metric.name)))

    return RunSummary(
        signal=store.metric_per_step(m.DRAWN_GROUPS_WITH_SIGNAL.name),
        lora_change=store.metric_per_step(m.LORA_CHANGE.name),
        interface_changes=[f"after step {row['step']}: {row['reason']}" for row in store.interface_versions()
                           if row["parent"] is not None],
        explanations=total(m.DIAGNOSER_COUNTS["asked"]) - total(m.DIAGNOSER_COUNTS["invalid"])
        - total(m.DIAGNOSER_COUNTS["failed"]),
        name=recipe.name,
        run_dir=store.path.parent,
        validation=scores_by_step(store),
        best=best_step(store, recipe.validation.metric),
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
