"""seal-lite as a library: one function per command, for notebooks and scripts. ``seal-lite`` is a thin layer on top.

A notebook cell (the quickstart recipe; minutes on a CPU)::

    import seal_lite

    recipe = seal_lite.load_recipe("recipes/quickstart.yaml", {"grpo.steps": 1})
    summary = seal_lite.run(recipe, "runs/notebook")
    results = seal_lite.evaluate("runs/notebook", tasks=1, base=True)
    print(results["summary"]["step 1"]["mean"])  # {'tasks': ..., 'accuracy': ..., 'turn_pass_rate': ...}
    for row in seal_lite.diagnose("runs/notebook", failed=True):
        print(row["id"], row["labels"])
    print(seal_lite.prompt("multi_turn_base_0").tokens)
    print(seal_lite.report("runs/notebook"))  # runs/notebook/report/report.html
    for record in seal_lite.verify(['{"id": "multi_turn_base_0", "turns": [[], [], [], []]}']):
        print(record["valid"], record["labels"])

Your own tools instead of BFCL: ``seal_lite.ToolEnvironment(name, ToolClass, tasks)`` in a file a recipe's
``data.environment`` names (docs/your-tools.md).

Every error a caller can fix is a ``seal_lite.SealLiteError`` (``ConfigError``, ``ModelError`` or ``RunError``)
whose message says what to do. Heavy libraries (torch, transformers) load inside the functions that need them.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.errors import ConfigError, RunError, SealLiteError
from seal_lite.core.recipe import Recipe, RecipeError, load_recipe
from seal_lite.core.types import NoProgress, Progress
from seal_lite.envs.python_tools import ToolEnvironment  # noqa: F401  (seal_lite.ToolEnvironment)

__all__ = ["SealLiteError", "card_plan", "checked_recipe", "diagnose", "doctor", "evaluate", "export", "interface_version",
           "interface_versions", "load_recipe", "parse_overrides", "prompt", "report", "run", "screen", "trajectory",
           "verify", "verify_summary"]

SCREEN_SAMPLES = 4  # samples per task of a screen whose recipe sets none (data.screen)
TRAJECTORY_KEYS = ("id", "step", "task_id", "reward", "weight", "num_model_calls", "stop_reason")


def parse_overrides(pairs: Iterable[str]) -> dict:
    """``--set`` pairs such as ``grpo.steps=1`` as ``load_recipe``'s overrides, each value read as YAML (so 1 is a
    number and null is None)."""
    import yaml

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: write KEY=VALUE, e.g. grpo.steps=1")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def checked_recipe(path: str | Path | None = None, overrides: dict | None = None, *, out_dir: str | Path | None = None,
                   processes: int = 1) -> Recipe:
    """``load_recipe``, then checked against this machine (models installed, task ids, backends usable), the run
    directory it would write (``out_dir``, default the recipe's) and ``processes`` processes sharing it. Every
    problem at once, one line each naming the file and the field, in one ``RecipeError``; nothing is written."""
    from seal_lite.runs import preflight

    source = str(path or "default recipe")
    try:
        recipe, problems = preflight.load_checked_recipe(path, overrides), []
    except RecipeError as error:
        recipe, problems = None, str(error).splitlines()
    if recipe is not None:
        problems += [f"{source}: {problem}" for problem in recipe.process_problems(processes)]
    target = Path(out_dir) if out_dir else recipe.out_dir() if recipe else None
    if target is not None and (problem := preflight.out_dir_problem(target)):
        field = "output_dir" if recipe and recipe.output_dir else "name"
        problems.append(f"--out {str(target)!r}: {problem}" if out_dir else
                        f"{source}: {field} = {getattr(recipe, field)!r}: {problem}")
    if problems:
        raise RecipeError("\n".join(problems))
    return recipe


def card_plan(recipe: Recipe, card: str) -> dict:
    """What ``recipe`` needs on a card before one is rented (``seal-lite recipe RECIPE --card NAME``): the memory
    model's widest generate call and the budget that fits, the update's estimated peak, and the estimated hours
    (seal_lite/core/plan.py). ``card``: a card class's name (``plan.card_key``: rtx-4090, t4, ...) or ``here``, the
    GPU torch sees. The recipe is not checked against this machine: the card is elsewhere."""
    from seal_lite.core import plan
    from seal_lite.engines.model_sources import model_shape

    try:
        shape = model_shape(recipe.policy.model)
    except ConfigError as error:
        raise ConfigError(f"--card: {error}") from None
    return plan.card_plan(recipe, shape, _card(card))


def rehearse(recipe_path: str | Path | None, overrides: dict | None = None, out_dir: str | Path | None = None,
             card: str | None = None, echo: Callable[[str], None] = lambda line: None):
    """``seal-lite rehearse``: the recipe's own configuration for ``card`` (a card class's name; None: the smallest
    the memory model fits it on) at toy size on this machine, two steps killed and resumed
    (seal_lite/runs/rehearse.py). Returns its ``Rehearsal``: what ran beside what the card runs, and the checks."""
    import shutil

    from seal_lite.runs import rehearse as rehearsal

    recipe = load_recipe(recipe_path, overrides)  # not checked here: its GPU, model and card are elsewhere
    out = Path(out_dir) if out_dir else Path("runs") / f"{recipe.name}-rehearsal"
    if out.exists() and any(out.iterdir()) and not (out / "rehearsal.yaml").exists():
        raise ConfigError(f"--out {out}: a folder that holds something else than a rehearsal; name an empty or new one")
    for earlier in ("run", rehearsal.FACTS):  # a rehearsal starts afresh: it must kill and resume a run
        path = out / earlier
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return rehearsal.rehearse(recipe, out, _card(card) if card else None, echo)


def _card(name: str):
    """The card class ``name`` names, or for ``here`` the one whose name the GPU torch sees carries."""
    from seal_lite.core import plan

    named = {plan.card_key(card): card for card in plan.CARDS}
    if name != "here":
        if name not in named:
            raise ConfigError(f"--card {name!r}: plans know {', '.join(named)} and here (the GPU torch sees)")
        return named[name]
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("--card here: torch sees no GPU; name a card instead, e.g. --card rtx-4090")
    device = torch.cuda.get_device_name().upper().replace("-", " ").split()  # NVIDIA A100 SXM4 80GB
    for card in plan.CARDS:
        model = next(word for word in card.name.upper().split() if any(c.isdigit() for c in word))  # A100, 4090
        if model in device:
            return card
    raise ConfigError(f"--card here: {torch.cuda.get_device_name()} is none of the card classes a plan knows; name "
                      f"the closest: {', '.join(named)}")


def launched_processes() -> int:
    """How many processes a launcher (accelerate, torchrun) started for this run; 1 without one."""
    from seal_lite.engines import distributed

    return distributed.world_size()


def is_main_process() -> bool:
    """Whether this process is rank 0, the one that writes the store and prints."""
    from seal_lite.engines import distributed

    return distributed.is_main()


def relaunch(processes: int, arguments: list[str]) -> None:
    """Replace this process by ``accelerate launch`` running ``python -m seal_lite ARGUMENTS`` in ``processes``
    processes of this machine (docs/distributed.md); never returns."""
    import sys

    from seal_lite.engines import distributed

    command = distributed.launch_command(processes, ["-m", "seal_lite", *arguments])
    sys.stdout.flush()
    os.execv(command[0], command)


def run(recipe: Recipe, out_dir: str | Path | None = None, *, overwrite: bool = False, progress: Progress | None = None,
        on_start: Callable[[Path, str | None], None] = lambda out_dir, resumed: None, verbose: bool = False):
    """Train ``recipe`` with SEAL and return its ``RunSummary``; everything goes to ``out_dir/seal.db``, and the
    libraries' warnings, log lines and progress bars to ``out_dir/run.log`` (with ``verbose`` to stderr too).

    ``out_dir`` defaults to runs/<name>, or runs/<name>-2, ... when a finished run is there. An unfinished run
    there resumes; a finished one is refused unless ``overwrite``. ``on_start(out_dir, resumed_status)`` is called
    on the main process once the directory is chosen, before any model loads. Under a launcher every process
    calls this (docs/distributed.md)."""
    from seal_lite.engines import distributed
    from seal_lite.runs import train
    from seal_lite.runs.run_dir import choose_run_dir

    distributed.init()  # rank 0 chooses and prepares the directory, for every process
    out_dir, status = distributed.on_main(lambda: choose_run_dir(recipe, Path(out_dir) if out_dir else None, overwrite))
    if distributed.is_main():
        on_start(out_dir, status)
    return train.run(recipe, out_dir, progress or NoProgress(), verbose=verbose)


def screen(recipe: Recipe, out_dir: str | Path | None = None, *, samples: int | None = None,
           progress: Progress | None = None, frontier_file: str | Path | None = None,
           command: str = "seal_lite.screen() in Python") -> dict[str, float]:
    """Each task of the recipe's slice played ``samples`` times (default: data.screen, else 4) by the base policy,
    as training would: {task id: pass rate}. Tasks that any accepted call passes are left out, unplayed. Stored in
    out_dir/seal.db (default the recipe's run directory), where a run with ``data.screen`` reuses it; an interrupted
    screen goes on where it stopped. ``frontier_file``: also write the tasks solved sometimes, not always, there for
    a recipe's ``data.task_file``, with ``command`` (what produced it) in its header."""
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy
    from seal_lite.engines.store import Store
    from seal_lite.runs.tasks import (
        screen_slice,
        select_task_ids,
        slice_tasks,
        without_uninformative,
        write_frontier_file,
    )

    samples = samples or recipe.data.screen or SCREEN_SAMPLES
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"screen": samples})})
    out_dir = Path(out_dir) if out_dir else recipe.out_dir()
    progress = progress or NoProgress()
    tasks = without_uninformative(slice_tasks(recipe, select_task_ids(recipe)), progress)
    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    pass_rates = screen_slice(recipe, Store(out_dir / "seal.db"), tasks, policy, out_dir, progress)
    if frontier_file:
        write_frontier_file(Path(frontier_file), pass_rates, samples, recipe, command)
    return pass_rates


