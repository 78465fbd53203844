"""`seal-lite doctor`: what this machine offers, what is installed, and whether only model tokens carry loss.

``report`` gathers four sections into one JSON-serialisable dict and ``render_text`` prints it:

1. ``hardware``  CPU cores, RAM, torch's build, CUDA and each GPU (memory, native bf16);
2. ``backends``  versions of the training and inference libraries, found through their pip metadata (nothing is
   imported: Unsloth crashes on import without a GPU), checked against seal-lite's pins;
3. ``models``    each registry model: its pip packages, the command that installs the missing ones, and whether
   the converted (trainable) directory is already cached;
4. ``masking_self_test``  one real multi-turn GRPO step on a real BFCL task (see its docstring).

Heavy libraries (torch, transformers, trl) are imported inside the functions that need them, so importing this
module keeps ``seal-lite --help`` fast.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# (import name shown, pip distribution, role). Roles: required by seal-lite, or the optional GPU extra.
BACKENDS: tuple[tuple[str, str, str], ...] = (
    ("torch", "torch", "required"),
    ("transformers", "transformers", "required"),
    ("trl", "trl", "required"),
    ("peft", "peft", "required"),
    ("accelerate", "accelerate", "required"),
    ("llama_cpp", "llama-cpp-python", "required"),  # the local diagnoser
    ("unsloth", "unsloth", "gpu"),
    ("unsloth_zoo", "unsloth-zoo", "gpu"),
    ("bitsandbytes", "bitsandbytes", "gpu"),
)
GPU_EXTRA_INSTALL = "pip install -e '.[gpu]'"


# --- 1. hardware ----------------------------------------------------------------------------------------------


def hardware() -> dict:
    """CPU cores, RAM, torch's version and build, CUDA, and each GPU's name, memory and native bf16."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    total, available = _memory_bytes()
    info = {
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "ram_total_gb": _gb(total),
        "ram_available_gb": _gb(available),
        "torch": None,
        "torch_build": None,
        "cuda_available": False,
        "gpus": [],
        "notes": [],
    }
    try:
        import torch
    except ImportError:
        info["notes"].append("torch is not installed: bash scripts/setup.sh installs it")
        return info
    info["torch"] = torch.__version__
    if torch.version.cuda:
        info["torch_build"] = f"CUDA {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        info["torch_build"] = f"ROCm {torch.version.hip}"
    else:
        info["torch_build"] = "CPU"
    info["cuda_available"] = torch.cuda.is_available()
    for index in range(torch.cuda.device_count() if info["cuda_available"] else 0):
        properties = torch.cuda.get_device_properties(index)
        major, minor = torch.cuda.get_device_capability(index)
        info["gpus"].append({
            "index": index,
            "name": properties.name,
            "memory_gb": _gb(properties.total_memory),
            "compute_capability": f"{major}.{minor}",
            "bf16": major >= 8,  # native bf16 from Ampere on; torch.cuda.is_bf16_supported() also counts emulation
        })
    if not info["cuda_available"] and Path("/proc/driver/nvidia/gpus").is_dir() and any(
            Path("/proc/driver/nvidia/gpus").iterdir()):
        info["notes"].append(f"an NVIDIA GPU is present but torch ({info['torch_build']} build) cannot use it: "
                             "install torch 2.13.0 from PyTorch's CUDA wheel index")
    if info["gpus"] and not all(gpu["bf16"] for gpu in info["gpus"]):
        info["notes"].append("a GPU without native bf16 (before Ampere): training runs in fp16")
    return info


def _memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) RAM in bytes: /proc/meminfo, else sysconf (total only)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = {name: int(value.split()[0]) * 1024 for name, value in fields.items()}
        return kib.get("MemTotal"), kib.get("MemAvailable")
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    except (ValueError, OSError, AttributeError):
        return None, None


def _gb(size: int | None) -> float | None:
    return None if size is None else round(size / 2**30, 1)


# --- 2. backends ----------------------------------------------------------------------------------------------


