"""``seal-lite``: thin click commands over the library. Heavy imports happen inside commands, so --help is fast."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import click

from seal_lite.core.recipe import RecipeError, describe_fields, load_recipe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="seal-lite")
def main():
    """seal-lite: train a tool-using agent with SEAL (diagnosis-weighted GRPO on BFCL multi-turn tasks).

    \b
    Start here:
      seal-lite run                          the CPU quickstart (embedded default recipe)
      seal-lite run recipes/quickstart.yaml  the same, from a file you can edit
      seal-lite recipe --fields              every recipe field with its default and meaning
      seal-lite diagnose runs/quickstart     what went wrong, turn by turn
      seal-lite verify --input calls.jsonl   score any system's BFCL multi-turn calls
      seal-lite interface show runs/quickstart  the training interface, version by version
      seal-lite prompt multi_turn_base_0     exactly what the policy reads, and its token count
      seal-lite doctor                       hardware, backends, models and a masking self-test
      seal-lite eval runs/quickstart --base  held-out tasks, trained policy next to its base model
      seal-lite report runs/quickstart       an HTML page with plots of the run
    """


def _parse_overrides(pairs: tuple[str, ...]) -> dict:
    import yaml

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: write KEY=VALUE, e.g. grpo.steps=1", param_hint="--set")
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _load(recipe_path, overrides, check: bool = False, out: str | None = None, processes: int = 1):
    """The recipe, or exit 2 with one line per problem. ``check``: also against this machine (models installed,
    paths and task ids existing, backends usable); ``out``: the --out directory, checked with it; ``processes``:
    how many processes will run it."""
    from seal_lite.run.preflight import load_checked_recipe, out_dir_problem

    problems = []
    try:
        config = (load_checked_recipe if check else load_recipe)(recipe_path, _parse_overrides(overrides))
    except RecipeError as error:
        config, problems = None, str(error).splitlines()
    if config is not None:
        problems += [f"{recipe_path or 'default recipe'}: {problem}" for problem in config.process_problems(processes)]
    if check:
        out_dir = Path(out) if out else config.out_dir() if config else None
        problem = out_dir_problem(out_dir) if out_dir is not None else None
        if problem and out:
            problems.append(f"--out {str(out_dir)!r}: {problem}")
        elif problem:
            field = "output_dir" if config.output_dir else "name"
            problems.append(f"{recipe_path or 'default recipe'}: {field} = {getattr(config, field)!r}: {problem}")
    if problems:
        click.echo("Invalid recipe (nothing was written):\n" + "\n".join(problems), err=True)
        sys.exit(2)
    return config


def _free_out_dir(base: Path) -> Path:
    """runs/NAME, or runs/NAME-2, -3, ...: the first that holds no finished run (an unfinished one resumes)."""
    from seal_lite.run.train import run_status

    candidate, n = base, 1
    while run_status(candidate) == "finished":
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


@main.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(file_okay=False), help="Run directory (default runs/<name>, "
              "or runs/<name>-2, ... if a finished run is there). An unfinished run there resumes.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. --set grpo.steps=1 (repeatable).")
@click.option("--overwrite", is_flag=True, help="Start afresh, deleting the run that already exists in --out.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run on N processes of this machine (one per GPU; on a CPU, N CPU processes): calls `accelerate "
              "launch --num_processes N -m seal_lite run ...` with the other arguments (docs/distributed.md).")
def run(recipe, out, overrides, overwrite, processes):
    """Run the SEAL loop: roll out on BFCL, verify, diagnose, weight, and update a LoRA policy.

    RECIPE is a YAML file; without it the embedded CPU quickstart runs. Everything the run does is written
    to RUN_DIR/seal.db (SQLite; tables documented in docs/store.md), with a checkpoint per step in
    RUN_DIR/checkpoints. Run the same command again after a crash, Ctrl-C or a full disk: an unfinished run in
    RUN_DIR resumes from its last completed step. What the recipe names (models, task ids, backends) is checked
    first: a problem exits with status 2, one line each, before anything is written. Under `accelerate launch`
    (or with --processes) every step's tasks are shared out among the processes.

    \b
    Examples:
      seal-lite run
      seal-lite run recipes/quickstart.yaml --set grpo.steps=1 --out runs/try
      seal-lite run recipes/quickstart.yaml --processes 2
    """
    from seal_lite.engines import distributed

    launched = distributed.world_size()
    if processes > 1 and launched > 1 and processes != launched:
        raise click.BadParameter(f"the launcher started {launched} processes; leave --processes out under "
                                 "accelerate launch", param_hint="--processes")
    config = _load(recipe, overrides, check=True, out=out, processes=max(processes, launched))
    if processes > 1 and launched == 1:  # accelerate starts the processes, each runs this command without it
        arguments = ["-m", "seal_lite", "run", *([recipe] if recipe else []), *(["--out", out] if out else []),
                     *[item for pair in overrides for item in ("--set", pair)], *(["--overwrite"] if overwrite else [])]
        command = distributed.launch_command(processes, arguments)
        sys.stdout.flush()
        os.execv(command[0], command)
    distributed.init()
    main_process = distributed.is_main()
    from seal_lite.run.train import DiskFullError, RunMismatchError, ScreenError, run_status

    def choose_out_dir() -> Path:  # rank 0 decides, and prepares it, for every process
        out_dir = Path(out) if out else config.out_dir() if overwrite else _free_out_dir(config.out_dir())
        status = run_status(out_dir)
        if status is not None and overwrite:
            for suffix in ("", "-wal", "-shm"):
                (out_dir / f"seal.db{suffix}").unlink(missing_ok=True)
            shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
        elif status == "finished":
            raise click.ClickException(f"{out_dir} holds a finished run; choose another --out or pass --overwrite")
        elif status is not None:
            click.echo(f"{out_dir} holds an unfinished run ({status}): resuming it.")
        return out_dir

    out_dir = distributed.on_main(choose_out_dir)

    from seal_lite.console import RichProgress, print_recipe, print_summary
    from seal_lite.core.types import NoProgress
    from seal_lite.engines.model_sources import ModelSourceError
    from seal_lite.engines.policy import PolicyBackendError
    from seal_lite.run.train import run as run_loop

    if main_process:
        print_recipe(config, out_dir)
    try:
        with RichProgress(config.grpo.steps) if main_process else contextlib.nullcontext(NoProgress()) as progress:
            summary = run_loop(config, out_dir, progress)
    except (RunMismatchError, ModelSourceError, PolicyBackendError, ScreenError, DiskFullError) as error:
        raise click.ClickException(str(error)) from None
    if main_process:
        print_summary(summary)


@main.command()
@click.argument("recipe", required=False)
@click.option("--out", type=click.Path(file_okay=False), help="Run directory (default: runs/<name>).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe field (repeatable).")
@click.option("--samples", type=click.IntRange(min=2), help="Samples per task (default: data.screen, else 4).")
def screen(recipe, out, overrides, samples):
    """Screen a recipe's task slice: which tasks the base policy solves sometimes, but not always.

    Plays SAMPLES trajectories of every task of the slice, as training would, and prints each task's passes; the
    tasks strictly between 0 and all are the frontier, the only ones that give GRPO a learning signal. The results
    go to RUN_DIR/seal.db (table screen), where `seal-lite run` with `data.screen` set reuses them; an interrupted
    screen goes on where it stopped.

    \b
    Examples:
      seal-lite screen recipes/cpu-learn.yaml
      seal-lite screen recipes/cpu-qwen0.5b.yaml --samples 4 --set data.num_tasks=20
    """
    config = _load(recipe, overrides + ((f"data.screen={samples}",) if samples else ()), check=True, out=out)
    if config.data.screen is None:
        config = _load(recipe, overrides + ("data.screen=4",))
    from seal_lite.console import RichProgress, print_screen
    from seal_lite.engines.model_sources import ModelSourceError, resolve_model
    from seal_lite.engines.policy import PolicyBackendError, load_policy
    from seal_lite.engines.store import Store
    from seal_lite.run.train import screen_slice, select_task_ids, slice_tasks

    out_dir = Path(out) if out else config.out_dir()
    tasks = slice_tasks(config, select_task_ids(config))
    try:
        policy = load_policy(resolve_model(config.policy.model), config)
    except (ModelSourceError, PolicyBackendError) as error:
        raise click.ClickException(str(error)) from None
    with RichProgress(0) as progress:
        pass_rates = screen_slice(config, Store(out_dir / "seal.db"), tasks, policy, out_dir, progress)
    print_screen(pass_rates, config.data.screen)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("--model", metavar="SPEC", help="Model for the masking self-test (default: the quickstart's policy).")
@click.option("--no-self-test", is_flag=True, help="Skip the masking self-test (about 20 s on 2 CPU cores).")
@click.option("--backend", type=click.Choice(["peft", "peft-4bit"]), default="peft", show_default=True,
              help="Policy backend of the self-test: peft-4bit runs it on bitsandbytes NF4 layers (GPU, or CPU: "
              "several minutes there).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Compute dtype of the self-test (auto: what a run would train in here; bf16 runs on any CPU, "
              "emulated and slower where it lacks AVX512_BF16).")
def doctor(as_json, model, no_self_test, backend, dtype):
    """What this machine can run: hardware, backends, models, and a masking self-test.

    The self-test rolls out a real BFCL task with the policy model inside the real trainer and checks that the
    loss and its gradient come only from tokens the model generated, never from tool results or user turns.
    Exits with status 1 when a required backend is missing or the self-test fails.

    \b
    Examples:
      seal-lite doctor
      seal-lite doctor --json --no-self-test
      seal-lite doctor --backend peft-4bit --dtype float32
    """
    import json

    from seal_lite.run.doctor import render_text, report

    result = report(model, self_test=not no_self_test, backend=backend, dtype=dtype)
    click.echo(json.dumps(result, indent=2) if as_json else render_text(result))
    if not result["ok"]:
        sys.exit(1)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Where to write it (default RUN/report).")
@click.option("--samples", default=4, show_default=True, help="Sample trajectories shown turn by turn.")
def report(run_dir, out_dir, samples):
    """Write RUN/report/report.html: a self-contained page with plots of the run.

    Reward and turn pass rate, labels, rho and weights over steps (also as PNGs beside the page), the interface
    version timeline with its diffs, the evaluation table (from `seal-lite eval RUN`), and sample trajectories
    turn by turn with their labels and the diagnoser's explanations.

    \b
    Example:
      seal-lite report runs/quickstart
    """
    from seal_lite.report import write_report

    try:
        page = write_report(Path(run_dir), Path(out_dir) if out_dir else None, samples)
    except LookupError as error:
        raise click.ClickException(str(error)) from None
    click.echo(str(page))


def _run_to_evaluate(run_dir: Path, overrides: tuple[str, ...], base: bool, steps: tuple[int, ...]):
    """(store, recipe, [(label, adapter)]) of a run directory for `seal-lite eval`: the run's own recipe with --set
    on top, the base model with --base (adapter None), and the trained adapters (--step; default: the newest)."""
    import json

    from seal_lite.engines.store import Store

    store = Store(run_dir / "seal.db")
    try:
        config = load_recipe(None, {**json.loads(store.run()["recipe"]), **_parse_overrides(overrides)})
    except RecipeError as error:
        raise click.ClickException(f"invalid recipe:\n{error}") from None
    variants = [("base", None)] if base else []
    variants += [(f"step {step}", path) for step, path in _trained_adapters(store, run_dir, steps)]
    return store, config, variants


def _model_recipe(target: str, overrides: tuple[str, ...], or_else: str):
    """The default recipe with TARGET as its policy, TARGET checked as a model before anything loads (as `run`
    checks its recipe); ``or_else`` names what else TARGET could have been, for the error."""
    from seal_lite.run.preflight import model_problem

    if problem := model_problem(target):
        raise click.BadParameter(f"{target!r} is neither {or_else} nor a usable model: {problem}", param_hint="TARGET")
    return _load(None, overrides + (f"policy.model={target}",))


def _trained_adapters(store, run_dir: Path, steps: tuple[int, ...]) -> list[tuple[int, Path]]:
    """(step, adapter directory) for the requested steps' checkpoints, or the run's newest adapter."""
    checkpoints = {row["step"]: run_dir / row["path"] for row in store.db["checkpoints"].rows}
    if not checkpoints:
        raise click.ClickException(f"{run_dir} has no trained adapter yet; evaluate after its first step")
    if not steps:
        last = max(checkpoints)
        return [(last, run_dir / "adapter" if (run_dir / "adapter").is_dir() else checkpoints[last])]
    kept = {step: path for step, path in checkpoints.items() if path.is_dir()}
    for step in steps:
        if step not in kept:
            raise click.ClickException(f"{run_dir} keeps checkpoints of steps {sorted(kept)}, not {step} "
                                       "(grpo.keep_checkpoints sets how many are kept)")
    return [(step, kept[step]) for step in steps]


def _eval_task_ids(split: str, per_category: int | None) -> list[str]:
    from seal_lite.envs.bfcl import CATEGORIES, category_of, split_ids

    if split in ("eval", "train"):
        ids = split_ids(split)
    else:
        ids = [task_id.strip() for task_id in split.split(",") if task_id.strip()]
        for task_id in ids:
            try:
                category_of(task_id)
            except ValueError as error:
                raise click.BadParameter(f"{error}; pass eval, train or BFCL ids such as multi_turn_base_1",
                                         param_hint="--split") from None
    if per_category:  # a fixed subset: the first N of each category, in the split's order
        ids = [task_id for category in CATEGORIES
               for task_id in [i for i in ids if category_of(i) == category][:per_category]]
    return ids


@main.command(name="eval")
@click.argument("target")
@click.option("--split", default="eval", show_default=True,
              help="eval (the 400 held-out tasks), train, or comma-separated BFCL ids.")
@click.option("--tasks", "per_category", type=click.IntRange(min=1), help="Only the first N tasks of each category.")
@click.option("--base", is_flag=True, help="With a RUN: also evaluate the base model, side by side.")
@click.option("--step", "steps", type=int, multiple=True,
              help="With a RUN: evaluate the checkpoint of this step (repeatable; default: the final adapter).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. --set rollout.max_turns=2 (repeatable).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Also write the results to FILE (JSON).")
@click.option("--view", type=click.Choice(["official", "signatures"]), default="official", show_default=True,
              help="official: BFCL's own task (every tool doc in full). signatures: one line per tool; its results "
                   "are not BFCL scores and are marked so wherever they are printed or stored.")
@click.option("--benchmark", type=click.Choice(["bfcl", "tau2"]), default="bfcl", show_default=True,
              help="bfcl: held-out BFCL multi-turn tasks. tau2: τ²-bench (out of distribution), the policy as the "
                   "agent and a local user simulator; needs the ood extra (docs/tau2.md).")
@click.option("--domain", "domains", type=click.Choice(["retail", "airline", "telecom"]), multiple=True,
              help="With --benchmark tau2: a τ² domain (repeatable; default: all three).")
@click.option("--user-model", metavar="SPEC", help="With --benchmark tau2: the user simulator, a registry name, "
              ".gguf or server URL (default: the policy's base model). 7B or larger plays it faithfully.")
@click.option("--max-steps", type=click.IntRange(min=1), help="With --benchmark tau2: end a conversation after "
              "this many messages (default: τ²'s 200); a conversation cut short scores 0.")
@click.option("--run", "into", type=click.Path(exists=True, file_okay=False), metavar="RUN",
              help="With --benchmark tau2 and a model or URL as TARGET: also store the results in this run's seal.db, "
                   "e.g. its adapter served by vLLM, so `seal-lite report RUN` shows them.")
@click.pass_context
def evaluate_command(ctx, target, split, per_category, base, steps, overrides, json_file, view, benchmark, domains,
                     user_model, max_steps, into):
    """Evaluate a run's trained policy or a model on held-out BFCL tasks, or on τ²-bench.

    TARGET is a run directory (its recipe and trained LoRA; results are stored in its seal.db) or a model
    (a registry name, .gguf, directory or hub id). Decoding is greedy and the view is the official BFCL surface
    (never the training interface, whatever tool format the run trained with), calls are parsed strictly and a
    turn is never capped; the score is the official multi-turn verdict, per category and as the mean over
    categories, beside the turn pass rate (share of ground-truth turns passed). Episode budgets (turns, messages,
    tokens) come from the recipe's rollout section.

    With --benchmark tau2 the policy plays τ²-bench's agent (retail, airline, telecom) against a local user
    simulator, and the score is τ²'s pass^1 per domain and their mean. TARGET may then also be the URL of an
    OpenAI-compatible server (vLLM on a GPU; --run RUN stores its results in a run). A GGUF policy and its LoRA
    are served by llama.cpp on a CPU, as in training; on a GPU the policy is held in this process (transformers).
    Each task takes minutes on a CPU (docs/tau2.md).

    \b
    Examples:
      seal-lite eval runs/quickstart --base --tasks 5
      seal-lite eval runs/quickstart --step 1 --step 2 --split train --tasks 2
      seal-lite eval smollm2-135m --split multi_turn_base_1,multi_turn_miss_func_3 --json base.json
      seal-lite eval runs/paper --base --benchmark tau2 --domain retail --tasks 10 --user-model qwen7b.gguf
    """
    import json

    if benchmark == "tau2":
        for name in ("split", "view"):
            if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
                raise click.BadParameter("BFCL only; τ² plays its own tasks (choose them with --domain and --tasks)",
                                         param_hint=f"--{name}")
        _evaluate_tau2(target, domains or ("retail", "airline", "telecom"), per_category, user_model, base, steps,
                       overrides, json_file, max_steps, into)
        return
    for name, flag in (("domains", "--domain"), ("user_model", "--user-model"), ("max_steps", "--max-steps"),
                       ("into", "--run")):
        if ctx.params[name]:
            raise click.BadParameter("needs --benchmark tau2", param_hint=flag)
    import tempfile

    from seal_lite.console import EvalProgress, print_evaluation
    from seal_lite.core.interface import NOT_BFCL_VIEW
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.run.evaluate_bfcl import evaluate, evaluation_engine, result_rows, summarize, view_label

    run_dir = Path(target) if (Path(target) / "seal.db").exists() else None
    if run_dir is not None:
        store, config, models = _run_to_evaluate(run_dir, overrides, base, steps)
    else:
        store, config, models = None, _model_recipe(target, overrides, "a run directory"), [("base", None)]
    tasks = [task.truncated(config.rollout.max_turns) for task in load_tasks(_eval_task_ids(split, per_category))]
    if view != "official":
        click.echo(f"note: the {view} view is {NOT_BFCL_VIEW}; these results are not BFCL multi-turn scores",
                   err=True)
    summaries, everything = {}, {}
    for label, adapter in models:
        label = view_label(label, view)
        click.echo(f"evaluating {label} on {len(tasks)} tasks ...", err=True)
        with (tempfile.TemporaryDirectory() as work, evaluation_engine(config, adapter, Path(work)) as generator,
              EvalProgress(label, len(tasks)) as progress):
            rollout = config.rollout.model_copy(update={"generation_batch_size": config.generation_batch()})
            results = evaluate(tasks, generator, rollout, view, on_result=progress)
        summaries[label] = summarize(results)
        everything[label] = [vars(result) for result in results]
        if store is not None:
            store.save_evaluations(result_rows(label, split, results))
    print_evaluation(summaries)
    if json_file:
        Path(json_file).write_text(json.dumps({"summary": summaries, "tasks": everything}, indent=2))


def _evaluate_tau2(target, domains, per_domain, user_model, base, steps, overrides, json_file, max_steps, into):
    """``seal-lite eval --benchmark tau2``: the policy (and with --base its base model) as τ²'s agent."""
    import contextlib
    import json
    import tempfile

    from seal_lite.console import Tau2Progress, print_tau2
    from seal_lite.engines.llamacpp import BackendError
    from seal_lite.engines.model_sources import ModelSourceError
    from seal_lite.engines.rollout_engine import rollout_backend
    from seal_lite.engines.store import Store
    from seal_lite.run.evaluate_tau2 import (
        Tau2NotInstalled,
        chat_model,
        evaluate_tau2,
        export_adapter,
        in_process_roles,
        is_url,
        require_tau2,
        result_rows,
        serving,
        summarize,
    )

    try:
        require_tau2()
    except Tau2NotInstalled as error:
        raise click.ClickException(str(error)) from None
    run_dir = Path(target) if (Path(target) / "seal.db").exists() else None
    store, config = None, None
    if run_dir is not None:
        if into:
            raise click.BadParameter("a run directory stores its own results; --run is for a model or URL TARGET",
                                     param_hint="--run")
        store, config, variants = _run_to_evaluate(run_dir, overrides, base, steps)
    else:
        if base or steps:
            raise click.BadParameter("--base and --step need a run directory", param_hint="TARGET")
        if into:
            if not (Path(into) / "seal.db").exists():
                raise click.BadParameter(f"{into} holds no seal.db: give a run directory", param_hint="--run")
            store = Store(Path(into) / "seal.db")
        if not is_url(target):
            config = _model_recipe(target, overrides, "a run directory, a server URL")
        variants = [(target, None)]
    policy_spec = config.policy.model if config is not None else target
    # Where the agent runs: a server already up (URL); llama.cpp servers for a GGUF on a CPU, as the run's rollouts;
    # else the run's own engine in this process (transformers, on a GPU).
    engine = "url" if config is None else rollout_backend(config)
    in_process_user = engine == "transformers" and user_model is None
    if engine != "transformers":
        try:
            policy = chat_model(policy_spec)
        except ModelSourceError as error:
            raise click.BadParameter(f"{error}; τ² serves a GGUF with llama.cpp, reaches a server at its URL "
                                     "(http://HOST:PORT#MODEL), or holds any other model in this process with "
                                     "--set rollout.backend=transformers", param_hint="TARGET") from None
    user_label = user_model or policy_spec
    try:
        user = None if in_process_user else chat_model(user_model or policy_spec)
    except ModelSourceError as error:
        raise click.BadParameter(f"{error}; or give a server URL (http://...)", param_hint="--user-model") from None
    from seal_lite.envs.tau2_bench import load_tasks

    @contextlib.contextmanager
    def roles(adapter, work: Path):
        """(agent, user) for one variant; the user is None when it is served for all of them."""
        if engine == "transformers":
            with in_process_roles(config, adapter, work) as (agent, base_model):
                yield agent, base_model if in_process_user else None
            return
        lora = export_adapter(policy_spec, adapter, work / "policy-lora.gguf", config) if adapter else None
        with serving(policy if engine == "url" else chat_model(policy_spec, lora)) as agent:
            yield agent, None

    total = sum(len(load_tasks(domain, per_domain)) for domain in domains)
    summaries, everything = {}, {}
    try:
        with serving(user) if user else contextlib.nullcontext() as shared_user:
            for label, adapter in variants:
                click.echo(f"τ²: {label} as the agent, {user_label} as the user, {total} tasks ...", err=True)
                with (tempfile.TemporaryDirectory() as work, roles(adapter, Path(work)) as (agent, own_user),
                      Tau2Progress(label, total) as progress):
                    results = evaluate_tau2(agent, own_user or shared_user, list(domains), per_domain, max_steps,
                                            on_result=progress)
                summaries[label] = summarize(results)
                everything[label] = [vars(result) for result in results]
                if store is not None:
                    store.save_evaluations(result_rows(label, user_label, results))
    except BackendError as error:
        raise click.ClickException(f"a model stopped answering: {error}") from None
    print_tau2(summaries, user_label)
    if json_file:
        Path(json_file).write_text(json.dumps({"benchmark": "tau2", "user_model": user_label, "summary": summaries,
                                               "tasks": everything}, indent=2))


