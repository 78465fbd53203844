"""Finding an environment by what a recipe's ``data.environment`` says, and a task's environment by its name.

A recipe names a shipped environment (``bfcl``; ``library``, the worked example of docs/your-tools.md) or a
user's: ``package.module:attribute`` (importable, or a module in the current directory) or ``path/to/file.py:
attribute``, the attribute an ``Environment`` such as a ``ToolEnvironment``. Once found, an environment is known
by its ``name``, which its tasks carry: ``environment_of(task)`` is how the step plays and judges any task.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from seal_lite.core.errors import ConfigError
from seal_lite.core.types import TurnRecord
from seal_lite.envs.bfcl import BFCL
from seal_lite.envs.task import Environment, Task

SHIPPED = {"bfcl": "seal_lite.envs.bfcl:BFCL", "library": "seal_lite.envs.library:environment"}
REQUIRED = ("name", "categories", "split_ids", "category_of", "load_tasks", "episode", "verdict", "irrelevance",
            "turn_evidence")


class EnvironmentNotFound(ConfigError):
    """``data.environment`` names nothing seal-lite can use; ``reason`` says why and what to write instead."""

    def __init__(self, spec: str, reason: str):
        super().__init__(f"data.environment {spec!r}: {reason}")
        self.reason = reason


_known: dict[str, Environment] = {BFCL.name: BFCL}
_found: dict[str, Environment] = {SHIPPED["bfcl"]: BFCL}


def find_environment(spec: str) -> Environment:
    """The environment ``spec`` names; a ConfigError with the fix when it names none."""
    target = SHIPPED.get(spec, spec)
    if ":" not in target:
        raise EnvironmentNotFound(spec, f"neither a shipped environment ({', '.join(SHIPPED)}) nor module:attribute; "
                                  "name e.g. my_tools:environment, or path/to/my_tools.py:environment")
    module_name, attribute = target.rsplit(":", 1)
    key = f"{Path(module_name).expanduser().resolve()}:{attribute}" if module_name.endswith(".py") else target
    if key in _found:  # a file is known by its full path: the same relative name elsewhere is another file
        return _found[key]
    module = _import(spec, module_name)
    if not hasattr(module, attribute):
        raise EnvironmentNotFound(spec, f"{module_name} has no attribute {attribute!r}; name the ToolEnvironment "
                                  "it defines")
    environment = getattr(module, attribute)
    if missing := [name for name in REQUIRED if not hasattr(environment, name)]:
        raise EnvironmentNotFound(spec, f"{attribute} is a {type(environment).__name__}, not an environment (it "
                                  f"lacks {', '.join(missing)}); make it a seal_lite ToolEnvironment")
    known = _known.get(environment.name)
    if known is not None and known is not environment:
        raise EnvironmentNotFound(spec, f"another environment is already called {environment.name!r}; give this "
                                  "one another name")
    _known[environment.name] = _found[key] = environment
    return environment


def _import(spec: str, module_name: str):
    """The module of a spec: a .py file by path, else an importable module (the current directory included)."""
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser().resolve()
            if not path.is_file():
                raise EnvironmentNotFound(spec, f"no such file {path}")
            loaded = importlib.util.spec_from_file_location(f"seal_lite_environment_{path.stem}", path)
            module = importlib.util.module_from_spec(loaded)
            sys.modules[loaded.name] = module  # as an import does: dataclasses and pickle look the module up
            try:
                loaded.loader.exec_module(module)
            except BaseException:
                del sys.modules[loaded.name]
                raise
            return module
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.append(str(Path.cwd()))  # a module beside the recipe, as `python -m` would find it
        return importlib.import_module(module_name)
    except EnvironmentNotFound:
        raise
    except ModuleNotFoundError as error:
        if module_name == error.name or module_name.startswith(f"{error.name}."):
            raise EnvironmentNotFound(spec, f"no module {error.name!r} (run from the directory that holds it, or "
                                      "name the file: path/to/file.py:attribute)") from None
        raise EnvironmentNotFound(spec, f"importing {module_name} failed: {error}") from None
    except Exception as error:  # the user's module itself failed: its message says what to fix
        raise EnvironmentNotFound(spec, f"importing {module_name} failed: {type(error).__name__}: {error}") from None


def environment_of(task: Task) -> Environment:
    """The environment a task belongs to, found earlier by ``find_environment`` (BFCL's always)."""
    try:
        return _known[task.environment]
    except KeyError:
        raise ConfigError(f"task {task.id!r} belongs to environment {task.environment!r}, which this process has not "
                          "loaded; find it first (seal_lite.envs.registry.find_environment)") from None


def replay_calls(task: Task, steps_per_turn: list[list[list[str]]], parser: str = "lenient") -> list[TurnRecord]:
    """Play calls through a fresh episode, as if a model had sent them: per user turn, per model step, message
    texts (Python call syntax such as ``"cd(folder='x')"`` for the lenient parser, <tool_call> blocks for the
    strict one). Every string is parsed, never evaluated."""
    episode = environment_of(task).episode(task)
    records = []
    for index, steps in enumerate(steps_per_turn):
        record = TurnRecord(task.user_message(index) if index < len(task.turns) else "")
        for step in steps:
            outcomes = [outcome for text in step for outcome in episode.run(text, index, parser)]
            if outcomes:
                record.outcomes_per_step.append(outcomes)
        records.append(record)
    return records