def backends() -> dict:
    """Installed version of each backend, checked against seal-lite's pins, and the training backend chosen here.

    Found through pip metadata only: nothing is imported (Unsloth crashes on import without a GPU).
    """
    pins = seal_lite_pins()
    cuda = _cuda_visible()
    rows = []
    for name, distribution, role in BACKENDS:
        version = _version(distribution)
        pin = pins.get(_canonical(distribution))
        row = {"name": name, "distribution": distribution, "role": role, "installed": version is not None,
               "version": version, "pin": pin, "ok": True, "note": None, "fix": None}
        if version is None and role == "required":
            row |= {"ok": False, "note": "missing (seal-lite needs it)", "fix": f"pip install '{pin or distribution}'"}
        elif version is None:
            row["note"] = "optional, 4-bit QLoRA on an NVIDIA GPU" + (
                " (bitsandbytes also on a CPU: doctor --backend peft-4bit)" if name == "bitsandbytes" else "")
            if cuda:
                row["fix"] = GPU_EXTRA_INSTALL
        elif pin and not _satisfies(version, pin):
            fix = GPU_EXTRA_INSTALL if role == "gpu" else f"pip install '{pin}'"
            row |= {"ok": False, "note": f"seal-lite pins {pin}, found {version}", "fix": fix}
        rows.append(row)
    return {"packages": rows, "training_backend": _training_backend(cuda)}


