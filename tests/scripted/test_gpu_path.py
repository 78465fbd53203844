"""The GPU path's failures that a CPU can show (issue 37, docs/gpu.md): the code that runs on a GPU, run here on
tiny models or against stand-ins for Unsloth where the CPU cannot load it. What only a GPU shows is
scripts/gpu_check.sh's."""

import os
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.recipe import load_recipe

ROOT = Path(__file__).parents[2]
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")


def _save_trained_adapter(model_dir, path, targets="all-linear") -> dict:
    """A LoRA adapter as a run saves it, with non-zero B matrices (a trained one); returns its LoRA weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=4, target_modules=targets))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    model.save_pretrained(path)
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters() if "lora_" in name}


def _with_lora_added_by_the_backend(monkeypatch):
    """load_policy as on the unsloth backend: the model comes back a PeftModel with a fresh LoRA (B = 0), and
    peft_config None. The same wrapping, with peft, on a CPU."""
    from peft import LoraConfig, get_peft_model

    from seal_lite.engines import policy as policy_module

    load = policy_module.load_policy

    def load_with_lora(model_dir, recipe):
        policy = load(model_dir, recipe)
        policy.model = get_peft_model(policy.model, LoraConfig(r=4, target_modules="all-linear"))
        policy.peft_config = None
        return policy

    monkeypatch.setattr(policy_module, "load_policy", load_with_lora)


@cpu_only
@pytest.mark.parametrize("lora_added_by_the_backend", [False, True], ids=["peft", "unsloth-like"])
def test_evaluation_runs_the_trained_adapter_whoever_added_the_lora(tmp_path, tiny_model_dir, monkeypatch,
                                                                    lora_added_by_the_backend):
    """eval's loader (evaluate.evaluation_engine) on a model that is already a PeftModel: wrapping it a second
    time, as PeftModel.from_pretrained does, loaded nothing and scored the base model as the trained one."""
    from seal_lite.runs.evaluate_bfcl import evaluation_engine

    trained = _save_trained_adapter(tiny_model_dir, tmp_path / "adapter")
    if lora_added_by_the_backend:
        _with_lora_added_by_the_backend(monkeypatch)
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "policy.dtype": "float32"})
    with evaluation_engine(recipe, tmp_path / "adapter", tmp_path / "work") as generator:
        loaded = {name: parameter for name, parameter in generator.model.named_parameters() if "lora_" in name}
    assert sorted(loaded) == sorted(trained)
    assert all(torch.equal(loaded[name], weight) for name, weight in trained.items())


@cpu_only
def test_an_adapter_that_does_not_fit_the_policys_lora_is_an_error(tmp_path, tiny_model_dir, monkeypatch):
    from seal_lite.engines.policy import AdapterLoadError
    from seal_lite.runs.evaluate_bfcl import evaluation_engine

    _save_trained_adapter(tiny_model_dir, tmp_path / "adapter", targets=["q_proj"])  # the backend's LoRA has 7
    _with_lora_added_by_the_backend(monkeypatch)
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "policy.dtype": "float32"})
    with pytest.raises(AdapterLoadError, match=r"24 LoRA weights missing.*same policy.model, lora_r and targets"):
        with evaluation_engine(recipe, tmp_path / "adapter", tmp_path / "work"):
            pass


# --- Unsloth's sequence width: no row cut -----------------------------------------------------------------------

def test_unsloths_max_seq_length_holds_the_widest_padded_row_without_rescaling_rope():
    from seal_lite.engines.policy import unsloth_max_seq_length

    assert unsloth_max_seq_length(16384, 32768) == 32768  # Qwen2.5: a longest prompt plus a longest completion
    assert unsloth_max_seq_length(4096, 32768) == 8192
    assert unsloth_max_seq_length(16384, 8192) == 8192  # never past the model's window (Unsloth would rescale RoPE)


@pytest.fixture
def fake_unsloth(tmp_path, monkeypatch):
    """An importable ``unsloth`` whose FastLanguageModel records its arguments and loads a plain transformers model
    (Unsloth itself needs a GPU), for a child process too."""
    package = tmp_path / "site" / "unsloth"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "CALLS = []\n"
        "class FastLanguageModel:\n"
        "    @staticmethod\n"
        "    def from_pretrained(model_name, **kwargs):\n"
        "        CALLS.append(('from_pretrained', model_name, kwargs))\n"
        "        model = AutoModelForCausalLM.from_pretrained(model_name)\n"
        "        model.max_seq_length = kwargs['max_seq_length']\n"
        "        return model, AutoTokenizer.from_pretrained(model_name)\n"
        "    @staticmethod\n"
        "    def get_peft_model(model, **kwargs):\n"
        "        from peft import LoraConfig, get_peft_model\n"
        "        CALLS.append(('get_peft_model', kwargs))\n"
        "        return get_peft_model(model, LoraConfig(r=kwargs['r'], target_modules=kwargs['target_modules']))\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "site"),
                                                                     os.environ.get("PYTHONPATH")])))
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    yield package
    sys.modules.pop("unsloth", None)


def test_the_unsloth_backend_loads_the_model_named_with_room_for_the_widest_row(tiny_model_dir, fake_unsloth):
    """The exact model name (Unsloth's mapper would swap Qwen/... for its own pre-quantized repo) and a
    max_seq_length of twice the context (TRL pads rows to the longest prompt plus the longest completion)."""
    from seal_lite.engines.policy import _load_unsloth

    recipe = load_recipe(None, {"rollout.max_context_tokens": 2048})
    model, _ = _load_unsloth(tiny_model_dir, recipe, checkpointing=False)
    import unsloth

    (_, name, kwargs), _ = unsloth.CALLS
    assert name == tiny_model_dir and kwargs["use_exact_model_name"] is True and kwargs["dtype"] is None
    assert kwargs["max_seq_length"] == model.max_seq_length == 4096


def _one_task_step(tmp_path, policy, recipe):
    from seal_lite.engines.store import Store
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.algorithm import SealStep
    from seal_lite.training import grpo
    from tests.helpers import ScriptedGenerator

    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    step = SealStep(recipe, Store(tmp_path / "seal.db"), {task.id: task},
                    ScriptedGenerator(policy.tokenizer, [["No."], ["Yes, done."]]))
    return grpo.build_trainer(policy, recipe, [task.id], step, str(tmp_path / "trl"))


@cpu_only
def test_a_step_wider_than_the_model_takes_uncut_is_refused_before_the_update(tmp_path, tiny_model_dir):
    from seal_lite.engines.policy import load_policy
    from seal_lite.training.grpo import TrainerError, lora_norm

    recipe = load_recipe(None, {"policy.dtype": "float32", "data.task_ids": ["multi_turn_base_0"],
                                "grpo.tasks_per_step": 1, "grpo.steps": 1, "rollout.num_generations": 2,
                                "rollout.max_turns": 1, "diagnoser.mode": "off"})
    policy = load_policy(tiny_model_dir, recipe)
    policy.max_sequence_width = 64  # the opening alone (system prompt and tool docs) is far wider
    trainer = _one_task_step(tmp_path, policy, recipe)
    before = lora_norm(trainer.model)
    with pytest.raises(TrainerError, match=r"padded rows are \d+ tokens wide, and the model takes 64 uncut"):
        trainer.train()
    assert lora_norm(trainer.model) == before


# --- the trainer on the unsloth backend is Unsloth's ------------------------------------------------------------

def test_the_unsloth_backend_refuses_a_trainer_that_is_not_unsloths():
    from seal_lite.training.grpo import SealGRPOTrainer, TrainerError, check_trainer

    plain = SealGRPOTrainer.__new__(SealGRPOTrainer)  # TRL's GRPOTrainer underneath: Unsloth did not patch it
    with pytest.raises(TrainerError, match="the trainer is TRL's, not Unsloth's"):
        check_trainer(plain, "unsloth")
    check_trainer(plain, "peft-4bit")
    patched = type("SealGRPOTrainer", (type("UnslothGRPOTrainer", (), {}),), {})()  # SEAL's over Unsloth's
    check_trainer(patched, "unsloth")


# --- doctor never patches its own process with Unsloth ----------------------------------------------------------

def test_doctor_tries_unsloth_in_a_child_process(fake_unsloth):
    from seal_lite.runs.doctor import _training_backend

    choice = _training_backend(cuda=True)
    assert choice["backend"] == "unsloth"
    assert "unsloth" not in sys.modules  # the self-test that follows runs TRL's trainer, as a peft run does
    (fake_unsloth / "__init__.py").write_text("raise RuntimeError('Unsloth: no NVIDIA driver found')\n")
    choice = _training_backend(cuda=True)
    assert choice["backend"] == "peft-4bit"
    assert choice["reason"].startswith("auto: import unsloth failed (RuntimeError: Unsloth: no NVIDIA driver found)")


# --- a torch the card runs; no GPU recipe on a CPU --------------------------------------------------------------

def test_doctor_names_a_torch_build_the_driver_cannot_run_and_the_build_that_can():
    from seal_lite.runs.doctor import driver_note

    note = driver_note("13.0", "550.54.15")  # PyPI's torch 2.13.0 on Colab's driver of 2025
    assert "needs NVIDIA driver 580.65.06 or newer, and this one is 550.54.15" in note
    assert "--index-url https://download.pytorch.org/whl/cu126" in note
    assert driver_note("13.0", "580.82.07") is None
    assert driver_note("12.6", "550.54.15") is None  # a CUDA 12 build runs from 525 on
    assert driver_note("12.6", "470.57.02") is not None
    assert driver_note(None, "550.54.15") is None and driver_note("13.0", None) is None  # a CPU build; no driver


@cpu_only
@pytest.mark.parametrize("recipe", ["colab-t4", "gpu-24gb", "paper-qwen2.5-7b", "ablation-vanilla-grpo"])
def test_a_gpu_recipe_without_a_gpu_is_refused_before_anything_is_written(tmp_path, recipe):
    path = ROOT / "recipes" / f"{recipe}.yaml"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    if load_recipe(path).policy.backend == "unsloth":  # the T4's: Unsloth itself is what is missing
        assert "policy.backend" in result.output and "Unsloth is not installed (it needs an NVIDIA GPU)" in result.output
    else:
        assert "policy.device" in result.output and "needs an NVIDIA GPU and torch sees none" in result.output
        assert "--set policy.device=auto" in result.output
    assert "--card" in result.output  # and how to plan it for a card from this machine
    assert not (tmp_path / "r").exists()


def test_the_t4_recipe_plays_paged_rollouts_on_a_policy_that_runs_them(monkeypatch):
    """colab-t4 names peft-4bit and rollout.backend paged: on a T4 with Unsloth installed, auto would pick Unsloth,
    whose attention the paged engine cannot run; named, the recipe check accepts it, and refuses it where
    bitsandbytes is missing, with the install line."""
    from seal_lite.runs import preflight

    recipe = load_recipe(ROOT / "recipes" / "colab-t4.yaml")
    assert (recipe.policy.backend, recipe.rollout.backend) == ("peft-4bit", "paged")
    monkeypatch.setattr(preflight, "_cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "_installed", lambda module: True)
    assert preflight.policy_problems(recipe.policy) == [] and preflight.recipe_problems(recipe) == []
    monkeypatch.setattr(preflight, "_installed", lambda module: module != "bitsandbytes")
    problems = [problem for problem in preflight.policy_problems(recipe.policy) if problem[0] == "policy.backend"]
    assert problems and "pip install -e '.[gpu]'" in problems[0][2]


@cpu_only
def test_float16_is_refused_without_a_gpu(tmp_path):
    """float16 is for a GPU: what auto picks on a T4, named to check a T4's numerics on a newer card."""
    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--set", "policy.dtype=float16"])
    assert result.exit_code == 2 and "policy.dtype" in result.output and "float16 training needs a GPU" in result.output
    assert not (tmp_path / "r").exists()


def test_unsloth_rollouts_decode_in_its_rl_scope_and_free_its_graphs_before_the_update(tmp_path, monkeypatch):
    """Unsloth replays its decode step as CUDA graphs only inside its RL generation scope: seal-lite's rollouts enter
    it, and leave it through release_for_training (graphs and decode buffers freed) before for_training, as Unsloth's
    own RL trainers do (unsloth/models/rl.py, unsloth_unwrap_model_for_generation). A stand-in for Unsloth's modules
    records the order of the calls (Unsloth itself needs a GPU)."""
    from seal_lite.engines.policy import _unsloth_generation_mode

    site = tmp_path / "site"
    (site / "unsloth" / "models").mkdir(parents=True)
    (site / "unsloth" / "__init__.py").write_text(
        "CALLS = []\n"
        "class FastLanguageModel:\n"
        "    for_inference = staticmethod(lambda model: CALLS.append('for_inference'))\n"
        "    for_training = staticmethod(lambda model: CALLS.append('for_training'))\n")
    (site / "unsloth" / "models" / "__init__.py").write_text("")
    (site / "unsloth" / "models" / "_decode_graphs.py").write_text(
        "import contextlib\n"
        "from unsloth import CALLS\n"
        "@contextlib.contextmanager\n"
        "def rl_generation():\n"
        "    CALLS.append('rl_generation')\n"
        "    yield\n"
        "    CALLS.append('rl_generation ends')\n"
        "def release_for_training(model):\n"
        "    CALLS.append('release_for_training')\n")
    monkeypatch.syspath_prepend(str(site))
    for name in ("unsloth", "unsloth.models", "unsloth.models._decode_graphs"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import unsloth

    model = torch.nn.Linear(2, 2)
    with _unsloth_generation_mode(model):
        unsloth.CALLS.append("generate")
    assert unsloth.CALLS == ["for_inference", "rl_generation", "generate", "rl_generation ends",
                             "release_for_training", "for_training"]
    unsloth.CALLS.clear()
    with pytest.raises(RuntimeError), _unsloth_generation_mode(model):  # a failed rollout frees them too
        raise RuntimeError("out of memory")
    assert unsloth.CALLS[-2:] == ["release_for_training", "for_training"]
    for name in ("unsloth", "unsloth.models", "unsloth.models._decode_graphs"):
        sys.modules.pop(name, None)