@main.command()
@click.argument("task_id")
@click.option("--model", metavar="SPEC", help="Whose chat template and tokenizer render it (default: the run's "
              "policy, or the quickstart's smollm2-135m).")
@click.option("--run", "run_dir", type=click.Path(exists=True, file_okay=False),
              help="Show the run's training interface instead of the evaluation view.")
@click.option("--version", "number", type=int, help="With --run: the interface version (default: the latest).")
@click.option("--turn", type=click.IntRange(min=0), default=0, show_default=True,
              help="0: the whole opening (system message and first request); K: what user turn K adds.")
def prompt(task_id, model, run_dir, number, turn):
    """Print exactly what the policy reads for a BFCL task, and how many tokens it is.

    Without --run it is the evaluation view: BFCL's official surface, every tool doc with its descriptions and
    enums. With --run it is that run's training interface, version by version, as the policy saw it in training
    (schema cues, guidelines, its tool format).

    \b
    Examples:
      seal-lite prompt multi_turn_base_0
      seal-lite prompt multi_turn_miss_func_3 --turn 2 --model qwen2.5-coder-0.5b
      seal-lite prompt multi_turn_base_0 --run runs/quickstart --version 2
    """
    import json

    from transformers import AutoTokenizer

    from seal_lite.core.interface import evaluation_interface, interface_from_version
    from seal_lite.engines.model_sources import ModelSourceError, resolve_model
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.algorithm import interface_for_task
    from seal_lite.step.rollout import turn_text

    try:
        (task,) = load_tasks([task_id])
    except KeyError as error:
        raise click.BadParameter(f"{error.args[0]}; use an id such as multi_turn_base_0", param_hint="TASK_ID") from None
    if turn >= len(task.turns):
        raise click.BadParameter(f"{task_id} has turns 0 to {len(task.turns) - 1}", param_hint="--turn")
    interface, shown = evaluation_interface(), "the evaluation view (BFCL's official surface)"
    if run_dir:
        store = _open_run(run_dir)
        versions = _versions(run_dir)
        row = _version(versions, number if number is not None else max(versions), run_dir)
        interface = interface_for_task(interface_from_version(row), task)
        shown = f"training interface v{row['version']} of {run_dir}"
        model = model or json.loads(store.run()["recipe"])["policy"]["model"]
    elif number is not None:
        raise click.BadParameter("--version needs --run", param_hint="--version")
    model = model or "smollm2-135m"
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model), clean_up_tokenization_spaces=False)
    except ModelSourceError as error:
        raise click.ClickException(str(error)) from None
    text = turn_text(tokenizer, task, turn, interface)
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    click.echo(text)
    click.echo(f"--- {task_id}, turn {turn} of {len(task.turns)}, {shown}, {model}: {tokens} tokens", err=True)


