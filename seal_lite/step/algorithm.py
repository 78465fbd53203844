"""The SEAL loop (docs/method.md §2, Algorithm 1), one step at a time.

``SealStep.__call__`` is the body of one iteration, steps 1-8 and 10 in order; step 9, the policy update,
is TRL's GRPOTrainer, which calls this body through its ``rollout_func`` and then applies the update with the
advantages returned here (seal_lite/training/grpo.py). seal_lite/run/train.py wires the two together for a
whole run (resume, engines, diagnoser); this module knows neither TRL nor the run directory.

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
import json
import random
import time
from collections import Counter

from seal_lite.core import timing
from seal_lite.core.advantages import (
    diagnosis_weight,
    group_advantages,
    initial_utilities,
    share_with_signal,
    update_utilities,
    weighted_advantages,
)
from seal_lite.core.explainer import argument_values, redact_unseen_values
from seal_lite.core.interface import SCHEMA_CUE_LINE, TrainingInterface, capability_guidelines
from seal_lite.core.labels import EXCLUDED_LABELS
from seal_lite.core.recipe import Recipe
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
from seal_lite.envs.bfcl import Task
from seal_lite.step.diagnoser import Diagnoser, failed_turns
from seal_lite.step.rollout import Generator, rollout_groups
from seal_lite.step.screen import frontier, screen_tasks
from seal_lite.step.verifier import diagnose_episode


class SealStep:
    """One SEAL iteration; TRL calls it with the step's prompts (task ids, G copies each). ``store`` is None in the
    processes other than rank 0 of a run across several: they record nothing. ``tasks`` are all the tasks a step
    may play; ``frontier`` (default: all of them) the ones it draws from, which a re-screen changes."""

    def __init__(self, recipe: Recipe, store: Store | None, tasks: dict[str, Task], generator: Generator,
                 progress: Progress = NoProgress(), diagnoser: Diagnoser | None = None,
                 frontier: list[str] | None = None):
        self.recipe, self.store, self.tasks, self.generator, self.progress = recipe, store, tasks, generator, progress
        self.diagnoser = diagnoser
        self.frontier = sorted(frontier if frontier is not None else tasks)
        self.rescreened: tuple[int, int] | None = None  # this step's re-screen: (tasks kept, tasks screened)
        self.bases = initial_utilities(recipe.grpo.utilities)  # b_z: the recipe's, where it sets them
        self.utilities = dict(self.bases)
        self.statistics = FailureStatistics()
        self.step = 0
        self.steps_per_epoch = max(1, len(self.frontier) // recipe.grpo.tasks_per_step)
        config = recipe.interface
        self.interface = TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format)
        self.version = 1
        self.diagnoser_hints: dict[str, str] = {}  # failure label -> latest hint of the local diagnoser
        self.sync_policy = lambda step: None  # hands the rollout engine the current policy (llama.cpp: a new LoRA)
        self.rollouts_done_at: float | None = None  # when the step handed its batch to the update (for time/update_s)
        if self.store is not None:
            self.store.save_interface_version(self._version_row(self.interface, self.version, None))

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

    def __call__(self, prompts: list[str]) -> RolloutBatch:
        started = time.time()
        self.step += 1
        G = self.recipe.rollout.num_generations
        # 1. Sample tasks: TRL's sampler drew them and repeated each G times, in group order (dynamic sampling may
        # swap some for others below). Several processes: these are this process's share of the step's tasks.
        task_ids = prompts[::G]
        if prompts != [task_id for task_id in task_ids for _ in range(G)]:
            raise RuntimeError("expected each task repeated G times in a row, as trl 1.14.2 does; check the trl pin")
        if (self.step - 1) % self.steps_per_epoch == 0:
            self.statistics.reset_window()  # the window statistics restart every epoch (§2 step 6)
        self.progress.step_started(self.step, len(task_ids) * distributed.world_size())
        timing.take()  # the step's phases start now
        with timing.phase("sync"):
            self.sync_policy(self.step)
        every = self.recipe.data.rescreen_every
        self.rescreened = None
        if every and self.step > 1 and (self.step - 1) % every == 0:
            with timing.phase("rescreen"):
                self._rescreen()
        task_ids = self._in_frontier(task_ids)

        groups = self._gather(self._roll_out(task_ids))  # every process's groups, in the step's task order
        mine = slice(distributed.rank() * len(task_ids) * G, (distributed.rank() + 1) * len(task_ids) * G)
        rolled_out = len(groups)
        # the rewards of the groups the step drew: dynamic sampling's replacements would bias the reward curve
        drawn = [[float(d.valid) for _, d in group] for group in groups]
        if self.recipe.grpo.dynamic_sampling:
            groups, rolled_out = self._fill_with_signal(groups, [group[0][0].task_id for group in groups])
        trajectories = [trajectory for group in groups for trajectory, _ in group]
        diagnoses = [diagnosis for group in groups for _, diagnosis in group]
        rewards = [1.0 if d.valid else 0.0 for d in diagnoses]
        # 5b. The local model explains new failures; its label counts only if the recipe makes it the authority.
        # (Rank 0's diagnoser, for every process's trajectories.)
        explained, report = distributed.on_main(lambda: self._explain(trajectories, diagnoses))
        labels = [self._labels(diagnosis, answers) for diagnosis, answers in zip(diagnoses, explained)]

        # 6. Update the failure statistics C_t.
        for trajectory_labels, reward in zip(labels, rewards):
            self.statistics.add(trajectory_labels, reward)
        # 10, first half (before weighting, §5): closed-loop update of the label utilities rho.
        if self.recipe.grpo.closed_loop:
            self.utilities = update_utilities(
                self.utilities, self.statistics.window_counts, self.statistics.window_mean_reward(), self.bases
            )
        # 7. Group advantages.  8. Diagnosis weights, then weighted advantages.
        advantages = [a for start in range(0, len(rewards), G) for a in group_advantages(rewards[start : start + G])]
        if self.recipe.grpo.diagnosis_weighting:
            weights = [diagnosis_weight(trajectory_labels, self.utilities) for trajectory_labels in labels]
        else:
            weights = [1.0] * len(rewards)
        final = weighted_advantages(advantages, weights, self.recipe.grpo.apply_to)

        # 10, second half: evolve the training interface from C_t for the next step (stored with this step).
        new_version = self._evolve_interface(explained, diagnoses)
        metrics = {}
        if self.store is not None:
            metrics = self._record(trajectories, diagnoses, explained, report, labels, advantages, weights, final,
                                   started, new_version, rolled_out, drawn)
        if new_version:
            self.interface, self.version = new_version
        self.progress.step_finished(self.step, metrics)
        if distributed.world_size() == 1:
            return RolloutBatch.from_trajectories(trajectories, rewards, final)
        return RolloutBatch.from_trajectories(trajectories[mine], rewards[mine], final[mine], any(final))

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

    def _gather(self, groups: list) -> list:
        """Every process's groups, in rank order (this process's own in one process); rank 0 shows the others'."""
        if distributed.world_size() == 1:
            return groups
        shares = distributed.gather(groups)
        for rank, share in enumerate(shares):
            for group in share if rank != distributed.rank() else ():
                self.progress.task_done(group[0][0].task_id, [float(d.valid) for _, d in group])
        return [group for share in shares for group in share]

    def _roll_out(self, task_ids: list[str]) -> list[list[tuple[Trajectory, EpisodeDiagnosis]]]:
        """Steps 2-5 for each task: one group of G (trajectory, diagnosis) pairs per task."""
        if not task_ids:
            return []
        G = self.recipe.rollout.num_generations
        # 2-3. Render the training interface and roll out G trajectories per task against fresh BFCL environments:
        # the whole step in one batched generation where the engine allows it (transformers), else task by task.
        pairs = [(self.tasks[task_id], interface_for_task(self.interface, self.tasks[task_id])) for task_id in task_ids]
        batches = [pairs] if getattr(self.generator, "batches_tasks", False) else [[pair] for pair in pairs]
        groups = []
        for batch in batches:
            for trajectories in rollout_groups(batch, G, self.generator, self.recipe.rollout):
                task = self.tasks[trajectories[0].task_id]
                # 4. Verify: the official BFCL multi-turn verdict is the reward.
                # 5. Diagnose every ground-truth turn from executable evidence.
                with timing.phase("verify"):
                    groups.append([(t, diagnose_episode(task, t.turns)) for t in trajectories])
                self.progress.task_done(task.id, [float(d.valid) for _, d in groups[-1]])
        return groups

    def _fill_with_signal(self, groups, task_ids: list[str]):
        """Dynamic sampling: replace groups whose rewards are all equal by groups of other tasks of the pool (in an
        order fixed by seed and step) that have a signal, within ``grpo.dynamic_sampling`` extra groups. Replaced
        groups are dropped, as in DAPO: they reach neither the store, the statistics nor the update."""
        def has_signal(group) -> bool:
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

    def _evolve_interface(self, explained, diagnoses) -> tuple[TrainingInterface, int] | None:
        """phi_cap's lines for the next step; a new (interface, version) when they change, else None."""
        for diagnosis, answers in zip(diagnoses, explained):
            for index, answer in answers.items():
                if answer.status == "ok":
                    self.diagnoser_hints[diagnosis.labels[index]] = answer.recovery_hint
        if not self.recipe.interface.capability_hints:
            return None
        hints = self.diagnoser_hints if self.recipe.interface.hints == "llm" else None
        guidelines = capability_guidelines(self.statistics.window_counts, self.statistics.window_mean_reward(), hints)
        if guidelines == self.interface.guidelines:
            return None
        return dataclasses.replace(self.interface, guidelines=guidelines), self.version + 1

    def _version_row(self, interface: TrainingInterface, version: int, parent: int | None) -> dict:
        config = self.recipe.interface
        added = [line for line in interface.guidelines if line not in self.interface.guidelines]
        removed = [line for line in self.interface.guidelines if line not in interface.guidelines]
        reason = "; ".join([f"guideline added: {line}" for line in added] +
                           [f"guideline removed: {line}" for line in removed]) or "initial training interface"
        statistics = {"counts": dict(self.statistics.window_counts),
                      "mean_rewards": self.statistics.window_mean_reward()} if parent else {}
        return {
            "version": version, "parent": parent, "step": self.step, "reason": reason,
            "components": {"schema_cues": config.schema_cues, "recovery_feedback": config.recovery_feedback,
                           "capability_hints": config.capability_hints, "hints": config.hints,
                           "tool_format": config.tool_format},
            "system_prompt_cues": SCHEMA_CUE_LINE if config.schema_cues else "",
            "guidelines": list(interface.guidelines),
            "statistics": statistics,
        }

    def _explain(self, trajectories, diagnoses) -> tuple[list[dict[int, Explanation]], StepReport | None]:
        """Per trajectory, the diagnoser's answers by turn index (only turns it answered)."""
        explained = [{} for _ in trajectories]
        if self.diagnoser is None:
            return explained, None
        cases = [(position, index, case)
                 for position, (trajectory, diagnosis) in enumerate(zip(trajectories, diagnoses))
                 for index, case in failed_turns(self.tasks[trajectory.task_id], trajectory.turns, diagnosis).items()]
        answers, report = self.diagnoser.explain([case for _, _, case in cases])
        for (position, index, _), answer in zip(cases, answers):
            if answer is not None:
                explained[position][index] = answer
        return explained, report

    def _labels(self, diagnosis: EpisodeDiagnosis, answers: dict[int, Explanation]) -> list[str]:
        """The labels that count for C_t and the weights: the rule's, or the model's valid refinements."""
        labels = list(diagnosis.labels)
        if self.recipe.diagnoser.label_authority == "llm":
            for index, answer in answers.items():
                if answer.status == "ok":
                    labels[index] = answer.label
        return labels

    def _record(self, trajectories, diagnoses, explained, report, labels, advantages, weights, final, started,
                new_version, rolled_out, drawn) -> dict:
        rewards = [1.0 if d.valid else 0.0 for d in diagnoses]
        G = self.recipe.rollout.num_generations
        groups = [rewards[start : start + G] for start in range(0, len(rewards), G)]
        turn_rows = [row for trajectory, diagnosis, answers in zip(trajectories, diagnoses, explained)
                     for row in _turn_rows(self.step, self.tasks[trajectory.task_id], trajectory, diagnosis, answers)]
        rows = []
        for trajectory, reward, advantage, weight, weighted in zip(trajectories, rewards, advantages, weights, final):
            rows.append({
                "id": trajectory_id(self.step, trajectory),
                "step": self.step,
                "task_id": trajectory.task_id,
                "group_index": trajectory.group_index,
                "reward": reward,
                "advantage": advantage,
                "weight": weight,
                "weighted_advantage": weighted,
                "num_model_calls": trajectory.num_model_calls,
                "num_tokens": len(trajectory.prompt_ids) + len(trajectory.completion_ids),
                "num_model_tokens": sum(trajectory.env_mask),
                "stop_reason": trajectory.stop_reason,
                "interface_version": self.version,
                "messages": trajectory.messages,
            })
        counts = Counter(label for trajectory_labels in labels for label in trajectory_labels)
        counted = sum(n for label, n in counts.items() if label not in EXCLUDED_LABELS) or 1
        metrics = {
            "reward/mean": sum(map(sum, drawn)) / sum(map(len, drawn)),
            "reward/update_mean": sum(rewards) / len(rewards),  # differs from reward/mean after dynamic sampling
            "verdict/irrelevance_pass_rate": sum(d.irrelevance_valid for d in diagnoses) / len(diagnoses),  # not a reward
            "grpo/weight_mean": sum(weights) / len(weights),
            "grpo/weight_min": min(weights),
            "grpo/weight_max": max(weights),
            "grpo/advantage_abs_mean": sum(abs(a) for a in final) / len(final),
            "grpo/groups_with_signal": share_with_signal(groups),
            "sampling/groups_rolled_out": rolled_out,
            "sampling/drawn_groups_with_signal": share_with_signal(drawn),
            "interface/version": self.version,
            "interface/guidelines": len(self.interface.guidelines),
            "time/rollout_s": time.time() - started,
            "tokens/model": sum(row["num_model_tokens"] for row in rows),
            "tokens/total": sum(row["num_tokens"] for row in rows),
        }
        if self.recipe.data.rescreen_every:
            metrics["screen/frontier_tasks"] = len(self.frontier)
        if self.rescreened:
            metrics["screen/rescreen_kept"], metrics["screen/rescreened_tasks"] = self.rescreened
        metrics |= {f"labels/{label}": n for label, n in counts.items()}
        metrics |= {f"labels/{label}_rate": n / counted for label, n in counts.items() if label not in EXCLUDED_LABELS}
        metrics |= {f"rho/{label}": value for label, value in self.utilities.items()}
        metrics |= {f"time/{name}_s": seconds for name, seconds in timing.take().items()}
        step_row = {
            "step": self.step,
            "started_at": started,
            "reward_mean": metrics["reward/mean"],
            "weight_min": metrics["grpo/weight_min"],
            "weight_max": metrics["grpo/weight_max"],
            "interface_version": self.version,
            "num_trajectories": len(rows),
        }
        if report is not None:
            metrics |= report.metrics()
            pairs = [(answer.label, diagnosis.labels[index]) for diagnosis, answers in zip(diagnoses, explained)
                     for index, answer in answers.items() if answer.status == "ok"]
            if pairs:  # how often the model's label agrees with the rule label
                metrics["diagnoser/label_agreement"] = sum(model == rule for model, rule in pairs) / len(pairs)
        version_row = self._version_row(*new_version, self.version) if new_version else None
        started_store = time.perf_counter()
        self.store.save_step(step_row, rows, turn_rows, metrics, [answer.row() for answer in report.new] if report else [],
                             version_row)
        metrics["time/store_s"] = time.perf_counter() - started_store
        self.store.save_metrics(self.step, {"time/store_s": metrics["time/store_s"]})
        self.rollouts_done_at = time.time()
        return metrics


