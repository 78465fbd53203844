"""The TRL adapter: the policy update of a SEAL step through trl 1.14.2's GRPOTrainer (the only TRL import).

How SEAL plugs into GRPOTrainer, through its extension points:

* ``rollout_func`` receives the step's prompts (task ids, each repeated G times, as trl 1.14.2 does) and
  calls back into the SEAL loop, which rolls out, verifies, diagnoses and weights; it returns the token ids
  with ``env_mask`` so only policy tokens carry loss.
* ``_generate_and_score_completions`` is overridden by the smallest possible amount: TRL's own group
  normalisation (std + 1e-4) is replaced by the SEAL advantages the loop computed, A_j = (r_j - mean) /
  (std + 1e-6) times the diagnosis weight w_j (SEAL_METHOD.md §2 steps 7-8).
* the reward function only hands TRL the official verdict the loop already computed, for TRL's logging.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in trl 1.14.2

from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from seal_lite.recipe import Recipe  # noqa: E402


@dataclass
class RolloutBatch:
    """What the SEAL loop returns for one step, one entry per trajectory in TRL's prompt order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    env_mask: list[list[int]]
    rewards: list[float]
    advantages: list[float]  # already multiplied by the diagnosis weights


StepFunction = Callable[[list[str]], RolloutBatch]


def pick_dtype(name: str) -> torch.dtype:
    if name == "float32":
        return torch.float32
    return torch.bfloat16  # auto and bfloat16: ~1.7x faster than float32 on CPU, native on GPUs


def load_policy(model_dir: str, recipe: Recipe):
    transformers_logging.set_verbosity_error()  # the run shows its own progress; keep the terminal readable
    transformers_logging.disable_progress_bar()
    # clean-up of tokenization spaces corrupts BPE text (and warns); decode exactly what was generated
    tokenizer = AutoTokenizer.from_pretrained(model_dir, clean_up_tokenization_spaces=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=pick_dtype(recipe.policy.dtype))
    return model, tokenizer


class StoreCallback(TrainerCallback):
    """Write TRL's per-step training figures (loss, KL, LoRA norm) into the run's store."""

    def __init__(self, store):
        self.store = store

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or state.global_step == 0:
            return
        metrics = {f"grpo/{name}": value for name, value in logs.items() if isinstance(value, (int, float))}
        model = kwargs.get("model")
        if model is not None:
            metrics["grpo/lora_norm"] = lora_norm(model)
        self.store.save_metrics(state.global_step, metrics)
        self.store.update_step(state.global_step, {"loss": float(logs["loss"]), "finished_at": time.time()})


def lora_norm(model) -> float:
    """Frobenius norm of all LoRA parameters: it moves exactly when an update changed the adapter."""
    squares = [p.detach().float().pow(2).sum() for name, p in model.named_parameters() if "lora_" in name]
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


class SealGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are the SEAL-weighted ones of the current rollout batch."""

    seal_batch: RolloutBatch | None = None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        advantages = torch.tensor(self.seal_batch.advantages, dtype=output["advantages"].dtype)
        output["advantages"] = advantages.to(output["advantages"].device)
        return output


def build_trainer(model, tokenizer, recipe: Recipe, task_ids: list[str], seal_step: StepFunction,
                  output_dir: str, callbacks: list[TrainerCallback] = ()) -> SealGRPOTrainer:
    grpo, group = recipe.grpo, recipe.rollout.num_generations
    config = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=grpo.tasks_per_step * group,
        num_generations=group,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_steps=grpo.steps,
        learning_rate=grpo.learning_rate,
        lr_scheduler_type="constant",
        beta=grpo.beta,
        epsilon=grpo.epsilon,
        loss_type=grpo.loss_type,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=recipe.seed,
        bf16=model.dtype == torch.bfloat16,
        use_cpu=not torch.cuda.is_available(),
        max_completion_length=recipe.rollout.max_context_tokens,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=recipe.policy.lora_r,
        lora_alpha=recipe.policy.lora_alpha,
        lora_dropout=recipe.policy.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )

    def rollout_func(prompts: list[str], trainer) -> dict:
        batch = seal_step(prompts)
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

    trainer = SealGRPOTrainer(
        model=model,
        reward_funcs=[official_verdict_reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": task_ids}),
        processing_class=tokenizer,
        peft_config=lora,
        rollout_func=rollout_func,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)  # the run shows its own progress; figures go to the store
    return trainer