@main.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False))
@click.option("--fields", is_flag=True, help="List every field with its default and description.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a field (repeatable).")
def recipe(recipe, fields, overrides):
    """Validate a recipe and print it fully resolved (defaults < file < --set).

    Like `seal-lite run`, it also checks what the recipe names against this machine: registry models installed
    (else the pip command), paths and BFCL task ids existing, backends usable here. Exits with status 2 and one
    line per problem otherwise.

    \b
    Examples:
      seal-lite recipe recipes/quickstart.yaml
      seal-lite recipe --fields
    """
    if fields:
        for name, default, description in describe_fields():
            click.echo(f"{name} = {default}\n    {description}")
        return
    import yaml

    config = _load(recipe, overrides, check=True)
    click.echo(yaml.safe_dump(config.model_dump(), sort_keys=False).rstrip())


@main.command()
@click.option("--input", "input_file", required=True, type=click.File("r", errors="replace"),
              help="JSONL, one episode per line: {\"id\": \"multi_turn_base_0\", \"turns\": [[\"cd(folder='x')\"], ...]}. "
                   "'-' reads stdin.")
@click.option("--output", "output_file", type=click.File("w"), default="-",
              help="Where the result lines go (default: stdout).")
@click.option("--workers", type=click.IntRange(min=1), default=min(4, os.cpu_count() or 1), show_default=True,
              help="Worker processes; results are the same and in input order for any number.")
