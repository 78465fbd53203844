"""The mechanism test reads a policy state from a real checkpoint of `seal-lite run` (tiny random policy, real BFCL
tasks): its LoRA, and its Adam moments by parameter name, as transformers saved them by index."""

import pytest
import torch

from seal_lite.core.recipe import load_recipe
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.train import run
from tests.helpers import answer_with_ground_truth, load_script

mechanism = load_script("mechanism_test")
TASKS = ["multi_turn_base_0", "multi_turn_base_1"]


def test_adams_moments_come_back_under_the_names_they_were_stepped_for(tmp_path, tiny_model_dir, monkeypatch):
    """One optimizer step from a fresh LoRA: every B is zero, so only the B matrices get a gradient, and Adam's first
    step moves each B entry by -lr * sign(its gradient) = -lr * sign(exp_avg). A moment read back under another
    parameter's name (a layer, or q and v, swapped) breaks that."""
    answer_with_ground_truth(monkeypatch, load_tasks(TASKS), lambda row: row % 2 == 0)  # a learning signal
    recipe = load_recipe(None, {
        "policy.model": tiny_model_dir, "policy.dtype": "float32", "diagnoser.mode": "off",
        "rollout.backend": "transformers", "interface.tool_format": "signatures", "data.task_ids": TASKS,
        "grpo.tasks_per_step": 2, "grpo.steps": 1, "grpo.dynamic_sampling": None, "grpo.learning_rate": 1e-4,
        "rollout.num_generations": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
        "rollout.max_model_calls": 1})
    run(recipe, tmp_path)
    [checkpoint] = (tmp_path / "checkpoints").glob("checkpoint-*")

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), checkpoint,
                                      is_trainable=True)
    exp_avg, exp_avg_sq, step = mechanism.adam_state(model, checkpoint)
    parameters = mechanism.trainable(model)
    assert step == 1 and exp_avg.keys() == parameters.keys() == exp_avg_sq.keys()
    moved = 0
    for name, weight in parameters.items():
        assert exp_avg[name].shape == weight.shape
        if "lora_A" in name:
            assert not exp_avg[name].any()  # B was zero: no gradient reached A
            continue
        clear = exp_avg[name].abs() > 1e-6  # far above Adam's eps, so its step is lr * sign
        assert torch.allclose(weight.detach()[clear], -1e-4 * exp_avg[name][clear].sign(), rtol=1e-3)
        moved += int(clear.sum())
    assert moved > 100
    assert exp_avg_sq[next(name for name in parameters if "lora_B" in name)].min() >= 0
    with pytest.raises(FileNotFoundError):
        mechanism.adam_state(model, tmp_path)
