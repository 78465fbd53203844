"""Choosing and loading the policy backend (the GPU paths are chosen here without a GPU; see benchmarks/RESULTS.md)."""

import sys

import pytest
import torch

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.policy import (
    PolicyBackendError,
    choose_backend,
    cpu_native_bf16,
    load_policy,
    pick_dtype,
    resolve_backend,
)

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")


@pytest.mark.parametrize(("cuda", "installed", "expected"), [
    (True, {"unsloth", "bitsandbytes"}, "unsloth"),
    (True, {"bitsandbytes"}, "peft-4bit"),
    (True, set(), "peft"),
    (False, {"unsloth", "bitsandbytes"}, "peft"),
])
def test_auto_prefers_unsloth_then_bitsandbytes_then_plain_lora(cuda, installed, expected):
    assert choose_backend("auto", cuda, installed)[0] == expected


def test_requested_backend_that_cannot_run_says_why_and_what_to_use():
    with pytest.raises(PolicyBackendError, match="needs an NVIDIA GPU.*use auto, peft-4bit or peft"):
        choose_backend("unsloth", False, {"unsloth"})
    with pytest.raises(PolicyBackendError, match=r"pip install -e '\.\[gpu\]'"):
        choose_backend("unsloth", True, {"bitsandbytes"})
    with pytest.raises(PolicyBackendError, match="bitsandbytes"):
        choose_backend("peft-4bit", True, set())
    with pytest.raises(PolicyBackendError, match="bitsandbytes"):
        choose_backend("peft-4bit", False, set())
    assert choose_backend("peft", True, {"unsloth"})[0] == "peft"


def test_4bit_runs_on_a_cpu_when_requested_but_auto_keeps_plain_lora_there():
    backend, reason = choose_backend("peft-4bit", False, {"bitsandbytes"})
    assert backend == "peft-4bit" and "CPU" in reason
    assert choose_backend("auto", False, {"bitsandbytes"})[0] == "peft"


@cpu_only
def test_4bit_policy_loads_nf4_layers_on_a_cpu(tiny_model_dir):
    from seal_lite.engines.policy import count_linear4bit

    policy = load_policy(tiny_model_dir, load_recipe(None, {"policy.backend": "peft-4bit", "policy.dtype": "float32"}))
    assert policy.backend == "peft-4bit" and policy.model.device.type == "cpu"
    assert count_linear4bit(policy.model) == 2 * 7  # every projection of both decoder blocks


@pytest.fixture
def broken_unsloth(tmp_path, monkeypatch):
    """An installed `unsloth` whose import fails, as a real one does with a torch or driver it does not support."""
    package = tmp_path / "site" / "unsloth"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('Unsloth: no NVIDIA driver found\\nmore detail')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)


def test_auto_falls_back_with_the_reason_when_unsloth_fails_to_import(broken_unsloth):
    installed = {"unsloth", "bitsandbytes"}
    backend, reason = resolve_backend("auto", True, installed)
    assert backend == "peft-4bit"
    assert reason == ("auto: import unsloth failed (RuntimeError: Unsloth: no NVIDIA driver found); a GPU and "
                      "bitsandbytes are available (no Unsloth)")
    assert resolve_backend("auto", True, {"unsloth"})[0] == "peft"
    with pytest.raises(PolicyBackendError, match=r"policy.backend unsloth: import unsloth failed \(RuntimeError"):
        resolve_backend("unsloth", True, installed)
    assert resolve_backend("auto", False, installed)[0] == "peft"  # no GPU: Unsloth is not even tried


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_auto_dtype_on_a_cpu_is_bf16_only_where_the_cpu_computes_it_natively():
    assert cpu_native_bf16(AVX2_ONLY) == (False, ("the CPU has neither AVX512_BF16 nor AMX: bf16 would be "
                                                  "emulated, several times slower than fp32"))
    assert cpu_native_bf16(SAPPHIRE_RAPIDS) == (True, "the CPU has AVX512_BF16 and AMX")
    assert cpu_native_bf16("flags\t: avx512_bf16\n")[0] and cpu_native_bf16("flags\t: amx_bf16\n")[0]
    assert pick_dtype("auto", False, AVX2_ONLY) == (torch.float32, "auto: " + cpu_native_bf16(AVX2_ONLY)[1])
    assert pick_dtype("auto", False, SAPPHIRE_RAPIDS)[0] == torch.bfloat16
    assert pick_dtype("bfloat16", False, AVX2_ONLY) == (torch.bfloat16, "requested in the recipe")
    assert pick_dtype("float32", False, SAPPHIRE_RAPIDS)[0] == torch.float32