def seal_lite_pins() -> dict[str, str]:
    """Canonical distribution name -> requirement (``trl==1.14.2``): from pyproject.toml in a source checkout (an
    editable install's metadata keeps the pins of the day it was installed), else from the installed metadata."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.exists():
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
    else:
        try:
            requirements = importlib.metadata.requires("seal-lite") or []
        except importlib.metadata.PackageNotFoundError:
            return {}
    from packaging.requirements import Requirement  # a dependency of transformers, accelerate and peft

    pins = {}
    for line in requirements:
        requirement = Requirement(line)  # extras ([server]) and markers (extra == 'gpu') are left out of the pin
        if requirement.specifier:
            pins[_canonical(requirement.name)] = f"{requirement.name}{requirement.specifier}"
    return pins


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _satisfies(version: str, pin: str) -> bool:
    from packaging.requirements import Requirement

    return Requirement(pin).specifier.contains(version, prereleases=True)


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _training_backend(cuda: bool) -> dict:
    """What ``policy.backend: auto`` and ``policy.dtype: auto`` pick here, and why (Unsloth is imported only where
    auto would choose it: with a GPU)."""
    from seal_lite.training.policy import installed_backends, pick_dtype, resolve_backend

    backend, reason = resolve_backend("auto", cuda, installed_backends())
    dtype, dtype_reason = pick_dtype("auto", cuda)
    return {"backend": backend, "reason": reason, "dtype": str(dtype).removeprefix("torch."),
            "dtype_reason": dtype_reason}


# --- 3. models ------------------------------------------------------------------------------------------------


def models() -> list[dict]:
    """Each registry model: installed or not (its pip packages), the pip command if not, and its cached conversion.

    Only metadata and file sizes are read: split models are not assembled just to check them.
    """
    from seal_lite.models import REGISTRY, _installed_file, assembled_gguf, converted_dir

    rows = []
    for name, entry in REGISTRY.items():
        parts = []
        for distribution, file_name in zip(entry.distributions, entry.files, strict=True):
            path = _installed_file(distribution, file_name)
            parts.append((distribution, path if path is not None and path.exists() else None))
        missing = [distribution for distribution, path in parts if path is None]
        size = sum(path.stat().st_size for _, path in parts if path is not None)
        gguf = None
        if not missing:
            gguf = parts[0][1] if len(parts) == 1 else assembled_gguf(name)
        converted = converted_dir(gguf, name) if gguf is not None and gguf.exists() else None
        if converted is not None and not (converted / "config.json").exists():
            converted = None
        rows.append({
            "name": name,
            "installed": not missing,
            "packages": [distribution for distribution, _ in parts],
            "missing": missing,
            "size_mb": round(size / 2**20, 1),
            "install": "pip install " + " ".join(missing) if missing else None,
            "converted_dir": str(converted) if converted else None,
        })
    return rows


# --- 4. the masking self-test ---------------------------------------------------------------------------------


@dataclass
class SelfTestResult:
    passed: bool
    message: str  # "ok", or every check that failed, separated by "; "
    model: str
    task_id: str
    trajectories: int = 0
    model_tokens: int = 0  # tokens the policy generated, inside the completions
    env_tokens: int = 0  # environment tokens inside the completions (user turns, tool results, template glue)
    tool_results: int = 0  # tool messages inside the completions (the rest is user turns and template glue)
    max_env_grad: float | None = None  # max |dL/dlogit| on the logits that predict environment tokens
    min_model_grad: float | None = None  # per position: max over the vocabulary of |dL/dlogit|
    mean_model_grad: float | None = None
    loss: float | None = None
    backend: str = "peft"
    dtype: str | None = None  # the compute dtype the step trained in
    linear4bit_layers: int = 0  # bitsandbytes NF4 layers in the policy (peft-4bit)
    trainable_dtypes: list[str] = dataclasses.field(default_factory=list)  # of the LoRA parameters: fp32 only
    lora_changed: int = 0  # LoRA entries the GRPO step moved (of lora_entries)
    lora_entries: int = 0
    seconds: float = 0.0


def masking_self_test(model_dir: str, *, task_id: str = "multi_turn_base_0", turns: int = 2,
                      num_generations: int = 2, max_new_tokens: int = 16, max_model_calls: int = 4,
                      seed: int = 0, dtype: str = "auto", backend: str = "peft",
                      label: str | None = None) -> SelfTestResult:
    """Check on one real multi-turn GRPO step that only the tokens the policy generated carry loss and gradient.

    The model at ``model_dir`` rolls out ``num_generations`` trajectories of the real BFCL task ``task_id``, cut
    to ``turns`` user turns, through the real SEAL step (``SealStep`` with a ``TransformersGenerator``) called by
    TRL's ``rollout_func`` inside the real trainer (``build_trainer``); one ``trainer.train()`` step follows. The
    completions thus hold model tokens and environment tokens (the next user turn, chat-template glue, tool
    results when the model called a tool). Which is which is taken from the generator itself (every sequence it
    produced, found again in the completions), independently of the ``env_mask`` the loop computed. Checks:

    1. the loop's ``env_mask`` marks exactly the generated tokens;
    2. the loss is zero on environment tokens: TRL's loss mask (``completion_mask * tool_mask`` in the output of
       ``_generate_and_score_completions``) is 1 on generated tokens and 0 on environment tokens and padding;
    3. gradients flow only from model tokens: a hook keeps the gradient of the logits in the trainer's loss
       computation (``compute_loss``, then backward). Logits at position t predict token t+1, so the rows that
       predict environment tokens, prompt tokens or padding must get exactly zero gradient, and every row that
       predicts a model token a non-zero one.

    This tests masking, not rewards: a small model usually earns reward 0 on every trajectory, so A = 0 and no
    gradient at all would flow. The advantages the loop computed are therefore replaced by +1/-1 within each
    group before TRL sees them. The step trains in ``dtype`` (auto: the dtype a run would train in) with
    ``backend`` (peft, or peft-4bit: the same step on NF4 ``Linear4bit`` layers, also on a CPU; not unsloth, whose
    fused loss never materialises the logits the probe reads), and with beta = 0: at the first update the KL term
    has zero gradient anyway, and this skips the reference model's forward pass. Besides masking it checks that
    the update moved the LoRA weights and that they are fp32. Store and trainer output go to a temporary
    directory, deleted afterwards. For smollm2-135m on 2 AVX2 cores (fp32): about 65 s with peft, 7-9 minutes
    with peft-4bit (bitsandbytes' CPU NF4 kernels dequantize every weight on every call).
    """
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.generation import TransformersGenerator
    from seal_lite.loop import SealStep
    from seal_lite.recipe import load_recipe
    from seal_lite.store import Store
    from seal_lite.training.grpo import build_trainer
    from seal_lite.training.policy import count_linear4bit, load_policy

    if backend not in ("peft", "peft-4bit"):
        raise ValueError(f"the masking self-test runs on peft or peft-4bit, not {backend}")
    started = time.time()
    overrides = {
        "name": "doctor", "seed": seed, "data.task_ids": [task_id], "diagnoser.mode": "off",
        "grpo.tasks_per_step": 1, "grpo.steps": 1, "rollout.num_generations": num_generations,
        "rollout.max_turns": turns, "rollout.max_new_tokens": max_new_tokens,
        "rollout.max_model_calls": max_model_calls, "policy.dtype": dtype, "grpo.beta": 0.0,
        "policy.backend": backend,
        # the mask does not depend on how tools are shown; one-line signatures keep the prompt near 1k tokens
        "interface.tool_format": "signatures",
        # the probe reads the gradient of every logit row, which only TRL's pass per trajectory computes; the
        # shared-prefix pass computes logits at the loss tokens only, and tests/test_grpo_reference.py shows its
        # log-probs and gradients equal these
        "grpo.shared_prefix": False,
    }
    recipe = load_recipe(None, overrides)
    task = load_tasks([task_id])[0].truncated(turns)
    result = SelfTestResult(False, "", label or model_dir, task_id, backend=backend)
    with tempfile.TemporaryDirectory(prefix="seal-lite-doctor-") as tmp:
        store = Store(Path(tmp) / "seal.db")
        step = SealStep(recipe, store, {task.id: task}, None)
        probe = _Probe(step, num_generations)
        policy = load_policy(model_dir, recipe)
        trainer = build_trainer(policy, recipe, [task.id], probe, str(Path(tmp) / "trl"))
        step.generator = probe.recorder = _RecordingGenerator(
            TransformersGenerator(trainer.model, policy.tokenizer, policy.generation_mode))
        probe.attach(trainer)
        lora = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
        result.loss = float(trainer.train().training_loss)
        failures = probe.check(result)
        result.dtype = str(policy.dtype).removeprefix("torch.")
        result.linear4bit_layers = count_linear4bit(trainer.model)
        if backend == "peft-4bit" and result.linear4bit_layers == 0:
            failures.append("backend peft-4bit, yet the policy has no bitsandbytes Linear4bit layer")
        after = dict(trainer.model.named_parameters())
        result.trainable_dtypes = sorted({str(after[name].dtype).removeprefix("torch.") for name in lora})
        if result.trainable_dtypes != ["float32"]:
            failures.append(f"LoRA parameters in {result.trainable_dtypes}, not float32: small updates round away")
        result.lora_entries = sum(p.numel() for p in lora.values())
        result.lora_changed = sum(int((after[name].detach() != p).sum()) for name, p in lora.items())
        if result.lora_changed == 0:
            failures.append("the GRPO step left every LoRA weight unchanged")
        result.tool_results = sum(_tool_results_inside(store.trajectory(row["id"])["messages"])
                                  for row in store.trajectories())
    result.passed = not failures
    result.message = "; ".join(failures) or "ok"
    result.seconds = round(time.time() - started, 2)
    return result


def _tool_results_inside(messages: list[dict]) -> int:
    """Tool results that a later model message follows (the completion ends with the last model message). They
    come back as user messages of <tool_response> blocks, as on the official surface."""
    last = max((index for index, message in enumerate(messages) if message["role"] == "assistant"), default=-1)
    return sum(message["role"] == "user" and message["content"].startswith("<tool_response>")
               for message in messages[:last])


class _RecordingGenerator:
    """Wraps the real generator and keeps every (context ids, generated ids) pair: the ground truth of which
    completion tokens the policy wrote."""

    def __init__(self, generator):
        self.generator, self.tokenizer = generator, generator.tokenizer
        self.calls: list[tuple[list[int], list[int]]] = []

    def generate(self, batch, max_new_tokens, temperature):
        outputs = self.generator.generate(batch, max_new_tokens, temperature)
        self.calls += [(list(context), list(ids)) for context, ids in zip(batch, outputs, strict=True)]
        return outputs


class _Probe:
    """The SEAL step with +1/-1 advantages, plus captures of TRL's generation output, and of each batch
    ``compute_loss`` saw with the gradient of its logits (max |grad| over the vocabulary, per position)."""

    def __init__(self, step, group: int):
        self.step, self.group = step, group
        self.recorder: _RecordingGenerator | None = None
        self.batch = self.generation = None
        self.losses: list[list] = []  # per compute_loss call: [inputs, gradient or None]

    def __call__(self, prompts: list[str]):
        batch = self.step(prompts)
        signs = [1.0 if (index % self.group) % 2 == 0 else -1.0 for index in range(len(batch.advantages))]
        self.batch = dataclasses.replace(batch, advantages=signs)
        return self.batch

    def attach(self, trainer) -> None:
        """Wrap this trainer's generation and loss (instance attributes: the class stays untouched)."""
        generate_and_score, compute_loss = trainer._generate_and_score_completions, trainer.compute_loss
        # The LM head's output is the logits tensor the loss is computed from; Unsloth's fused loss never
        # materialises it, hence the self-test's peft backend.
        head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings()

        def keep_generation(inputs):
            self.generation = generate_and_score(inputs)
            return self.generation

        def keep_gradient(module, args, logits):
            if logits.requires_grad:
                record = self.losses[-1]
                logits.register_hook(lambda grad: record.__setitem__(1, grad.detach().float().abs().amax(-1).cpu()))

        def loss_with_hook(model, inputs, *args, **kwargs):
            self.losses.append([inputs, None])
            handle = head.register_forward_hook(keep_gradient)
            try:
                return compute_loss(model, inputs, *args, **kwargs)
            finally:
                handle.remove()

        trainer._generate_and_score_completions = keep_generation
        trainer.compute_loss = loss_with_hook

    def check(self, result: SelfTestResult) -> list[str]:
        batch, output = self.batch, self.generation
        if batch is None or output is None or not self.losses:
            return ["the trainer never called the rollout function and the loss"]
        if any(grad is None for _, grad in self.losses):
            return ["no gradient reached the logits in compute_loss"]
        failures = []
        truth = [self._generated_mask(prompt, completion)
                 for prompt, completion in zip(batch.prompt_ids, batch.completion_ids, strict=True)]
        result.trajectories = len(truth)
        result.model_tokens = sum(sum(mask) for mask in truth)
        result.env_tokens = sum(len(mask) - sum(mask) for mask in truth)
        if result.model_tokens == 0 or result.env_tokens == 0:
            failures.append(f"the completions hold {result.model_tokens} model and {result.env_tokens} environment "
                            "tokens: both kinds are needed; use a task with more turns or more model calls")
        advantages = output["advantages"].tolist()
        if advantages != batch.advantages:
            failures.append(f"TRL trained with advantages {advantages}, not the step's {batch.advantages}")

        # 1. The loop's env_mask marks exactly the generated tokens.
        wrong = sum(sum(a != b for a, b in zip(mask, env)) + abs(len(mask) - len(env))
                    for mask, env in zip(truth, batch.env_mask, strict=True))
        if wrong:
            failures.append(f"the loop's env_mask disagrees with the generated tokens at {wrong} positions")

        # 2. TRL's loss mask, in its generation output (rows in rollout order), is the batch's env_mask, padded with 0.
        loss_mask = _loss_mask(output).tolist()
        wrong = sum(sum(a != b for a, b in zip(row, env + [0] * (len(row) - len(env))))
                    for row, env in zip(loss_mask, batch.env_mask, strict=True))
        if wrong:
            failures.append(f"TRL's loss mask (completion_mask * tool_mask) differs from the batch's env_mask at "
                            f"{wrong} positions: loss on environment tokens or padding, or none on model tokens")

        # 3. Gradients of the logits, per row of each batch compute_loss saw (TRL shuffles rows after generation).
        unused = list(range(len(truth)))
        env_grads, other_grads, model_grads = [], [], []
        for inputs, grads in self.losses:
            width = inputs["completion_ids"].shape[1]
            kept = grads.shape[1]  # logits kept for the last `kept` positions of prompt + completion
            for row in range(inputs["completion_ids"].shape[0]):
                prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
                length = int(inputs["completion_mask"][row].sum())
                completion = inputs["completion_ids"][row][:length].tolist()
                match = next((t for t in unused
                              if batch.prompt_ids[t] == prompt and batch.completion_ids[t] == completion), None)
                if match is None:
                    return failures + ["a row of the loss batch is none of the rolled-out trajectories"]
                unused.remove(match)
                for k in range(kept):
                    target = width - kept + k + 1  # logits at position t predict token t + 1: this completion index
                    value = float(grads[row, k])
                    if 0 <= target < length:
                        (model_grads if truth[match][target] else env_grads).append(value)
                    else:
                        other_grads.append(value)  # predicts a prompt token, padding, or nothing (the last position)
        result.max_env_grad = max(env_grads, default=0.0)
        if model_grads:
            result.min_model_grad = min(model_grads)
            result.mean_model_grad = sum(model_grads) / len(model_grads)
        if result.max_env_grad != 0.0:
            failures.append(f"non-zero gradient (max |grad| {result.max_env_grad:.3g}) on logits that predict "
                            "environment tokens")
        if max(other_grads, default=0.0) != 0.0:
            failures.append("non-zero gradient on logits that predict prompt tokens or padding")
        if model_grads and result.min_model_grad <= 0.0:
            zero = sum(value == 0.0 for value in model_grads)
            failures.append(f"{zero} of {len(model_grads)} model tokens got no gradient")
        return failures

    def _generated_mask(self, prompt: list[int], completion: list[int]) -> list[int]:
        """1 on the completion tokens the recorder saw generated for this trajectory, else 0."""
        sequence = prompt + completion
        mask = [0] * len(sequence)
        for context, ids in self.recorder.calls:
            end = len(context) + len(ids)
            if ids and end <= len(sequence) and sequence[:end] == context + ids:
                mask[len(context):end] = [1] * len(ids)
        return mask[len(prompt):]


def _loss_mask(output: dict):
    """The mask TRL's loss uses (GRPOTrainer._compute_loss): completion_mask, times tool_mask when present."""
    return output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]