def evaluate(target: str | Path, *, benchmark: str = "bfcl", tasks: int | None = None, base: bool = False,
             steps: tuple[int, ...] = (), best: bool = False, overrides: dict | None = None, progress=None,
             note: Callable[[str], None] = lambda text: None, **options) -> dict:
    """Evaluate a run directory's trained policy (``steps``: its checkpoints, default the final adapter; ``best``:
    its best validation checkpoint; ``base``: its base model too) or a model on held-out BFCL tasks (``split``,
    ``view``) or on τ²-bench (``benchmark="tau2"``: ``domains``, ``user_model``, ``max_steps``, ``into``). ``tasks``: the first N of each category or domain.
    Returns {"summary": {model label: {category: scores}}, "tasks": {model label: [per-task results]}}; a run
    directory also stores them in its seal.db. ``progress(label, total)`` is a context manager that is called with
    each task's result (console.EvalProgress); ``note`` receives what is about to happen."""
    if benchmark == "tau2":
        from seal_lite.runs.evaluate_tau2 import evaluate_target
    else:
        from seal_lite.runs.evaluate_bfcl import evaluate_target
    return evaluate_target(str(target), tasks=tasks, base=base, steps=steps, best=best, overrides=overrides or {},
                           progress=progress, note=note, **options)