def verify(input_file, output_file, workers):
    """Score decoded BFCL multi-turn calls: official verdict plus SEAL's turn labels.

    Each input line names a BFCL multi-turn entry and gives, per user turn, the calls a system made in BFCL's
    python-call form (a turn may also be a list of steps, each a list of calls, as in BFCL result files).
    Calls are parsed, never evaluated, and run on fresh API instances; tools a turn does not show are refused.

    Each output line is {"id", "valid", "labels", "causes", "error", "irrelevance_valid"}: valid is
    bfcl-eval's official verdict, labels and causes have one entry per ground-truth turn, and a line that
    cannot be scored gets valid null and an error naming the line and the fix; the other lines go on.
    A summary goes to stderr.

    \b
    Examples:
      seal-lite verify --input calls.jsonl --output scored.jsonl
      echo '{"id": "multi_turn_base_0", "turns": [[], [], [], []]}' | seal-lite verify --input -
    """
    import json
    from collections import Counter

    from rich.console import Console
    from rich.progress import track

    from seal_lite.step.verifier import verify_lines

    lines = input_file.readlines()
    records = verify_lines(lines, workers=workers)
    stderr = Console(stderr=True)
    if stderr.is_terminal:  # a bar for long files; pipes and logs get only the summary
        records = track(records, total=sum(1 for line in lines if line.strip()), description="verifying",
                        console=stderr, transient=True)
    counts, labels, irrelevance = Counter(), Counter(), []
    for record in records:
        output_file.write(json.dumps(record) + "\n")
        output_file.flush()
        counts["error" if record["error"] else "valid" if record["valid"] else "invalid"] += 1
        labels.update(record["labels"])
        if record["irrelevance_valid"] is not None:
            irrelevance.append(record["irrelevance_valid"])
    scored = counts["valid"] + counts["invalid"]
    click.echo(f"{scored + counts['error']} lines: {counts['valid']} valid, {counts['invalid']} not valid, "
               f"{counts['error']} unreadable", err=True)
    if scored:
        click.echo(f"official verdict {counts['valid'] / scored:.1%}; irrelevance check passed "
                   f"{sum(irrelevance) / scored:.1%} (reported apart, never part of the verdict)", err=True)
        click.echo("turn labels: " + ", ".join(f"{label} {n}" for label, n in labels.most_common()), err=True)