@cpu_only
def test_cpu_loads_plain_lora_in_the_recipe_dtype(tiny_model_dir):
    native = cpu_native_bf16()[0]  # this machine's own flags decide auto
    for dtype, expected in (("auto", torch.bfloat16 if native else torch.float32), ("float32", torch.float32),
                            ("bfloat16", torch.bfloat16)):
        policy = load_policy(tiny_model_dir, load_recipe(None, {"policy.dtype": dtype}))
        assert (policy.backend, policy.dtype, policy.model.dtype) == ("peft", expected, expected)
        assert policy.peft_config is not None  # TRL wraps the model with LoRA
        assert not any(hasattr(module, "lora_A") for module in policy.model.modules())


@cpu_only
def test_run_with_an_impossible_backend_fails_cleanly(tmp_path, tiny_model_dir):
    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--set", f"policy.model={tiny_model_dir}",
                                       "--set", "policy.backend=unsloth", "--set", "diagnoser.mode=off"])
    assert result.exit_code == 2  # refused before anything is written (seal_lite/runs/preflight.py)
    assert "policy.backend = 'unsloth': Unsloth" in result.output and "NVIDIA GPU" in result.output
    assert not (tmp_path / "r").exists()
    assert not isinstance(result.exception, PolicyBackendError)  # shown as a message, not a traceback


@cpu_only
@pytest.mark.parametrize("checkpointing", [None, False, True])
def test_gradient_checkpointing_is_what_the_recipe_says(tmp_path, tiny_model_dir, checkpointing):
    """trl's GRPOConfig turns checkpointing on by default; the recipe decides (None: on with a GPU only)."""
    from seal_lite.engines.store import Store
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.algorithm import SealStep
    from seal_lite.training import grpo
    from tests.helpers import ScriptedGenerator

    recipe = load_recipe(None, {"policy.gradient_checkpointing": checkpointing, "policy.dtype": "float32",
                                "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1,
                                "rollout.num_generations": 2, "rollout.max_turns": 1, "diagnoser.mode": "off"})
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    policy = load_policy(tiny_model_dir, recipe)
    step = SealStep(recipe, Store(tmp_path / "seal.db"), {task.id: task},
                    ScriptedGenerator(policy.tokenizer, [["No."], ["No."]]))
    trainer = grpo.build_trainer(policy, recipe, [task.id], step, str(tmp_path / "trl"))
    trainer.train()
    assert trainer.model.get_base_model().is_gradient_checkpointing is bool(checkpointing)


@cpu_only
def test_rollouts_sample_in_eval_mode_and_training_resumes(tiny_model_dir):
    from seal_lite.engines.transformers_generate import TransformersGenerator

    policy = load_policy(tiny_model_dir, load_recipe(None, {"policy.dtype": "float32"}))
    model = policy.model
    model.train()
    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    generator = TransformersGenerator(model, policy.tokenizer, policy.generation_mode)
    generator.generate([[1, 2, 3]], max_new_tokens=3, temperature=1.0)
    assert modes and not any(modes) and model.training


@cpu_only
@pytest.mark.parametrize(("pad", "eos_ids"), [
    (None, None),                             # no pad token at all
    ("<|im_end|>", None),                     # pads with its end-of-turn token
    ("<|endoftext|>", ["<|im_end|>", "<|endoftext|>"]),  # Qwen2.5: pads with a token it also stops at
])
def test_the_pad_token_is_never_a_stop_token(tmp_path, tiny_model_dir, pad, eos_ids):
    """Unsloth rebuilds attention masks from the pad id: a pad the model emits to end a turn would hide it."""
    import shutil

    from transformers import AutoTokenizer, GenerationConfig

    from seal_lite.engines.transformers_generate import TransformersGenerator

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = pad
    tokenizer.save_pretrained(model_dir)
    if eos_ids:
        GenerationConfig(eos_token_id=tokenizer.convert_tokens_to_ids(eos_ids)).save_pretrained(model_dir)
    policy = load_policy(str(model_dir), load_recipe(None, {"policy.dtype": "float32"}))
    stops = TransformersGenerator(policy.model, policy.tokenizer).stop_ids
    assert policy.tokenizer.pad_token_id is not None and policy.tokenizer.pad_token_id not in stops
    assert len(stops) >= (len(eos_ids) if eos_ids else 1)
    assert policy.model.config.pad_token_id == policy.tokenizer.pad_token_id


@cpu_only
def test_the_checkpoints_sampling_defaults_are_dropped_but_its_stop_tokens_kept(tmp_path, tiny_model_dir):
    import shutil

    from transformers import GenerationConfig

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    GenerationConfig(eos_token_id=[2, 0], do_sample=True, repetition_penalty=1.05, temperature=0.7, top_k=20,
                     top_p=0.8, no_repeat_ngram_size=3).save_pretrained(model_dir)
    config = load_policy(str(model_dir), load_recipe(None, {"policy.dtype": "float32"})).model.generation_config
    assert config.eos_token_id == [2, 0]
    for name in ("repetition_penalty", "temperature", "top_k", "top_p", "no_repeat_ngram_size", "do_sample"):
        assert getattr(config, name) is None, name

