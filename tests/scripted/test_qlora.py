"""The 4-bit QLoRA path (policy.backend peft-4bit) on the CPU: bitsandbytes NF4 Linear4bit layers under a LoRA.

bitsandbytes is in the test install (pyproject's test extra), so these run everywhere, GPU or not.
"""

import pytest
import torch

from seal_lite.core.recipe import load_recipe
from seal_lite.engines import policy as policy_module
from seal_lite.engines.policy import count_linear4bit, load_policy, packed_for_cpu_inference
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo
from tests.helpers import ScriptedGenerator, tool_call_text


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


@pytest.fixture(scope="module")
def qwen2_shaped_dir(tmp_path_factory, smol_tokenizer):
    """A random 2-layer Qwen2 (q/k/v with biases, every projection a multiple of 32 wide, as bitsandbytes' CPU
    inference layout needs) with SmolLM2's tokenizer: the shape on which the repack broke training."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)


def _eval_pass_then_update(model_dir: str, dtype: str):
    """What a SEAL step does to the policy: sample in eval mode without grad, then train. Returns the policy,
    the packed layers after the eval pass and the LoRA gradients of one backward."""
    from peft import get_peft_model

    from seal_lite.engines.transformers_generate import eval_mode

    policy = load_policy(model_dir, load_recipe(None, {"policy.backend": "peft-4bit", "policy.dtype": dtype}))
    model = get_peft_model(policy.model, policy.peft_config)
    policy_module.keep_trainable_fp32(model)
    ids = torch.tensor([list(range(5, 37))])
    with torch.no_grad(), eval_mode(model):
        model(input_ids=ids)
    packed = packed_for_cpu_inference(model)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for name, p in model.named_parameters() if "lora_B" in name]
    return policy, packed, grads


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_4bit_layers_stay_trainable_after_an_eval_pass_on_any_cpu(qwen2_shaped_dir, monkeypatch, dtype):
    """bitsandbytes repacks NF4 weights for CPU inference in eval mode where it detects AVX512_BF16 (read once,
    when a Linear4bit is built). Making it detect AVX512_BF16 on any CPU tests the guard everywhere: after an
    eval-mode pass no layer is packed, and the update computes a gradient for every LoRA."""
    import bitsandbytes.nn.modules

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: True)
    policy, packed, grads = _eval_pass_then_update(qwen2_shaped_dir, dtype)
    assert count_linear4bit(policy.model) == 2 * 7 and packed == 0
    assert all(grad is not None and float(grad.abs().max()) > 0 for grad in grads)


@pytest.mark.skipif(not __import__("bitsandbytes").functional.has_avx512bf16(),
                    reason="bitsandbytes repacks only on a CPU with AVX512_BF16 (its packed kernel needs it)")
def test_without_the_guard_an_eval_pass_repacks_and_training_fails(qwen2_shaped_dir, monkeypatch):
    """The counter-check, where bitsandbytes really repacks: without the guard the eval pass packs every layer
    and the update that follows fails, as it did in the README's test command on such a CPU."""
    monkeypatch.setattr(policy_module, "keep_4bit_layers_trainable", lambda model: None)
    with pytest.raises(RuntimeError):
        _eval_pass_then_update(qwen2_shaped_dir, "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_doctor_backend_peft_4bit_runs_the_self_test_and_a_grpo_step_on_nf4_layers(tiny_model_dir, dtype):
    """`seal-lite doctor --backend peft-4bit` on a CPU: the masking self-test and its GRPO step on NF4 layers.

    On the tiny model: the same command on SmolLM2 (its default) passed on the 2-core AVX2 build machine with 210
    Linear4bit layers, its self-test taking 539 s (447 s at 8 new tokens, against 64 s for the fp32 peft
    self-test: bitsandbytes 0.50.2's CPU NF4 kernels dequantize every weight on every call), too long here."""
    import json

    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["doctor", "--json", "--backend", "peft-4bit", "--dtype", dtype,
                                       "--model", tiny_model_dir])
    assert result.exit_code == 0, result.output
    test = json.loads(result.output)["self_test"]
    assert test["passed"] and test["message"] == "ok" and test["backend"] == "peft-4bit" and test["dtype"] == dtype
    assert test["linear4bit_layers"] == 2 * 7  # 2 decoder blocks of 7 projections
    assert test["trainable_dtypes"] == ["float32"] and test["lora_changed"] > 0
    assert test["max_env_grad"] == 0.0 and test["min_model_grad"] > 0
