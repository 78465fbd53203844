"""The SEAL loop (docs/method.md §2, Algorithm 1), one step at a time.

``SealStep.__call__`` is the body of one iteration, its steps numbered in the paper's order: 1 (the step's
tasks), 2-5 (render, roll out, verify, label: ``_roll_out``), 5's local diagnoser, 6 (C_t), 7 (group advantages),
8 (diagnosis weights, after the closed-loop update of rho, which the paper lists under step 10 but applies before
the weights, §5) and 10 (the next interface). Step 9, the policy update, is TRL's GRPOTrainer: its
``rollout_func`` calls this body with the step's task ids and then updates on the advantages returned here
(seal_lite/training/grpo.py). What the store keeps of a step is built by seal_lite/core/records.py.
seal_lite/runs/train.py wires the step, the trainer and the rollout engine together for a whole run (resume,
engines, diagnoser); this module knows neither TRL nor the run directory.

Deviations from the paper, each on purpose:
* LoRA on a small model on CPU instead of full fine-tuning of 3-8B models on 4 GPUs; hence a larger learning
  rate (recipe default 2e-5 instead of 1e-6).
* On a CPU, rollouts by llama.cpp from the policy's GGUF plus its current LoRA (``rollout.backend``), with
  tokens the two engines disagree on filtered out of the loss; otherwise transformers ``generate`` on the
  policy itself, batched over all of a step's tasks x G trajectories.
* All three interface components can be on (the paper's published runs kept only phi_schema, statically);
  phi_cap changes with the failure statistics, and every change is a new interface version in the store.
* ``grpo.dynamic_sampling`` (off by default) replaces groups without a learning signal by other tasks' groups;
  the step's reward stays the mean over the groups it drew (the policy's pass rate, unbiased by the choice).
* ``data.rescreen_every`` (off by default) screens the slice again every so many steps with the current policy
  (seal_lite/step/screen.py) and draws the following steps' tasks from the new frontier: TRL's draws outside it are
  swapped for frontier tasks.
* ``rollout.max_turns`` may cut tasks to their first turns (with their ground truth) to fit a CPU budget;
  the reward is then the official verdict on that shorter task.

Several processes (``accelerate launch``; seal_lite/engines/distributed.py): each rolls out the whole groups TRL hands it,
then every process gathers all of them in the step's task order and computes the same advantages, weights, rho,
statistics and interface from them, as one process would; the diagnoser (rank 0's) answers for all, and rank 0
alone records the step. Each process hands its own groups' rows to its share of the update.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

from seal_lite.core import timing
from seal_lite.core.advantages import (
    diagnosis_weight,
    group_advantages,
    initial_utilities,
    update_utilities,
    weighted_advantages,
)
from seal_lite.core.calls import call_format
from seal_lite.core.interface import TrainingInterface, capability_guidelines, interface_for_task
from seal_lite.core.metrics import STORE_SECONDS
from seal_lite.core.recipe import Recipe
from seal_lite.core.records import Scored, StepRecords, rewards, step_records, version_row
from seal_lite.core.types import (
    EpisodeDiagnosis,
    Explanation,
    FailureStatistics,
    NoProgress,
    Progress,
    RolloutBatch,
    StepReport,
    Trajectory,
)
from seal_lite.engines import distributed
from seal_lite.engines.store import Store
from seal_lite.envs.task import Task
from seal_lite.step.diagnoser import Diagnoser, failed_turns
from seal_lite.step.rollout import Generator, rollout_groups
from seal_lite.step.screen import frontier, screen_tasks
from seal_lite.step.verifier import diagnose_episode

Group = list[tuple[Trajectory, EpisodeDiagnosis]]  # one task's G trajectories, each with its diagnosis


def already_current(step: int) -> None:
    """The rollout engine plays the trained model itself (transformers): nothing to hand it before a step."""


class SealStep:
    """One SEAL iteration, called with the step's task ids. ``store`` is None in the processes other than rank 0 of
    a run across several: they record nothing. ``tasks`` are all the tasks a step may play; ``frontier``
    (default: all of them) the ones it draws from, which a re-screen changes. ``sync_policy(step)`` hands the
    rollout engine the current policy before each step (llama.cpp: a LoRA exported from the trained adapter)."""

    def __init__(self, recipe: Recipe, store: Store | None, tasks: dict[str, Task], generator: Generator,
                 progress: Progress = NoProgress(), diagnoser: Diagnoser | None = None,
                 frontier: list[str] | None = None, sync_policy: Callable[[int], None] = already_current):
        self.recipe, self.store, self.tasks, self.generator, self.progress = recipe, store, tasks, generator, progress
        self.diagnoser, self.sync_policy = diagnoser, sync_policy
        self.frontier = sorted(frontier if frontier is not None else tasks)
        self.rescreened: tuple[int, int] | None = None  # this step's re-screen: (tasks kept, tasks screened)
        self.bases = initial_utilities(recipe.grpo.utilities)  # b_z: the recipe's, where it sets them
        self.utilities = dict(self.bases)
        self.statistics = FailureStatistics()
        self.step = 0
        self.steps_per_epoch = max(1, len(self.frontier) // recipe.grpo.tasks_per_step)
        config = recipe.interface
        self.interface = TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format,
                                           call_format(recipe.rollout.parser))
        self.version = 1
        self.diagnoser_hints: dict[str, str] = {}  # failure label -> latest hint of the local diagnoser
        self.rollouts_done_at: float | None = None  # when the last step handed its batch to the update
        if self.store is not None:
            self.store.save_interface_version(version_row(
                version=self.version, parent=None, step=self.step, interface=self.interface,
                previous=self.interface, config=config, statistics=self.statistics))

    def state(self) -> dict:
        """Everything besides the policy that the next step depends on: saved with each checkpoint."""
        return {"step": self.step, "utilities": self.utilities, "statistics": self.statistics.to_dict(),
                "version": self.version, "guidelines": list(self.interface.guidelines),
                "diagnoser_hints": self.diagnoser_hints, "frontier": self.frontier}

    def restore(self, state: dict) -> None:
        self.step, self.utilities, self.version = state["step"], dict(state["utilities"]), state["version"]
        self.statistics = FailureStatistics.from_dict(state["statistics"])
        self.interface = dataclasses.replace(self.interface, guidelines=tuple(state["guidelines"]))
        self.diagnoser_hints = dict(state["diagnoser_hints"])
        self.frontier = list(state.get("frontier", self.frontier))  # checkpoints from before re-screening lack it

    def __call__(self, task_ids: list[str]) -> RolloutBatch:
        """One iteration on ``task_ids`` (several processes: this process's share of the step's tasks); the
        batch for the update: this process's trajectories, rewards and weighted advantages."""
        started = time.time()
        self.step += 1
        G = self.recipe.rollout.num_generations
        if (self.step - 1) % self.steps_per_epoch == 0:
            self.statistics.reset_window()  # the window statistics restart every epoch (§2 step 6)
        self.progress.step_started(self.step, len(task_ids) * distributed.world_size())
        timing.take()  # the step's phases start now
        with timing.phase("sync"):
            self.sync_policy(self.step)
        # 1. Sample tasks: TRL's sampler drew them from the run's first frontier; after a re-screen
        # (data.rescreen_every) those outside the new frontier are swapped for frontier tasks.
        every = self.recipe.data.rescreen_every
        self.rescreened = None
        if every and self.step > 1 and (self.step - 1) % every == 0:
            with timing.phase("rescreen"):
                self._rescreen()
        task_ids = self._in_frontier(task_ids)

        # 2-5. Render, roll out, verify and label each task's group (_roll_out); every process's groups, in the
        # step's task order. Dynamic sampling swaps groups without a learning signal for other tasks' groups.
        groups = self._gather(self._roll_out(task_ids))
        mine = slice(distributed.rank() * len(task_ids) * G, (distributed.rank() + 1) * len(task_ids) * G)
        rolled_out = len(groups)
        # the rewards of the groups the step drew: dynamic sampling's replacements would bias the reward curve
        drawn = [rewards(diagnosis for _, diagnosis in group) for group in groups]
        if self.recipe.grpo.dynamic_sampling:
            groups, rolled_out = self._fill_with_signal(groups, [group[0][0].task_id for group in groups])
        if release := getattr(self.generator, "release", None):
            release()  # the step's rollouts are done: the engine gives its memory back for the update (vLLM sleeps)
        trajectories = [trajectory for group in groups for trajectory, _ in group]
        diagnoses = [diagnosis for group in groups for _, diagnosis in group]
        reward = rewards(diagnoses)
        # 5, the local model's part: it explains new failures; its label counts only if the recipe makes it the
        # authority. (Rank 0's diagnoser, for every process's trajectories.)
        answers, report = distributed.on_main(lambda: self._explain(trajectories, diagnoses))
        labels = [self._labels(diagnosis, turn_answers) for diagnosis, turn_answers in zip(diagnoses, answers)]

        # 6. Update the failure statistics C_t.
        for trajectory_labels, trajectory_reward in zip(labels, reward):
            self.statistics.add(trajectory_labels, trajectory_reward)
        # 7. Group advantages. (A placebo run permutes each group's rewards first: grpo.shuffle_rewards.)
        trained = self._shuffled(reward) if self.recipe.grpo.shuffle_rewards else reward
        advantages = [a for start in range(0, len(reward), G) for a in group_advantages(trained[start : start + G])]
        # 8. Diagnosis weights, then weighted advantages. The weights read rho after this step's closed-loop
        # update from C_t (§5), which the paper lists under step 10.
        if self.recipe.grpo.closed_loop:
            self.utilities = update_utilities(
                self.utilities, self.statistics.window_counts, self.statistics.window_mean_reward(), self.bases
            )
        if self.recipe.grpo.diagnosis_weighting:
            weights = [diagnosis_weight(trajectory_labels, self.utilities) for trajectory_labels in labels]
        else:
            weights = [1.0] * len(reward)
        weighted = weighted_advantages(advantages, weights, self.recipe.grpo.apply_to)

        # 9. The policy update is TRL's, on the batch returned below. 10 needs only C_t, so it runs first:
        # 10. Evolve the training interface from C_t for the next step (stored with this step).
        evolved = self._evolve_interface(answers, diagnoses)
        metrics = {}
        if self.store is not None:  # rank 0 records the step, all processes' trajectories
            metrics = self._save(step_records(
                step=self.step, started=started, rollout_seconds=time.time() - started, phase_seconds=timing.take(),
                tasks=self.tasks, scored=Scored(trajectories, diagnoses, answers, labels, advantages, weights,
                                                weighted),
                drawn=drawn, rolled_out=rolled_out, recipe=self.recipe, interface=self.interface,
                version=self.version, evolved=evolved, statistics=self.statistics, utilities=self.utilities,
                frontier=self.frontier, rescreened=self.rescreened, report=report))
        if evolved:
            self.interface, self.version = evolved
        self.progress.step_finished(self.step, metrics)
        self.rollouts_done_at = time.time()
        trained = self.recipe.rollout.trained_tokens()  # budget release: the update sees each episode's start
        if distributed.world_size() == 1:
            return RolloutBatch.from_trajectories(trajectories, reward, weighted, trained_tokens=trained)
        return RolloutBatch.from_trajectories(trajectories[mine], reward[mine], weighted[mine], any(weighted),
                                              trained_tokens=trained)

    def _shuffled(self, reward: list[float]) -> list[float]:
        """Each group's rewards permuted among its G trajectories, in an order fixed by seed and step (every process
        draws the same): the placebo of ``grpo.shuffle_rewards``."""
        G, permuted = self.recipe.rollout.num_generations, []
        draw = random.Random(f"placebo-{self.recipe.seed}-{self.step}")
        for start in range(0, len(reward), G):
            group = reward[start : start + G]
            draw.shuffle(group)
            permuted += group
        return permuted

    def _save(self, records: StepRecords) -> dict[str, float]:
        """Write the step's rows in one transaction; its metrics, with the seconds that took."""
        started = time.perf_counter()
        self.store.save_step(records.step, records.trajectories, records.turns, records.metrics, records.diagnoses,
                             records.interface_version)
        seconds = {STORE_SECONDS.name: time.perf_counter() - started}
        self.store.save_metrics(self.step, seconds)
        return records.metrics | seconds

    def _rescreen(self) -> None:
        """Screen every task again with the current policy (rank 0's, for all processes) and draw from the new
        frontier; a frontier too small to fill a step leaves the old one in place."""
        def screen() -> dict[str, float]:
            self.progress.screen_started(self.step, len(self.tasks))
            return screen_tasks(list(self.tasks.values()), self.generator, self.recipe, self.store,
                                self.progress.task_screened, self.step,
                                lambda task: interface_for_task(self.interface, task))
        kept = frontier(distributed.on_main(screen))
        self.rescreened = (len(kept), len(self.tasks))
        if len(kept) >= self.recipe.grpo.tasks_per_step:
            self.frontier = sorted(kept)

    def _in_frontier(self, task_ids: list[str]) -> list[str]:
        """TRL's draw with each task outside the frontier swapped for a frontier task not drawn (in an order fixed
        by seed, step and process). TRL's sampler draws from the run's first frontier; a re-screen moves it."""
        outside = [task_id for task_id in task_ids if task_id not in self.frontier]
        if not outside:
            return task_ids
        free = [task_id for task_id in self.frontier if task_id not in task_ids]
        random.Random(f"{self.recipe.seed}-{self.step}-{distributed.rank()}").shuffle(free)
        swaps = dict(zip(outside, free, strict=False))
        return [swaps.get(task_id, task_id) for task_id in task_ids]

    def _gather(self, groups: list[Group]) -> list[Group]:
        """Every process's groups, in rank order (this process's own in one process); rank 0 shows the others'."""
        if distributed.world_size() == 1:
            return groups
        shares = distributed.gather(groups)
        for rank, share in enumerate(shares):
            for group in share if rank != distributed.rank() else ():
                self.progress.task_done(group[0][0].task_id, rewards(d for _, d in group))
        return [group for share in shares for group in share]

    def _roll_out(self, task_ids: list[str]) -> list[Group]:
        """Steps 2-5 for each task: one group of G (trajectory, diagnosis) pairs per task."""
        if not task_ids:
            return []
        G = self.recipe.rollout.num_generations
        # 2-3. Render the training interface and roll out G trajectories per task, each on fresh tools (BFCL's or
        # the recipe's environment's), the whole step in one batched generation.
        pairs = [(self.tasks[task_id], interface_for_task(self.interface, self.tasks[task_id])) for task_id in task_ids]
        groups = []
        for trajectories in rollout_groups(pairs, G, self.generator, self.recipe.rollout):
            task = self.tasks[trajectories[0].task_id]
            # 4. Verify: the environment's verdict (BFCL's official multi-turn checker) is the reward.
            # 5. Diagnose every ground-truth turn from executable evidence.
            with timing.phase("verify"):
                groups.append([(t, diagnose_episode(task, t.turns)) for t in trajectories])
            self.progress.task_done(task.id, rewards(d for _, d in groups[-1]))
        return groups

    def _fill_with_signal(self, groups: list[Group], task_ids: list[str]) -> tuple[list[Group], int]:
        """Dynamic sampling: replace groups whose rewards are all equal by groups of other tasks of the pool (in an
        order fixed by seed and step) that have a signal, within ``grpo.dynamic_sampling`` extra groups. Replaced
        groups are dropped, as in DAPO: they reach neither the store, the statistics nor the update."""
        def has_signal(group: Group) -> bool:
            return len({d.valid for _, d in group}) > 1

        spare = [task_id for task_id in self.frontier if task_id not in task_ids]
        random.Random(f"{self.recipe.seed}-{self.step}").shuffle(spare)
        budget, rolled_out = self.recipe.grpo.dynamic_sampling, len(groups)
        while budget and spare and (empty := [i for i, group in enumerate(groups) if not has_signal(group)]):
            draw, spare = spare[: min(len(empty), budget)], spare[min(len(empty), budget) :]
            budget -= len(draw)
            rolled_out += len(draw)
            for new in self._gather(self._roll_out(distributed.my_share(draw))):  # shared out among the processes
                if has_signal(new):
                    groups[empty.pop(0)] = new
        return groups, rolled_out

    def _evolve_interface(self, answers: list[dict[int, Explanation]],
                          diagnoses: list[EpisodeDiagnosis]) -> tuple[TrainingInterface, int] | None:
        """phi_cap's lines for the next step; a new (interface, version) when they change, else None."""
        for diagnosis, turn_answers in zip(diagnoses, answers):
            for index, answer in turn_answers.items():
                if answer.status == "ok":
                    self.diagnoser_hints[diagnosis.labels[index]] = answer.recovery_hint
        if not self.recipe.interface.capability_hints:
            return None
        hints = self.diagnoser_hints if self.recipe.interface.hints == "llm" else None
        guidelines = capability_guidelines(self.statistics.window_counts, self.statistics.window_mean_reward(), hints,
                                           self.recipe.interface.guideline_min_count)
        if guidelines == self.interface.guidelines:
            return None
        return dataclasses.replace(self.interface, guidelines=guidelines), self.version + 1

    def _explain(self, trajectories: list[Trajectory],
                 diagnoses: list[EpisodeDiagnosis]) -> tuple[list[dict[int, Explanation]], StepReport | None]:
        """Per trajectory, the diagnoser's answers by turn index (only turns it answered)."""
        by_turn: list[dict[int, Explanation]] = [{} for _ in trajectories]
        if self.diagnoser is None:
            return by_turn, None
        cases = [(position, index, case)
                 for position, (trajectory, diagnosis) in enumerate(zip(trajectories, diagnoses))
                 for index, case in failed_turns(self.tasks[trajectory.task_id], trajectory.turns, diagnosis).items()]
        answers, report = self.diagnoser.explain([case for _, _, case in cases])
        for (position, index, _), answer in zip(cases, answers):
            if answer is not None:
                by_turn[position][index] = answer
        return by_turn, report

    def _labels(self, diagnosis: EpisodeDiagnosis, answers: dict[int, Explanation]) -> list[str]:
        """The labels that count for C_t and the weights: the rule's, or the model's valid refinements."""
        labels = list(diagnosis.labels)
        if self.recipe.diagnoser.label_authority == "llm":
            for index, answer in answers.items():
                if answer.status == "ok":
                    labels[index] = answer.label
        return labels
