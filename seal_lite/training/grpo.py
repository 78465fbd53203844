"""The TRL adapter: the policy update of a SEAL step through trl 1.14.2's GRPOTrainer (the only TRL import).

How SEAL plugs into GRPOTrainer, through its extension points:

* ``rollout_func`` calls the SEAL step with the step's task ids (``step_task_ids``: TRL's prompts repeat each G
  times), which rolls out, verifies, diagnoses and weights; it returns the token ids with ``env_mask``.
* ``_generate_and_score_completions`` is overridden by the smallest possible amount: TRL's own group
  normalisation (std + 1e-4) is replaced by the SEAL advantages the loop computed, A_j = (r_j - mean) /
  (std + 1e-6) times the diagnosis weight w_j (docs/method.md §2 steps 7-8).
* the reward function only hands TRL the official verdict the loop already computed, for TRL's logging.
* llama.cpp rollouts: the tokens whose log-probs the two engines disagree on leave the loss; the trained side
  is the update's own log-probs (``compute_loss`` on-policy, TRL's old log-probs otherwise), never a pass of its own,
  except on-policy on Unsloth, whose loss scores its gradient log-probs itself. Unsloth's scores come in a layout of
  its own, put back in the completion's columns first (``unsloth_to_completion_coordinates``).

Batching: each SEAL step's tasks x G trajectories are split into ``grpo.mini_batches`` mini-batches (one optimizer
step each), and each mini-batch into micro-batches of ``micro_batch_size`` trajectories, whose gradients accumulate:
the optimizer steps, the loss and its gradient stay those of the whole mini-batch (TRL divides by the accumulation
steps; dapo by the batch's token count). The rollout batch is shuffled by whole groups (TRL shuffles rows; so
does Unsloth's trainer, left as it is), so a micro-batch holds one group, or part of one, by default.
Under ``accelerate launch`` with N processes each process holds tasks_per_step / N whole groups and 1/N of every
mini-batch, DDP averages the gradients (dapo's normaliser is the global token count, so the step's loss is the
one-process loss), and the skip without learning signal is decided for the whole step, on every process alike.
The shared prefix is off there (it scores beside DDP's forward, whose gradient averaging would then not happen).

Scoring (``_get_per_token_logps_and_entropies``, used by TRL's loss, its old-log-prob pass and its reference pass
with the adapter disabled): with ``grpo.shared_prefix`` each micro-batch's rows that share a prompt are scored
with that prefix computed once (``shared_prefix.py``): the same log-probs and gradients as TRL's pass per
trajectory, and logits only at the loss tokens. TRL's loss code is unchanged. Unsloth's backend keeps its own
(chunked) log-prob path, which this does not enter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in trl 1.14.2

from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback, set_seed
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler, split_tensor_dict

from seal_lite.core import metrics as m
from seal_lite.core.errors import ModelError
from seal_lite.core.recipe import Recipe
from seal_lite.engines import distributed
from seal_lite.engines.policy import Policy, keep_trainable_fp32
from seal_lite.training.shared_prefix import hold_budget, score_completions, supports

if TYPE_CHECKING:
    from seal_lite.core.types import RolloutBatch
    from seal_lite.engines.store import Store
    from seal_lite.engines.tracking import Tracker

StepFunction = Callable[[list[str]], "RolloutBatch"]  # the step's task ids -> its batch for the update
CHECKPOINT_PREFIX = "checkpoint-"  # transformers' name: checkpoint-<optimizer step>


def updates_per_step(recipe: Recipe) -> int:
    """Optimizer steps TRL takes per SEAL step: one per mini-batch, for each PPO epoch."""
    return recipe.grpo.mini_batches * recipe.grpo.num_iterations


def step_task_ids(prompts: list[str], group: int) -> list[str]:
    """The step's task ids, once each, from TRL's prompts, which repeat each task ``group`` times in a row."""
    task_ids = prompts[::group]
    if prompts != [task_id for task_id in task_ids for _ in range(group)]:
        raise RuntimeError("expected each task repeated G times in a row, as trl 1.14.2 does; check the trl pin")
    return task_ids


class StoreCallback(TrainerCallback):
    """Write TRL's per-step training figures (loss, KL, clip ratios, LoRA norm) into the run's store, and the
    seconds the update took after the step's rollouts: ``rollouts_done_at()`` says when they ended (None: unknown,
    no update time is written)."""

    def __init__(self, store: Store, updates: int, rollouts_done_at: Callable[[], float | None] | None = None):
        self.store, self.updates, self.rollouts_done_at = store, updates, rollouts_done_at
        self.lora_before: dict[str, torch.Tensor] = {}  # the LoRA as the last log (or the start) left it

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.lora_before = lora_parameters(model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or state.global_step == 0:
            return
        step = state.global_step // self.updates  # logging_steps = updates: one log per SEAL step, averaged
        metrics = {m.TRL_LOG.key(name): value for name, value in logs.items() if isinstance(value, (int, float))}
        model = kwargs.get("model")
        if model is not None:
            metrics[m.LORA_NORM.name] = lora_norm(model)
            lora = lora_parameters(model)
            if self.lora_before.keys() == lora.keys():
                metrics[m.LORA_CHANGE.name] = change_norm(self.lora_before, lora)
            self.lora_before = lora
        done_at = self.rollouts_done_at() if self.rollouts_done_at else None
        if done_at:
            metrics[m.UPDATE_SECONDS.name] = time.time() - done_at
        self.store.save_metrics(step, metrics)
        self.store.update_step(step, {"loss": float(logs["loss"]), "finished_at": time.time()})


class TrackerCallback(TrainerCallback):
    """Send each SEAL step's metrics, as the store holds them once ``StoreCallback`` (before it in the list) has
    added the update's, to the run's tracker, at the trainer's global step: where the trainer logs the same step.
    TRL's own log (``grpo/<name>`` in the store) is left out, as the trainer reports it there as ``train/<name>``."""

    def __init__(self, store: Store, tracker: Tracker, updates: int):
        self.store, self.tracker, self.updates = store, tracker, updates

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or state.global_step == 0:
            return
        metrics = self.store.step_metrics(state.global_step // self.updates)
        self.tracker.log(state.global_step, {name: value for name, value in metrics.items()
                                             if m.describe(name) is not m.TRL_LOG})


class CheckpointCallback(TrainerCallback):
    """After transformers has written a whole checkpoint (adapter, optimizer, scheduler, RNG, trainer state),
    hand it to ``commit(step, directory)``, which records the loop's state with it and marks the step done."""

    def __init__(self, commit: Callable[[int, str], None], updates: int):
        self.commit, self.updates = commit, updates

    def on_save(self, args, state, control, **kwargs):
        directory = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}{state.global_step}")
        self.commit(state.global_step // self.updates, directory)


def lora_parameters(model) -> dict[str, torch.Tensor]:
    """A copy of the LoRA parameters, by name (a few MB for the CPU models)."""
    return {name: p.detach().float().clone() for name, p in model.named_parameters() if "lora_" in name}


def change_norm(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """Frobenius norm of ``after - before`` over all parameters."""
    return float(torch.stack([(after[name] - before[name]).pow(2).sum() for name in after]).sum().sqrt()) if after else 0.0


def lora_norm(model) -> float:
    """Frobenius norm of all LoRA parameters: it moves exactly when an update changed the adapter."""
    squares = [p.detach().float().pow(2).sum() for name, p in model.named_parameters() if "lora_" in name]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


class SealGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are the SEAL-weighted ones of the current rollout batch, and whose log-probs
    are scored with each group's shared prefix computed once (``shared_prefix``; see shared_prefix.py)."""

    seal_batch: RolloutBatch | None = None
    skip_without_signal: bool = True
    _loss_positions: torch.Tensor | None = None  # (B, width): the tokens that carry loss in the rows being scored
    _scoring_rollouts: bool = False  # TRL's old/ref passes over the whole rollout batch: its env_mask says which
    _precomputed: tuple | None = None  # log-probs compute_loss already scored for the engine comparison
    _engine_gaps: list | None = None  # on-policy engine comparison: gaps of the rows compared so far, and
    _engine_rows_left: int = 0  # the rollout batch's rows not yet compared

    def __init__(self, *args, max_logprob_gap: float = 1.0, shared_prefix: bool = False, group_batches: bool = False,
                 **kwargs):
        """GRPOTrainer's arguments; the largest engine log-prob gap a token keeps its loss at; whether to score with
        shared prefixes; whether to shuffle the rollout batch by groups (every backend but Unsloth's)."""
        super().__init__(*args, **kwargs)
        self.max_logprob_gap, self.shared_prefix, self.group_batches = max_logprob_gap, shared_prefix, group_batches
        # Unsloth's scoring pass scores the log-probs: they come in its own layout, and its loss scores its own.
        # The shared prefix scores in TRL's layout, whoever's trainer is underneath.
        self.on_unsloth = is_unsloths(type(self)) and not shared_prefix

    def _get_train_sampler(self, dataset=None) -> ResumableRepeatSampler:
        sampler = super()._get_train_sampler(dataset)
        return ResumableRepeatSampler(sampler.data_source, sampler.mini_repeat_count, sampler.batch_size,
                                      sampler.repeat_count, sampler.shuffle, sampler.seed)

    def _no_learning_signal(self) -> bool:
        """Every advantage of the step is 0, and the KL term is off or still at its minimum (the policy is the
        reference: every LoRA B matrix is still 0), so the loss's gradient is exactly 0. Small models start
        there (every trajectory of every group fails): the forward and backward passes are then skipped, while
        the optimizer still steps on the zero gradient, so Adam's momentum carries on exactly as it would have."""
        if not self.skip_without_signal or self.seal_batch is None:
            return False
        signal = self.seal_batch.step_signal  # several processes: the whole step's, so all skip or none does
        if signal if signal is not None else any(self.seal_batch.advantages):
            return False
        return self.beta == 0.0 or all(not p.any() for n, p in self.model.named_parameters() if "lora_B" in n)

    def _generate_and_score_completions(self, inputs):
        self._scoring_rollouts = True  # rollout_func sets seal_batch before TRL's old/ref passes read it
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._scoring_rollouts = False
        advantages = torch.tensor(self.seal_batch.advantages, dtype=output["advantages"].dtype)
        output["advantages"] = advantages.to(output["advantages"].device)
        self._engine_rows_left = 0
        if self.seal_batch.sampled_logprobs is not None and not self._no_learning_signal():
            sampled = torch.zeros(output["completion_ids"].shape, device=output["completion_ids"].device)
            for row, logprobs in enumerate(self.seal_batch.sampled_logprobs):
                sampled[row, : len(logprobs)] = torch.tensor(logprobs[: sampled.size(1)])
            if output.get("old_per_token_logps") is not None:  # TRL scored the rollouts: compare with those now
                self._log_engine_gap(self._filter_engine_gap(output, output["old_per_token_logps"], sampled))
            else:  # on-policy: compute_loss compares each micro-batch with the update's own log-probs
                output["engine_per_token_logps"] = sampled
                self._engine_gaps, self._engine_rows_left = [], sampled.size(0)
        return output

    def _prepare_inputs(self, generation_batch):
        """TRL's, except that the rollout batch is shuffled group by group (and within each group) instead of row
        by row, so a micro-batch holds one group, or part of one, whose prompt is then computed once. Unsloth's
        trainer keeps its own."""
        if not self.group_batches or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = shuffle_groups(self._generate_and_score_completions(generation_batch), self.num_generations)
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._no_learning_signal():  # TRL's old log-probs: nothing will be compared with them
            return torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device), None, None
        if self._precomputed is not None:  # compute_loss scored this micro-batch for the engine comparison
            scores, self._precomputed = self._precomputed, None
            return scores
        others = {key: value for key, value in kwargs.items() if key not in ("batch_size", "compute_entropy")}
        if not self.shared_prefix or args or any(value is not None and value is not False for value in others.values()):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                             *args, **kwargs)
        logps, entropies = score_completions(
            self.accelerator.unwrap_model(model), input_ids, attention_mask, logits_to_keep,
            self._scored_positions(attention_mask, logits_to_keep), self.temperature,
            entropy=kwargs.get("compute_entropy", False), entropy_grad=self._entropy_bonus_enabled,
            hold_bytes=hold_budget(input_ids.device) if torch.is_grad_enabled() else 0.0)
        return logps, entropies, None

    def _scored_positions(self, attention_mask: torch.Tensor, width: int) -> torch.Tensor:
        """Completion positions whose log-prob something uses: the model tokens (environment tokens carry no
        loss, so no logits are computed for them)."""
        positions = attention_mask[:, -width:].bool()
        if self._loss_positions is not None:
            return positions & self._loss_positions.bool()
        if self._scoring_rollouts:
            env_mask = torch.zeros_like(positions)
            for row, mask in enumerate(self.seal_batch.env_mask):
                env_mask[row, : len(mask)] = torch.tensor(mask[:width], dtype=torch.bool)
            return positions & env_mask
        return positions

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self._no_learning_signal():
            self._metrics["train"]["update_skipped"].append(1.0)
            # 0 x every trainable parameter: a zero loss whose gradient is exactly zero, without a forward pass
            return sum((p * 0).sum() for p in model.parameters() if p.requires_grad)
        self._metrics["train"]["update_skipped"].append(0.0)
        self._loss_positions = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        try:
            if "engine_per_token_logps" in inputs:
                inputs = self._compare_engines_in_loss(model, inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._loss_positions, self._precomputed = None, None

    def _compare_engines_in_loss(self, model, inputs: dict) -> dict:
        """On-policy llama.cpp rollouts: score the micro-batch once, filter its loss mask on the gap between those
        log-probs and llama.cpp's, and hand the same log-probs to TRL's loss (no second forward pass). Unsloth's
        loss is not handed them: there they come from its pass without gradient, and the loss scores its gradient
        log-probs itself (asking with ``compute_efficient``), so on Unsloth the comparison costs one extra forward
        pass, without gradient."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        scores = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                         inputs["completion_ids"].size(1), compute_entropy=True,
                                                         compute_aux_loss=self.aux_loss_enabled)
        inputs = dict(inputs)
        sampled = inputs.pop("engine_per_token_logps")
        self._engine_gaps.append(self._filter_engine_gap(inputs, scores[0].detach(), sampled))
        self._engine_rows_left -= input_ids.size(0)
        if self._engine_rows_left == 0:  # the last micro-batch of the rollout batch: log over all of them
            self._log_engine_gap(torch.cat(self._engine_gaps))
        if not self.on_unsloth:
            self._precomputed = scores
        return inputs

    def _filter_engine_gap(self, inputs: dict, trained: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
        """Rollouts sampled by llama.cpp: take out of the loss the tokens where its log-probs and the trained
        model's (before this step's update) differ by more than ``max_logprob_gap`` (the update would otherwise
        push on tokens the policy itself would not have produced with that probability). Returns the gaps on the
        loss tokens. dapo's normaliser stays the rollout batch's loss-token count: a filtered token counts as a
        token with zero loss. ``trained``: the log-probs as the trainer's scoring returned them."""
        if self.on_unsloth:
            trained = unsloth_to_completion_coordinates(trained, inputs["prompt_ids"],
                                                        self.processing_class.pad_token_id,
                                                        inputs["completion_ids"].size(1))
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        gap = (trained - sampled).abs()
        inputs["tool_mask"] = inputs["tool_mask"] * (gap <= self.max_logprob_gap).to(inputs["tool_mask"].dtype)
        return gap[mask.bool()]

    def _log_engine_gap(self, gap: torch.Tensor) -> None:
        """The agreement of the two engines over a rollout batch's loss tokens."""
        if gap.numel():
            metrics = self._metrics["train"]
            logged = m.TRL_LOG.value_of  # the name under TRL's log, which StoreCallback stores under grpo/
            metrics[logged(m.ENGINE_GAP_MEAN.name)].append(gap.mean().item())
            metrics[logged(m.ENGINE_GAP_MAX.name)].append(gap.max().item())
            metrics[logged(m.ENGINE_FILTERED_SHARE.name)].append((gap > self.max_logprob_gap).float().mean().item())