# --- the report -----------------------------------------------------------------------------------------------


def default_self_test_model() -> str:
    """The default recipe's policy model (smollm2-135m)."""
    from seal_lite.recipe import load_recipe

    return load_recipe(None).policy.model


def report(self_test_model: str | None = None, *, self_test: bool = True, **self_test_options) -> dict:
    """Everything ``seal-lite doctor`` shows, as one JSON-serialisable dict.

    ``self_test_model`` is a model spec as in ``policy.model`` (registry name, directory, .gguf file, hub id);
    None means the default recipe's policy model. ``self_test=False`` skips the self-test (about 20 s on 2 CPU
    cores for smollm2-135m). Extra keyword arguments go to ``masking_self_test``. ``ok`` is False when a required
    backend is missing or mis-pinned, or the self-test failed.
    """
    from seal_lite.models import resolve_model

    result = {
        "seal_lite": _version("seal-lite"),
        "hardware": hardware(),
        "backends": backends(),
        "models": models(),
        "self_test": None,
    }
    if self_test:
        spec = self_test_model or default_self_test_model()
        started = time.time()
        try:
            test = masking_self_test(resolve_model(spec), label=spec, **self_test_options)
        except Exception as error:  # reported as a failed check with its reason, never as a pass
            test = SelfTestResult(False, f"could not run: {type(error).__name__}: {error}", spec,
                                  self_test_options.get("task_id", "multi_turn_base_0"),
                                  seconds=round(time.time() - started, 2))
        result["self_test"] = dataclasses.asdict(test)
    required_ok = all(row["ok"] for row in result["backends"]["packages"] if row["role"] == "required")
    result["ok"] = required_ok and (result["self_test"] is None or result["self_test"]["passed"])
    return result