def verify(lines: Iterable[str], workers: int = 1) -> Iterator[dict]:
    """Score JSONL lines of decoded BFCL multi-turn calls, in order: {"id", "valid", "labels", "causes", "error",
    "irrelevance_valid"} per line (blank lines skipped); a line that cannot be scored has an error, not an
    exception. ``workers`` processes give the same results."""
    from seal_lite.runs.verify import verify_lines

    return verify_lines(lines, workers=workers)


def verify_summary(records: list[dict]) -> str:
    """The lines `seal-lite verify` ends with: counts, the official verdict's rate, the turn labels."""
    counts = Counter("error" if r["error"] else "valid" if r["valid"] else "invalid" for r in records)
    scored = counts["valid"] + counts["invalid"]
    lines = [f"{scored + counts['error']} lines: {counts['valid']} valid, {counts['invalid']} not valid, "
             f"{counts['error']} unreadable"]
    if scored:
        irrelevance = sum(bool(r["irrelevance_valid"]) for r in records if r["irrelevance_valid"] is not None)
        labels = Counter(label for r in records for label in r["labels"])
        lines += [f"official verdict {counts['valid'] / scored:.1%}; irrelevance check passed "
                  f"{irrelevance / scored:.1%} (reported apart, never part of the verdict)",
                  "turn labels: " + ", ".join(f"{label} {n}" for label, n in labels.most_common())]
    return "\n".join(lines)


