"""The 4-bit QLoRA path (policy.backend peft-4bit) on the CPU: bitsandbytes NF4 Linear4bit layers under a LoRA.

bitsandbytes is in the test install (pyproject's test extra), so these run everywhere, GPU or not.
"""

import torch
from conftest import ScriptedGenerator, tool_call_text

from seal_lite.envs.bfcl import load_tasks
from seal_lite.loop import SealStep
from seal_lite.recipe import load_recipe
from seal_lite.store import Store
from seal_lite.training import grpo
from seal_lite.training.policy import count_linear4bit, load_policy


def _two_updates(tmp_path, model_dir, keep_fp32: bool):
    """One SEAL step in two mini-batches (one passing, one failing trajectory): two optimizer steps at lr 2e-5
    on a bf16-compute NF4 policy. Returns the trainer, the LoRA weights before, and the policy."""
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.mini_batches": 2,
        "grpo.beta": 0.0, "grpo.learning_rate": 2e-5, "rollout.num_generations": 2, "rollout.max_turns": 1,
        "policy.backend": "peft-4bit", "policy.dtype": "bfloat16", "diagnoser.mode": "off",
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(model_dir, recipe)
    scripts = [[tool_call_text(task.ground_truth[0]), "Done."], [tool_call_text(["mkdir(dir_name='x')"]), "Done."]]
    step = SealStep(recipe, store, {task.id: task}, ScriptedGenerator(policy.tokenizer, scripts))
    trainer = grpo.build_trainer(policy, recipe, [task.id], step, str(tmp_path / "trl"))
    if not keep_fp32:  # what trl 1.14.2 leaves: LoRA weights in bf16
        for parameter in trainer.model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.to(torch.bfloat16)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}
    trainer.train()
    return trainer, before, policy


def test_4bit_policy_trains_fp32_lora_on_nf4_layers_without_upcasting_the_rest(tmp_path, tiny_model_dir):
    trainer, before, policy = _two_updates(tmp_path, tiny_model_dir, keep_fp32=True)
    model = trainer.model
    assert policy.backend == "peft-4bit"
    assert count_linear4bit(model) == 2 * 7  # every projection of both decoder blocks is NF4
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    assert trainable == {torch.float32}
    # embeddings and LM head stay in the compute dtype (prepare_model_for_kbit_training would make them fp32)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert model.get_output_embeddings().weight.dtype == torch.bfloat16
    # the second update moves (nearly) every lora_A entry (its gradient is non-zero once lora_B is): fp32 keeps them all
    moved = sum(int((p.detach() != before[n]).sum()) for n, p in model.named_parameters() if n in before)
    total = sum(p.numel() for p in before.values())
    assert moved > 0.99 * total  # (an entry or two may see an exactly zero gradient)


def test_bf16_lora_loses_most_of_those_updates(tmp_path, tiny_model_dir):
    """The counter-check: the same two updates on bf16 LoRA weights (trl's cast) round most of lora_A away."""
    trainer, before, _ = _two_updates(tmp_path, tiny_model_dir, keep_fp32=False)
    moved = sum(int((p.detach() != before[n]).sum()) for n, p in trainer.model.named_parameters() if n in before)
    total = sum(p.numel() for p in before.values())
    assert moved < total // 2


def test_doctor_backend_peft_4bit_runs_the_self_test_and_a_grpo_step_on_nf4_layers(tiny_model_dir):
    """`seal-lite doctor --backend peft-4bit` on a CPU: the masking self-test and its GRPO step on NF4 layers.

    On the tiny model: the same command on SmolLM2 (its default) passed on the 2-core AVX2 build machine with 210
    Linear4bit layers, its self-test taking 539 s (447 s at 8 new tokens, against 64 s for the fp32 peft
    self-test: bitsandbytes 0.50.2's CPU NF4 kernels dequantize every weight on every call), too long here."""
    import json

    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["doctor", "--json", "--backend", "peft-4bit", "--model", tiny_model_dir])
    assert result.exit_code == 0, result.output
    test = json.loads(result.output)["self_test"]
    assert test["passed"] and test["message"] == "ok" and test["backend"] == "peft-4bit"
    assert test["linear4bit_layers"] == 2 * 7  # 2 decoder blocks of 7 projections
    assert test["trainable_dtypes"] == ["float32"] and test["lora_changed"] > 0
    assert test["max_env_grad"] == 0.0 and test["min_model_grad"] > 0