def _open_run(run_dir: str):
    from seal_lite.engines.store import Store

    path = Path(run_dir)
    path = path if path.suffix == ".db" else path / "seal.db"
    if not path.is_file():
        raise click.ClickException(f"{path} does not exist; pass a run directory made by `seal-lite run`")
    return Store(path)


@main.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True))
@click.option("--trajectory", "trajectory_id", metavar="ID", help="Show this trajectory turn by turn.")
@click.option("--step", type=int, help="List only this step's trajectories.")
@click.option("--failed", is_flag=True, help="List only trajectories with reward 0.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines (one per trajectory or turn) instead of a table.")
def diagnose(run_dir, trajectory_id, step, failed, as_json):
    """Show a run's diagnoses: every trajectory's turn labels, or one trajectory turn by turn.

    RUN is a run directory (or its seal.db). With --trajectory, each ground-truth turn is shown with the
    user request, the model's calls and their results, the label, its cause and the executable evidence.

    \b
    Examples:
      seal-lite diagnose runs/quickstart --failed
      seal-lite diagnose runs/quickstart --trajectory s1-multi_turn_base_0-g0
      seal-lite diagnose runs/quickstart --json | jq .labels
    """
    import json

    from seal_lite.console import print_trajectories, print_turns

    store = _open_run(run_dir)
    if trajectory_id:
        try:
            trajectory = store.trajectory(trajectory_id)
        except LookupError as error:
            raise click.ClickException(f"{error}; list ids with: seal-lite diagnose {run_dir}") from None
        turns = store.turns(trajectory_id)
        if as_json:
            for turn in turns:
                click.echo(json.dumps(turn))
        else:
            print_turns(trajectory, turns)
        return
    rows = [row for row in store.trajectories(step) if not failed or row["reward"] == 0]
    labels = store.turn_labels()
    if as_json:
        keys = ("id", "step", "task_id", "reward", "weight", "num_model_calls", "stop_reason")
        for row in rows:
            click.echo(json.dumps({key: row[key] for key in keys} | {"labels": labels.get(row["id"], [])}))
        return
    print_trajectories(rows, labels)
    click.echo(f"Details: seal-lite diagnose {run_dir} --trajectory ID")