@dataclass
class Prompt:
    text: str  # exactly what the policy reads
    tokens: int
    shown: str  # which view: the evaluation view, or a run's training interface version
    model: str  # whose chat template and tokenizer rendered it
    turns: int  # the task's user turns


def prompt(task_id: str, *, model: str | None = None, run_dir: str | Path | None = None, version: int | None = None,
           turn: int = 0, parser: str = "strict", environment: str | None = None) -> Prompt:
    """What the policy reads for a task at user turn ``turn`` (0: the whole opening), under BFCL's official
    surface in the call format of ``parser`` (``rollout.parser``: strict, toolace or llama3.1), or with ``run_dir``
    under that run's training interface ``version`` (default: the latest), in the run's own format. The task is
    ``environment``'s (``data.environment``; default: the run's, else BFCL's)."""
    import json

    from transformers import AutoTokenizer

    from seal_lite.core.calls import call_format
    from seal_lite.core.interface import evaluation_interface, interface_for_task, interface_from_version
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.step.rollout import turn_text

    if environment is None and run_dir is not None:
        environment = json.loads(_store(run_dir).run()["recipe"]).get("data", {}).get("environment")
    task = _task(task_id, environment or "bfcl")
    if turn >= len(task.turns):
        raise ConfigError(f"--turn {turn}: {task_id} has turns 0 to {len(task.turns) - 1}")
    interface = evaluation_interface(call_format=call_format(parser))
    shown = "the evaluation view (BFCL's official surface" + ("" if parser == "strict" else f", {parser} format") + ")"
    if run_dir is not None:
        row = interface_version(run_dir, version)
        interface = interface_for_task(interface_from_version(row), task)
        shown = f"training interface v{row['version']} of {run_dir}"
        model = model or json.loads(_store(run_dir).run()["recipe"])["policy"]["model"]
    model = model or "smollm2-135m"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model), clean_up_tokenization_spaces=False)
    text = turn_text(tokenizer, task, turn, interface)
    return Prompt(text, len(tokenizer(text, add_special_tokens=False)["input_ids"]), shown, model, len(task.turns))


def describe_environment(spec: str) -> str:
    """One line on the environment ``spec`` names: its tools and its tasks per split."""
    from seal_lite.envs.registry import find_environment

    found = find_environment(spec)
    train, held_out = len(found.split_ids("train")), len(found.split_ids("eval"))
    tools = getattr(found, "functions", None)
    shown = f"{len(tools)} tools ({', '.join(doc['name'] for doc in tools)}), " if tools else ""
    return (f"environment {found.name}: {shown}{train} training tasks, {held_out} held-out, categories "
            f"{', '.join(found.categories)}")


def _task(task_id: str, environment: str):
    from seal_lite.envs.registry import find_environment

    found = find_environment(environment)
    try:
        (task,) = found.load_tasks([task_id])
    except KeyError as error:
        raise ConfigError(f"{error.args[0]}; use an id such as {found.split_ids('train')[0]}") from None
    return task