def interface_for_task(interface: TrainingInterface, task: Task) -> TrainingInterface:
    """The interface for one task, with any of its ground-truth argument values that its own conversation does
    not show removed from the guidelines (a diagnoser hint learned on another task could carry one)."""
    if not interface.guidelines:
        return interface
    visible = json.dumps(task.visible_functions(len(task.turns) - 1)) + " ".join(
        task.user_message(index) for index in range(len(task.turns)))
    hidden = argument_values([call for turn in task.ground_truth for call in turn])
    guarded = tuple(redact_unseen_values(line, hidden, visible)[0] for line in interface.guidelines)
    return dataclasses.replace(interface, guidelines=guarded)


def trajectory_id(step: int, trajectory: Trajectory) -> str:
    return f"s{step}-{trajectory.task_id}-g{trajectory.group_index}"


def _turn_rows(step: int, task: Task, trajectory: Trajectory, diagnosis: EpisodeDiagnosis,
               answers: dict[int, Explanation]) -> list[dict]:
    rows = []
    for index, turn in enumerate(diagnosis.turns):
        record = trajectory.turns[index] if index < len(trajectory.turns) else None
        outcomes = record.outcomes if record else []
        rows.append({
            "trajectory_id": trajectory_id(step, trajectory),
            "turn_index": index,
            "user_text": record.user_text if record else task.user_message(index),
            "model_calls": [o.shown for o in outcomes],
            "results": [o.result[:500] for o in outcomes],
            "gt_calls": task.ground_truth[index],
            "label": turn.label,
            "cause": turn.cause,
            "diagnosis_key": answers[index].key if index in answers else None,
            "evidence": {"differences": turn.evidence.differences, "gt_error": turn.evidence.gt_error,
                         "checker_error": turn.evidence.checker_error, "statuses": [o.status for o in outcomes]},
        })
    return rows