@main.group()
def interface():
    """The training interface of a run, version by version (it never reaches evaluation).

    \b
    Examples:
      seal-lite interface show runs/quickstart
      seal-lite interface show runs/quickstart --version 2 --json
      seal-lite interface diff runs/quickstart 1 2
    """


def _versions(run_dir: str) -> dict[int, dict]:
    return {row["version"]: row for row in _open_run(run_dir).interface_versions()}


def _version(versions: dict[int, dict], number: int, run_dir: str) -> dict:
    if number not in versions:
        raise click.ClickException(f"{run_dir} has interface versions {sorted(versions)}, not {number}")
    return versions[number]


@interface.command("show")
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True))
@click.option("--version", "number", type=int, help="The version to show (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print the stored version row(s) as JSON.")
def interface_show(run_dir, number, as_json):
    """The timeline of interface versions, then one version's components in full.

    \b
    Examples:
      seal-lite interface show runs/quickstart
      seal-lite interface show runs/quickstart --version 1 --json
    """
    import json

    from seal_lite.core.interface import describe_version

    versions = _versions(run_dir)
    if not versions:
        raise click.ClickException(f"{run_dir} holds no interface version yet")
    chosen = _version(versions, number if number is not None else max(versions), run_dir)
    if as_json:
        click.echo(json.dumps(chosen if number is not None else list(versions.values()), indent=2))
        return
    for row in versions.values():
        click.echo(f"v{row['version']}  step {row['step']}  parent {row['parent'] or '-'}  {row['reason']}")
    click.echo(f"\nversion {chosen['version']}:\n{describe_version(chosen)}")


@interface.command("diff")
@click.argument("run_dir", metavar="RUN", type=click.Path(exists=True))
@click.argument("a", type=int)
@click.argument("b", type=int)
def interface_diff(run_dir, a, b):
    """A unified diff of interface versions A and B.

    \b
    Example:
      seal-lite interface diff runs/quickstart 1 2
    """
    from seal_lite.core.interface import diff_versions

    versions = _versions(run_dir)
    diff = diff_versions(_version(versions, a, run_dir), _version(versions, b, run_dir))
    click.echo(diff or f"versions {a} and {b} are the same")


if __name__ == "__main__":
    main()