def report(run_dir: str | Path, out_dir: str | Path | None = None, *, trajectories: int = 4) -> Path:
    """Write the run's report.html (plots, interface timeline, evaluations, ``trajectories`` sample trajectories
    turn by turn) into ``out_dir`` (default RUN/report), and its model card beside its adapter
    (RUN/adapter/README.md, once the run has one); return the page's path."""
    from seal_lite.html_report import write_report
    from seal_lite.runs.model_card import write_model_card

    run = _db_path(run_dir).parent
    try:
        page = write_report(run, Path(out_dir) if out_dir else None, trajectories)
    except LookupError as error:
        raise RunError(str(error)) from None
    write_model_card(run)
    return page


def export(run_dir: str | Path, to: str, output: str | Path | None = None, *, step: int | None = None,
           best: bool = False, gguf_type: str | None = None, base_gguf: str | Path | None = None,
           overwrite: bool = False):
    """Write the run's trained LoRA (its newest, ``step``'s checkpoint, or with ``best`` its best validation
    checkpoint) for other tools, ``to`` one of
    "merged" (a Hugging Face model directory), "gguf" (one GGUF, its LoRA'd matrices as ``gguf_type``: f16, f32,
    bf16 or q8_0) or "lora-gguf" (a llama.cpp adapter); ``output`` defaults to RUN/export/. ``base_gguf``: the base
    model's GGUF, for a run whose policy.model is none. Returns an ``Export`` (path, ``serve_command()``)."""
    from seal_lite.runs.export import export_run

    return export_run(Path(run_dir), to, Path(output) if output else None, step=step, best=best, gguf_type=gguf_type,
                      base_gguf=Path(base_gguf) if base_gguf else None, overwrite=overwrite)


def diagnose(run_dir: str | Path, *, step: int | None = None, failed: bool = False) -> list[dict]:
    """The run's trajectories (of ``step``; with ``failed``, only reward 0): id, step, task_id, reward, weight,
    num_model_calls, stop_reason and the turn ``labels``."""
    store = _store(run_dir)
    labels = store.turn_labels()
    return [{key: row[key] for key in TRAJECTORY_KEYS} | {"labels": labels.get(row["id"], [])}
            for row in store.trajectories(step) if not failed or row["reward"] == 0]


def trajectory(run_dir: str | Path, trajectory_id: str) -> tuple[dict, list[dict]]:
    """One trajectory of the run and its turns: request, calls, results, label, cause and evidence."""
    store = _store(run_dir)
    try:
        return store.trajectory(trajectory_id), store.turns(trajectory_id)
    except LookupError as error:
        raise RunError(f"{error}; list ids with: seal-lite diagnose {run_dir}") from None


def interface_versions(run_dir: str | Path) -> dict[int, dict]:
    """The run's training interface versions, {version: stored row}, oldest first."""
    return {row["version"]: row for row in _store(run_dir).interface_versions()}


def interface_version(run_dir: str | Path, number: int | None = None) -> dict:
    """One stored interface version of the run (default: the latest)."""
    versions = interface_versions(run_dir)
    if not versions:
        raise RunError(f"{run_dir} holds no interface version yet")
    if number is None:
        return versions[max(versions)]
    if number not in versions:
        raise RunError(f"{run_dir} has interface versions {sorted(versions)}, not {number}")
    return versions[number]


def _db_path(run_dir: str | Path) -> Path:
    """The seal.db of a run directory (RUN may also name that file)."""
    path = Path(run_dir)
    return path if path.suffix == ".db" else path / "seal.db"


def _store(run_dir: str | Path):
    """The run's store, opened only to read: these functions never write to a run (its disk may be full)."""
    from seal_lite.engines.store import Store

    return Store.open_readonly(_db_path(run_dir))


def doctor(model: str | None = None, *, self_test: bool = True, backend: str = "peft", dtype: str = "auto") -> dict:
    """What this machine can run: hardware, backends, models and (``self_test``) the masking self-test; "ok" says
    whether a required backend is missing or the self-test failed."""
    from seal_lite.runs.doctor import report as doctor_report

    return doctor_report(model, self_test=self_test, backend=backend, dtype=dtype)