def render_text(report: dict, *, ascii: bool = False) -> str:
    """A readable plain-text rendering of ``report``: sections, one line per item, the fix where one is needed."""
    yes, no, dash, arrow = ("OK ", "!! ", "-- ", "->") if ascii else ("✓", "✗", "–", "→")
    lines = []

    def item(mark: str, label: str, text: str, fix: str | None = None) -> None:
        lines.append(f"  {mark} {label:<20} {text}" + (f"  {arrow} {fix}" if fix else ""))

    hw = report["hardware"]
    lines.append("Hardware")
    item(yes, "CPU", f"{hw['cpu_cores']} cores ({hw['cpu_cores_usable']} usable), {hw['platform']}, "
                     f"Python {hw['python']}")
    ram = f"{hw['ram_total_gb']} GiB total" if hw["ram_total_gb"] is not None else "unknown"
    if hw["ram_available_gb"] is not None:
        ram += f", {hw['ram_available_gb']} GiB available"
    item(yes if hw["ram_total_gb"] else dash, "RAM", ram)
    if hw["torch"]:
        item(yes, "torch", f"{hw['torch']} ({hw['torch_build']} build)")
    else:
        item(no, "torch", "MISSING", "bash scripts/setup.sh")
    if hw["cuda_available"]:
        item(yes, "CUDA", f"available, {len(hw['gpus'])} GPU(s)")
        for gpu in hw["gpus"]:
            item(yes, f"GPU {gpu['index']}", f"{gpu['name']}, {gpu['memory_gb']} GiB, compute "
                                             f"{gpu['compute_capability']}, bf16 {'yes' if gpu['bf16'] else 'no'}")
    else:
        item(dash, "CUDA", "not available: training and rollouts run on the CPU")
    for note in hw["notes"]:
        item(no, "note", note)

    lines += ["", "Backends"]
    for row in report["backends"]["packages"]:
        pin = f"  (pin {row['pin']})" if row["pin"] and row["ok"] else ""
        if row["installed"]:
            text = f"{row['version']}{pin}" + (f"  {row['note']}" if row["note"] else "")
            item(yes if row["ok"] else no, row["name"], text, row["fix"])
        else:
            item(no if row["role"] == "required" else dash, row["name"],
                 ("MISSING" if row["role"] == "required" else "not installed") + f": {row['note']}", row["fix"])
    chosen = report["backends"].get("training_backend")
    if chosen:
        item(yes, "training backend", f"{chosen['backend']} ({chosen['reason']})")
        item(yes, "training dtype", f"{chosen['dtype']} ({chosen['dtype_reason']})")

    lines += ["", "Models (pip-shipped GGUF)"]
    for row in report["models"]:
        if row["installed"]:
            converted = f"converted: {row['converted_dir']}" if row["converted_dir"] else "not converted yet (first use)"
            item(yes, row["name"], f"installed, {row['size_mb']} MB; {converted}")
        else:
            count = f"{len(row['missing'])} of {len(row['packages'])} packages" if len(row["packages"]) > 1 else "package"
            item(no, row["name"], f"MISSING ({count})", row["install"])

    lines += ["", "Masking self-test (loss and gradient on model tokens only)"]
    test = report["self_test"]
    if test is None:
        item(dash, "skipped", "")
    else:
        where = (f"{test['model']} ({test['backend']}, {test['dtype']}), {test['task_id']}, "
                 f"{test['trajectories']} trajectories")
        if test["passed"]:
            item(yes, "passed", f"{where}, {test['seconds']} s")
        else:
            item(no, "FAILED", f"{where}, {test['seconds']} s: {test['message']}")
        if test["trajectories"]:
            item(dash, "tokens", f"{test['model_tokens']} model, {test['env_tokens']} environment inside the "
                                 f"completions ({test['tool_results']} tool results)")
            model_grad = ("none" if test["min_model_grad"] is None
                          else f"min {test['min_model_grad']:.3g}, mean {test['mean_model_grad']:.3g}")
            item(dash, "|grad| of logits", f"environment positions max {test['max_env_grad']:.3g}; "
                                           f"model positions {model_grad}")
            item(dash, "GRPO step", f"moved {test['lora_changed']} of {test['lora_entries']} LoRA weights "
                                    f"({', '.join(test['trainable_dtypes'])}); {test['linear4bit_layers']} "
                                    "Linear4bit layers")
    lines += ["", _verdict(report, yes, no)]
    return "\n".join(lines)


def _verdict(report: dict, yes: str, no: str) -> str:
    broken = [row["name"] for row in report["backends"]["packages"] if row["role"] == "required" and not row["ok"]]
    test = report["self_test"]
    problems = ([f"fix the backends {', '.join(broken)}"] if broken else []) + (
        ["the masking self-test failed"] if test is not None and not test["passed"] else [])
    if problems:
        return f"{no} not ready to train: {'; '.join(problems)}"
    checked = "masking verified" if test is not None else "masking self-test skipped"
    return f"{yes} ready to train: required backends present, {checked}"