class ResumableRepeatSampler(RepeatSampler):
    """TRL's task sampler, whose order a resumed run repeats. TRL's draws epoch k's order as the k-th permutation
    of one seeded generator, so a run resumed in epoch k > 0 (a fresh sampler) drew epoch 0's order again; here
    ``set_epoch`` (transformers calls it before every epoch) reseeds and skips the k permutations before, so every
    epoch's order is the uninterrupted run's."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)


def shuffle_groups(batch: dict, group: int) -> dict:
    """Shuffle a rollout batch (TRL's dict of per-row tensors and lists) keeping its groups of ``group`` rows
    together: the groups in a random order, and the rows of each in a random order."""
    groups = len(batch["prompt_ids"]) // group
    within = torch.stack([torch.randperm(group) for _ in range(groups)])
    order = (torch.randperm(groups)[:, None] * group + within).flatten()

    def permute(value):
        if isinstance(value, torch.Tensor):
            return value if value.ndim == 0 else value[order]
        return value if value is None else [value[i] for i in order]

    return {key: permute(value) for key, value in batch.items()}


class TrainerError(ModelError):
    """The update would not be the one the recipe asks for; the message says why."""


def check_width(batch: RolloutBatch, max_width: int | None) -> None:
    """Refuse a rollout batch whose padded rows are wider than the model takes uncut. TRL pads every row to the
    longest prompt plus the longest completion of the batch."""
    width = max(map(len, batch.prompt_ids)) + max(map(len, batch.completion_ids))
    if max_width is not None and width > max_width:
        raise TrainerError(f"the step's padded rows are {width} tokens wide, and the model takes {max_width} uncut "
                           "(Unsloth's max_seq_length, capped at the model's position window): lower "
                           "rollout.max_context_tokens to at most half the window")


# --- Unsloth's trainer: what seal-lite must know of the GRPOTrainer that unsloth 2026.10.9 patches into trl -------

def is_unsloths(trainer_class: type) -> bool:
    """Whether ``trainer_class`` is built on Unsloth's trainer: ``import unsloth`` rewrites trl's GRPOTrainer into
    its ``UnslothGRPOTrainer``, whichever backend then loads the policy (``check_trainer`` refuses all but Unsloth's)."""
    return any(cls.__name__ == "UnslothGRPOTrainer" for cls in trainer_class.__mro__)


def unsloth_to_completion_coordinates(logps: torch.Tensor, prompt_ids: torch.Tensor, pad_token_id: int,
                                      width: int) -> torch.Tensor:
    """Log-probs scored by Unsloth's trainer, (B, width + max left pad), in TRL's coordinates, (B, width): column j
    of row i scores ``completion_ids[i, j]``. TRL pads ``prompt_ids`` (width P) on the left, ``completion_ids`` on
    the right.

    Unsloth's ``_get_per_token_logps_and_entropies`` (unsloth/models/rl_replacements.py:3627-3634, 4167-4173; its
    packed and shared-prefix paths scatter into the same columns, :3932-3941) counts each row's prompt pads p_i,
    moves every pad of the row to its end (the row then reads prompt, completion, pads) and scores the last
    width + max p positions. Row i's completion token j, at packed position (P - p_i) + j, is thus in column
    (max p - p_i) + j: the shift with which Unsloth's loss aligns its own masks (unsloth_zoo/rl_replacements.py:
    700-723, 788-846). Columns past a row's completion hold padding's scores, as TRL's do. seal-lite's pad token is
    never a real one (``set_pad_token``), so Unsloth's count of pad ids is the count of pads."""
    left_pads = (prompt_ids == pad_token_id).sum(dim=1, keepdim=True)  # Unsloth's calculate_pad_tokens_in_prompt
    max_left_pad = logps.size(1) - width  # as Unsloth's loss reads it: from the scores' own width
    columns = max_left_pad - left_pads + torch.arange(width, device=logps.device)
    return logps.gather(1, columns)


def check_trainer(trainer: GRPOTrainer, backend: str) -> None:
    """The trainer is Unsloth's exactly on the unsloth backend. Where Unsloth cannot build its patched trainer for
    this TRL it logs one warning and leaves TRL's, whose loss materialises the full logits (16k x 152k in bf16,
    about 5 GB, twice) and runs out of memory where Unsloth's chunked loss fits. The other way round, ``import
    unsloth`` patches TRL in the whole process, and its trainer calls ``model.for_training()``, which only Unsloth's
    models have: a peft policy would fail after the first step's rollouts."""
    if backend == "unsloth" and not is_unsloths(type(trainer)):
        raise TrainerError("policy.backend unsloth, but the trainer is TRL's, not Unsloth's: Unsloth did not patch "
                           "trl.GRPOTrainer (imported before unsloth, or Unsloth's warning above says why); use "
                           "policy.backend peft-4bit, or the Unsloth and TRL versions seal-lite pins")
    if backend != "unsloth" and is_unsloths(type(trainer)):
        raise TrainerError(f"policy.backend {backend}, but the trainer is Unsloth's: unsloth was imported in this "
                           "process and patched trl.GRPOTrainer, and Unsloth's trainer calls model.for_training(), "
                           "which only Unsloth's models have; use policy.backend unsloth, or train this backend in "
                           "a process that never imports unsloth")


def build_trainer(policy: Policy, recipe: Recipe, task_ids: list[str], seal_step: StepFunction,
                  output_dir: str, callbacks: list[TrainerCallback] = (), reporting: dict | None = None) -> SealGRPOTrainer:
    """TRL's trainer for the run. ``reporting``: the TrainingArguments that name the tracker it reports its own figures
    to (``Tracker.trainer_settings()``, seal_lite/engines/tracking.py); None: it reports nowhere."""
    grpo, group = recipe.grpo, recipe.rollout.num_generations
    updates = updates_per_step(recipe)
    # Unsloth computes log-probs its own way (its chunked path), which the shared prefix does not enter. Several
    # processes: the shared prefix calls the decoder layers itself, beside DDP's forward, so DDP would never average
    # its gradients; each trajectory is then scored whole, by TRL's pass through the wrapped model.
    processes = distributed.world_size()
    shared_prefix = grpo.shared_prefix and policy.backend != "unsloth" and supports(policy.model) and processes == 1
    micro = recipe.micro_batch(shared_prefix, processes)
    config = GRPOConfig(
        output_dir=output_dir,
        # one generation batch (tasks_per_step x G trajectories) per SEAL step, in micro-batches of `micro`
        # trajectories; the gradients of one mini-batch's micro-batches accumulate into one optimizer step.
        # Across N processes each takes tasks_per_step / N whole groups of the step (accelerate deals TRL's
        # sampler's batches out in rank order) and a 1/N share of every mini-batch: the global batches are the same.
        per_device_train_batch_size=micro,
        steps_per_generation=grpo.tasks_per_step * group // processes // micro,
        num_generations=group,
        gradient_accumulation_steps=recipe.mini_batch() // processes // micro,
        gradient_checkpointing=policy.gradient_checkpointing,  # trl defaults it on, also on a CPU
        gradient_checkpointing_kwargs={"use_reentrant": False},
        num_iterations=grpo.num_iterations,
        max_steps=grpo.steps * updates,
        learning_rate=grpo.learning_rate,
        lr_scheduler_type="constant",
        weight_decay=grpo.weight_decay,
        max_grad_norm=grpo.max_grad_norm,
        beta=grpo.beta,
        use_bias_correction_kl=False,  # plain k3 = verl's low_var_kl, the paper's (trl defaults to k3 x ratio)
        temperature=recipe.rollout.temperature,  # score log-probs at the temperature the rollouts were sampled at
        epsilon=grpo.epsilon,
        delta=grpo.dual_clip,  # trl's cap on the unclipped ratio: for A < 0 it is verl's dual-clip c exactly
        loss_type=grpo.loss_type,
        logging_steps=updates,
        save_strategy="steps",
        save_steps=updates,  # a checkpoint at the end of every SEAL step
        save_total_limit=None,  # the loop prunes to grpo.keep_checkpoints after each commit (runner._prune_checkpoints)
        **(reporting or {"report_to": "none"}),
        disable_tqdm=True,
        seed=recipe.seed,
        bf16=policy.dtype == torch.bfloat16,
        fp16=policy.dtype == torch.float16,
        use_cpu=not torch.cuda.is_available(),
        max_completion_length=recipe.rollout.max_context_tokens,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # several processes: every LoRA weight takes part in every forward
    )

    def rollout_func(prompts: list[str], trainer) -> dict:
        batch = seal_step(step_task_ids(prompts, group))
        check_width(batch, policy.max_sequence_width)
        trainer.seal_batch = batch
        return {
            "prompt_ids": batch.prompt_ids,
            "completion_ids": batch.completion_ids,
            "logprobs": None,  # on-policy: TRL recomputes log-probabilities in the update
            "env_mask": batch.env_mask,
            "verdict": batch.rewards,
        }

    def official_verdict_reward(prompts, completions, verdict, **_) -> list[float]:
        return list(verdict)

    set_seed(recipe.seed)  # LoRA's A matrices are drawn here: the same recipe gives the same run
    trainer = SealGRPOTrainer(
        model=policy.model,
        reward_funcs=[official_verdict_reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": task_ids}),
        processing_class=policy.tokenizer,
        peft_config=policy.peft_config,
        rollout_func=rollout_func,
        callbacks=list(callbacks),
        max_logprob_gap=recipe.rollout.max_logprob_gap,
        shared_prefix=shared_prefix,
        group_batches=policy.backend != "unsloth",
    )
    check_trainer(trainer, policy.backend)
    trainer.remove_callback(PrinterCallback)  # the run shows its own progress; figures go to the store
    keep_trainable_fp32(trainer.model)  # undoes trl's bf16 cast of LoRA weights on 4-bit models
    return trainer
