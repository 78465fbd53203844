"""``seal-lite``: click commands over ``seal_lite.api``; library errors become messages in ``SealLiteGroup``, and
the options several commands share are defined once and mean the same everywhere. --help imports nothing heavy."""

import contextlib
import json
import os
import sys

import click

from seal_lite import api
from seal_lite.core.errors import ConfigError, SealLiteError
from seal_lite.core.plan import CARDS, card_key
from seal_lite.core.recipe import RecipeError, describe_fields


class SealLiteGroup(click.Group):
    """Library errors as one message, never a traceback: a recipe's problems (one line each) and other
    ``ConfigError``s exit 2, as click's usage errors do; any other ``SealLiteError`` exits 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except RecipeError as error:
            click.echo(f"Invalid recipe (nothing was written):\n{error}", err=True)
            ctx.exit(2)
        except ConfigError as error:
            raise click.UsageError(str(error)) from None  # no context: the message alone, exit 2
        except SealLiteError as error:
            raise click.ClickException(str(error)) from None


set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a recipe field, e.g. --set grpo.steps=1 (repeatable; defaults < recipe < --set).")
out_option = click.option("--out", type=click.Path(file_okay=False), help="The run directory (default runs/<name>; "
                          "`seal-lite run` takes runs/<name>-2, ... if a finished run is there, resumes an unfinished one).")
run_argument = click.argument("run_dir", metavar="RUN", type=click.Path(exists=True))
json_output = click.option("--json", "as_json", is_flag=True, help="Print JSON (an object, or a line per row).")


CARD_KEYS = [card_key(card) for card in CARDS]


def recipe_options(command):
    """RECIPE, --set and --out, for every command that reads a recipe."""
    return click.argument("recipe", required=False, type=click.Path(dir_okay=False))(set_option(out_option(command)))


def _load(recipe_path, overrides, out: str | None = None, processes: int = 1):
    """The recipe, checked against this machine and its run directory before anything is written."""
    return api.checked_recipe(recipe_path, api.parse_overrides(overrides), out_dir=out, processes=processes)


@click.group(cls=SealLiteGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="seal-lite")
def main():
    """seal-lite: train a tool-using agent with SEAL (diagnosis-weighted GRPO on BFCL multi-turn tasks); start with
    `seal-lite run` (the CPU quickstart), then `seal-lite diagnose runs/quickstart`."""


def _arguments(command: str, recipe, out, overrides, *extra: str) -> list[str]:
    """A recipe command's arguments as typed (RECIPE, --out, each --set, then ``extra``): what each process of
    `seal-lite run --processes N` runs, and what a frontier file says produced it."""
    return [command, *([recipe] if recipe else []), *(["--out", out] if out else []),
            *[item for pair in overrides for item in ("--set", pair)], *extra]


@main.command()
@recipe_options
@click.option("--overwrite", is_flag=True, help="Start afresh, deleting the run that already exists in --out.")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run on N processes of this machine (one per GPU) with accelerate (docs/distributed.md).")
@click.option("-v", "--verbose", is_flag=True, help="Also show the libraries' warnings, log lines and progress bars "
              "(always in RUN/run.log).")
@click.option("--no-fit-check", is_flag=True, help="Start even where, by the plan's figures (`seal-lite recipe RECIPE "
              "--card here`), the recipe does not fit the GPU torch sees.")
def run(recipe, overrides, out, overwrite, processes, verbose, no_fit_check):
    """Run the SEAL loop: roll out on BFCL, verify, diagnose, weight, and update a LoRA policy.

    RECIPE is a YAML file (default: the CPU quickstart); everything goes to the run directory's seal.db
    (docs/store.md), the libraries' messages to its run.log. After a crash, Ctrl-C or a full disk, the same
    command resumes the run.

    \b
    Examples:
      seal-lite run
      seal-lite run recipes/quickstart.yaml --set grpo.steps=1 --out runs/try
    """
    from seal_lite.console import RichProgress, print_recipe, print_summary
    from seal_lite.runs import preflight

    launched = api.launched_processes()
    if processes > 1 and launched > 1 and processes != launched:
        raise click.BadParameter(f"the launcher started {launched} processes; leave --processes out under "
                                 "accelerate launch", param_hint="--processes")
    config = _load(recipe, overrides, out=out, processes=max(processes, launched))
    if not no_fit_check:
        preflight.check_fit(config, recipe or "default recipe")
    if processes > 1 and launched == 1:  # accelerate starts the processes, each runs this command without it
        api.relaunch(processes, _arguments("run", recipe, out, overrides, *(["--overwrite"] if overwrite else []),
                                           *(["--verbose"] if verbose else []),
                                           *(["--no-fit-check"] if no_fit_check else [])))

    def announce(out_dir, resumed):
        if resumed:
            click.echo(f"{out_dir} holds an unfinished run ({resumed}): resuming it.")
        print_recipe(config, out_dir)

    main_process = api.is_main_process()
    with RichProgress(config.grpo.steps) if main_process else contextlib.nullcontext() as progress:
        summary = api.run(config, out, overwrite=overwrite, progress=progress, on_start=announce, verbose=verbose)
    if main_process:
        print_summary(summary)


@main.command()
@recipe_options
@click.option("--samples", type=click.IntRange(min=2), help="Samples per task (default: data.screen, else 4).")
@click.option("--write-frontier", "frontier_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the frontier tasks to FILE, with this command in its header: a recipe trains on them "
              "with data.task_file: FILE.")
def screen(recipe, overrides, out, samples, frontier_file):
    """Screen a recipe's tasks: which ones the base policy solves sometimes, but not always (a learning signal).

    \b
    Example:
      seal-lite screen recipes/cpu-qwen0.5b.yaml --samples 4 --set data.num_tasks=20
      seal-lite screen recipes/cpu-learn.yaml --set data.task_ids=null --write-frontier data/frontier/mine.txt
    """
    import shlex

    from seal_lite.console import RichProgress, print_screen

    command = shlex.join(["seal-lite", *_arguments("screen", recipe, out, overrides,
                                                   *(["--samples", str(samples)] if samples else []),
                                                   "--write-frontier", str(frontier_file))])
    config = _load(recipe, overrides + ((f"data.screen={samples}",) if samples else ()), out=out)
    samples = config.data.screen or api.SCREEN_SAMPLES
    with RichProgress(0) as progress:
        pass_rates = api.screen(config, out, samples=samples, progress=progress, frontier_file=frontier_file,
                                command=command)
    print_screen(pass_rates, samples)
    if frontier_file:
        click.echo(f"wrote the frontier to {frontier_file}: train on it with --set data.task_file={frontier_file}")


@main.command()
@json_output
@click.option("--model", metavar="SPEC", help="Model for the masking self-test (default: the quickstart's policy).")
@click.option("--no-self-test", is_flag=True, help="Skip the masking self-test (about 50 s on 2 CPU cores).")
@click.option("--backend", type=click.Choice(["peft", "peft-4bit"]), default="peft", help="Self-test's policy backend.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", help="Self-test's dtype.")
def doctor(as_json, model, no_self_test, backend, dtype):
    """What this machine can run: hardware, backends, models, and a masking self-test; status 1 if it cannot run.

    \b
    Example:
      seal-lite doctor --json --no-self-test
    """
    from seal_lite.console import doctor_text

    result = api.doctor(model, self_test=not no_self_test, backend=backend, dtype=dtype)
    click.echo(json.dumps(result, indent=2) if as_json else doctor_text(result))
    if not result["ok"]:
        sys.exit(1)


@main.command()
@run_argument
@click.option("--report-dir", type=click.Path(file_okay=False), help="Where to write it (default RUN/report).")
@click.option("--trajectories", default=4, show_default=True, help="Sample trajectories shown turn by turn.")
def report(run_dir, report_dir, trajectories):
    """Write RUN/report/report.html: plots of the run, its interface versions, evaluations and sample trajectories;
    and RUN/adapter/README.md, the trained adapter's model card (base model, recipe, rewards, held-out results,
    the interface it ended with), in the form the Hugging Face hub reads.

    \b
    Example:
      seal-lite report runs/quickstart
    """
    click.echo(str(api.report(run_dir, report_dir, trajectories=trajectories)))
    card = os.path.join(run_dir, "adapter", "README.md")
    if os.path.isfile(card):
        click.echo(f"model card: {card}")


@main.command()
@run_argument
@click.option("--to", "kind", required=True, type=click.Choice(["merged", "gguf", "lora-gguf"]),
              help="merged: a Hugging Face model directory (transformers, vLLM). gguf: one GGUF with the LoRA merged "
              "in (llama.cpp). lora-gguf: the LoRA as a llama.cpp adapter GGUF for the run's base GGUF.")
@click.option("--output", type=click.Path(), metavar="PATH", help="Where to write it (default RUN/export/merged, "
              "RUN/export/merged-f16.gguf or RUN/export/lora.gguf).")
@click.option("--step", type=int, help="That step's checkpoint instead of the run's newest adapter.")
@click.option("--best", is_flag=True, help="The best validation checkpoint (RUN/best-adapter) instead.")
@click.option("--gguf-type", type=click.Choice(["f16", "f32", "bf16", "q8_0"]),
              help="With --to gguf: the type of the matrices the LoRA changed (default f16; the other tensors keep "
              "the base GGUF's types).")
@click.option("--base-gguf", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="The base model as a GGUF, for a run whose policy.model is a hub id or a directory (convert it "
              "with llama.cpp's convert_hf_to_gguf.py).")
@click.option("--overwrite", is_flag=True, help="Replace what is at --output.")
def export(run_dir, kind, output, step, best, gguf_type, base_gguf, overwrite):
    """Export a run's trained LoRA for other tools: a merged model, a GGUF, or a LoRA GGUF (docs/export.md).

    Prints what it wrote and a command that serves it.

    \b
    Examples:
      seal-lite export runs/quickstart --to lora-gguf
      seal-lite export runs/quickstart --to gguf --gguf-type q8_0 --output qwen-seal.gguf
      seal-lite export runs/quickstart --to merged --step 1
    """
    done = api.export(run_dir, kind, output, step=step, best=best, gguf_type=gguf_type, base_gguf=base_gguf,
                      overwrite=overwrite)
    click.echo(f"wrote {done.path} (--to {done.kind}, from {done.adapter})")
    click.echo(f"serve it: {done.serve_command()}")


DEFAULT, TAU2_DOMAINS = click.core.ParameterSource.DEFAULT, ("retail", "airline", "telecom")
BENCHMARK_OPTIONS = {"bfcl": ("split", "view"), "tau2": ("domains", "user_model", "max_steps", "into")}


def _benchmark_options(ctx, benchmark: str, options: dict) -> dict:
    """The ``options`` of ``benchmark`` as ``api.evaluate`` takes them; the other benchmark's, if given, refused."""
    (other,) = set(BENCHMARK_OPTIONS) - {benchmark}
    for param in ctx.command.params:
        if param.name in BENCHMARK_OPTIONS[other] and ctx.get_parameter_source(param.name) != DEFAULT:
            raise click.BadParameter("needs --benchmark tau2" if other == "tau2" else "BFCL only; τ² plays its own "
                                     "tasks (choose them with --domain and --tasks)", param_hint=param.opts[0])
    return {name: options[name] for name in BENCHMARK_OPTIONS[benchmark]}


@main.command(name="eval")
@click.argument("target")
@click.option("--split", default="eval", show_default=True, help="eval (400 held-out tasks), train, or BFCL ids a,b.")
@click.option("--tasks", type=click.IntRange(min=1), help="Only the first N tasks of each category (τ²: domain).")
@click.option("--base", is_flag=True, help="With a RUN: also evaluate the base model, side by side.")
@click.option("--step", "steps", type=int, multiple=True, help="With a RUN: this step's checkpoint (repeatable).")
@click.option("--best", is_flag=True, help="With a RUN: its best validation checkpoint (RUN/best-adapter, recipe "
              "section validation) instead of the newest adapter.")
@set_option
@click.option("--json-file", type=click.File("w"), help="Also write the results to FILE (JSON).")
@click.option("--view", type=click.Choice(["official", "signatures"]), default="official", show_default=True,
              help="official: BFCL's own task. signatures: one line per tool; not BFCL scores, marked so.")
@click.option("--benchmark", type=click.Choice(["bfcl", "tau2"]), default="bfcl", show_default=True,
              help="bfcl: held-out BFCL tasks. tau2: τ²-bench, with a local user simulator (docs/tau2.md).")
@click.option("--domain", "domains", type=click.Choice(TAU2_DOMAINS), multiple=True, help="τ² domain (repeatable).")
@click.option("--user-model", metavar="SPEC", help="τ²'s user simulator (default: the policy's base model).")
@click.option("--max-steps", type=click.IntRange(min=1), help="τ²: messages before a conversation is cut (0 score).")
@click.option("--into", type=click.Path(exists=True, file_okay=False), metavar="RUN",
              help="τ², a model or URL as TARGET: also store the results in RUN's seal.db.")
@click.pass_context
def evaluate_command(ctx, target, tasks, base, steps, best, overrides, json_file, benchmark, **benchmark_options):
    """Evaluate a run's trained policy or a model on held-out BFCL tasks, or on τ²-bench.

    TARGET is a run directory (results are stored in its seal.db), a model, or (τ²) a server URL. Greedy decoding
    on BFCL's official surface, scored by the official verdict (docs/commands.md).

    \b
    Examples:
      seal-lite eval runs/quickstart --base --step 1 --tasks 5
      seal-lite eval runs/paper-qwen2.5-7b --best
      seal-lite eval smollm2-135m --split multi_turn_base_1,multi_turn_miss_func_3 --json-file base.json
      seal-lite eval runs/paper --base --benchmark tau2 --domain retail --tasks 10 --user-model qwen7b.gguf
    """
    from seal_lite.console import EvalProgress, Tau2Progress, print_evaluation, print_tau2

    options = _benchmark_options(ctx, benchmark, benchmark_options)
    results = api.evaluate(target, benchmark=benchmark, tasks=tasks, base=base, steps=steps, best=best,
                           overrides=api.parse_overrides(overrides), note=lambda text: click.echo(text, err=True),
                           progress=Tau2Progress if benchmark == "tau2" else EvalProgress, **options)
    if benchmark == "tau2":
        print_tau2(results["summary"], results["user_model"])
    else:
        print_evaluation(results["summary"])
    if json_file:
        json.dump(results, json_file, indent=2)


@main.command()
@click.argument("task_id")
@click.option("--model", metavar="SPEC", help="Whose chat template renders it (default: the run's, or smollm2-135m).")
@click.option("--run", "run_dir", type=click.Path(exists=True), metavar="RUN", help="Show RUN's training interface.")
@click.option("--version", "number", type=int, help="With --run: the interface version (default: the latest).")
@click.option("--turn", type=click.IntRange(min=0), default=0, show_default=True,
              help="0: the whole opening; K: what user turn K adds.")
@click.option("--parser", type=click.Choice(["strict", "toolace", "llama3.1"]), default="strict", show_default=True,
              help="The call format whose view to show (rollout.parser): Qwen's, ToolACE-2's or Llama 3.1's.")
@click.option("--environment", metavar="SPEC", help="The task's environment, as data.environment names it "
              "(default: the run's, else bfcl).")
def prompt(task_id, model, run_dir, number, turn, parser, environment):
    """Print exactly what the policy reads for a task (evaluation view), and how many tokens it is.

    \b
    Examples:
      seal-lite prompt multi_turn_miss_func_3 --turn 2 --model qwen2.5-coder-0.5b
      seal-lite prompt multi_turn_base_0 --run runs/quickstart --version 2
      seal-lite prompt library_0 --environment library
    """
    if number is not None and not run_dir:
        raise click.BadParameter("--version needs --run", param_hint="--version")
    if parser != "strict" and run_dir:
        raise click.BadParameter("a run's view is in its own format; drop --parser, or --run", param_hint="--parser")
    shown = api.prompt(task_id, model=model, run_dir=run_dir, version=number, turn=turn, parser=parser,
                       environment=environment)
    click.echo(shown.text)
    click.echo(f"--- {task_id}, turn {turn} of {shown.turns}, {shown.shown}, {shown.model}: {shown.tokens} tokens",
               err=True)


@main.command()
@recipe_options
@click.option("--fields", is_flag=True, help="List every field with its default and description.")
@click.option("--card", type=click.Choice([*CARD_KEYS, "here"]),
              help="Instead, plan the recipe for this GPU class (here: the one torch sees): its memory by the memory "
                   "model, whether it fits, the --set that makes it fit, and the estimated hours a step and a run.")
def recipe(recipe, overrides, out, fields, card):
    """Validate a recipe, as `seal-lite run` does, and print it fully resolved (defaults < file < --set).

    \b
    Examples:
      seal-lite recipe recipes/quickstart.yaml
      seal-lite recipe --fields
      seal-lite recipe recipes/gpu-24gb.yaml --card rtx-4090
    """
    import yaml

    if fields:
        return click.echo("\n".join(f"{name} = {default}\n    {meaning}" for name, default, meaning in describe_fields()))
    if card:
        from seal_lite.console import print_card_plan

        config = api.load_recipe(recipe, api.parse_overrides(overrides))  # the schema only: the card is elsewhere
        return print_card_plan(config, api.card_plan(config, card))
    loaded = _load(recipe, overrides, out=out)
    click.echo(yaml.safe_dump(loaded.model_dump(), sort_keys=False).rstrip())
    if loaded.data.environment != "bfcl":
        click.echo(api.describe_environment(loaded.data.environment), err=True)


@main.command()
@click.argument("recipe", type=click.Path(exists=True, dir_okay=False))
@set_option
@click.option("--out", type=click.Path(file_okay=False),
              help="Where the rehearsal goes (default runs/<name>-rehearsal; started afresh each time).")
@click.option("--card", type=click.Choice(CARD_KEYS),
              help="The GPU class to rehearse for (default: the smallest the recipe fits by the memory model).")
def rehearse(recipe, overrides, out, card):
    """Rehearse a GPU recipe on this CPU before renting a card: its own backend, dtype (fp16 with loss scaling for a
    T4), 4-bit layers, rollout engine and attention, shared-prefix update, validation and checkpoints, on a
    random-weight model of its architecture shrunk to run in minutes; two steps, killed after the first
    checkpoint and resumed. Prints what ran beside what the card runs, each check, and what only a GPU can show.
    Exit status 1 if a check failed. With `seal-lite recipe RECIPE --card CARD` (memory and hours) it answers
    "will my recipe work on that card".

    \b
    Example:
      seal-lite rehearse recipes/colab-t4.yaml
    """
    from seal_lite.runs.rehearse import GPU_ONLY

    done = api.rehearse(recipe, api.parse_overrides(overrides), out, card, echo=click.echo)
    width = max(len(setting.name) for setting in done.settings)
    click.echo(f"\n{'':{width}}  on the {done.card.name}  |  rehearsed here")
    for setting in done.settings:
        click.echo(f"{setting.name:{width}}  {setting.on_card}  |  {setting.rehearsed}"
                   + (f"\n{'':{width}}    ({setting.note})" if setting.note else ""))
    click.echo("\nChecks:")
    for check in done.checks:
        click.echo(f"  {'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    click.echo("\nOnly a GPU can show: " + "; ".join(GPU_ONLY) + ".")
    click.echo(f"\n{'Rehearsal passed' if done.ok else 'Rehearsal FAILED'} in {done.seconds:.0f} s; its run and "
               f"the processes' output are in {done.out_dir}.")
    if not done.ok:
        sys.exit(1)


@main.command(name="rehearsal-child", hidden=True, context_settings={"ignore_unknown_options": True})
@click.argument("facts_file")
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
def rehearsal_child(facts_file, arguments):
    """`seal-lite rehearse`'s child process: `seal-lite ARGUMENTS` with the rehearsal's stand-ins, recording what ran
    to FACTS_FILE."""
    from seal_lite.runs.rehearse import instrument

    instrument(facts_file)
    main(list(arguments), prog_name="seal-lite")


@main.command()
@click.option("--input", "input_file", required=True, type=click.File("r", errors="replace"),
              help="JSONL, one episode per line, its calls per user turn ('-': stdin).")
@click.option("--output", "output_file", type=click.File("w"), default="-", help="Where the result lines go.")
@click.option("--workers", type=click.IntRange(min=1), default=min(4, os.cpu_count() or 1), show_default=True,
              help="Worker processes (the same results, in order).")
def verify(input_file, output_file, workers):
    """Score decoded BFCL multi-turn calls: official verdict plus SEAL's turn labels (docs/commands.md).

    Calls are parsed, never evaluated. Each output line is {"id", "valid", "labels", "causes", "error",
    "irrelevance_valid"}; a line that cannot be scored gets an error naming the fix.

    \b
    Examples:
      seal-lite verify --input calls.jsonl --output scored.jsonl
      echo '{"id": "multi_turn_base_0", "turns": [[], [], [], []]}' | seal-lite verify --input -
    """
    lines, scored = input_file.readlines(), []
    with click.progressbar(api.verify(lines, workers=workers), length=sum(1 for line in lines if line.strip()),
                           label="verifying", file=sys.stderr, hidden=not sys.stderr.isatty()) as records:
        for record in records:
            output_file.write(json.dumps(record) + "\n")
            output_file.flush()  # a reader of the pipe sees each line as soon as it is scored
            scored.append(record)
    click.echo(api.verify_summary(scored), err=True)


@main.command()
@run_argument
@click.option("--trajectory", "trajectory_id", metavar="ID", help="Show this trajectory turn by turn.")
@click.option("--step", type=int, help="List only this step's trajectories.")
@click.option("--failed", is_flag=True, help="List only trajectories with reward 0.")
@json_output
def diagnose(run_dir, trajectory_id, step, failed, as_json):
    """Show a run's diagnoses: every trajectory's turn labels, or one trajectory turn by turn.

    \b
    Examples:
      seal-lite diagnose runs/quickstart --failed --json | jq .labels
      seal-lite diagnose runs/quickstart --trajectory s1-multi_turn_base_0-g0
    """
    from seal_lite.console import print_trajectories, print_turns

    if trajectory_id:
        trajectory, rows = api.trajectory(run_dir, trajectory_id)  # rows: its turns
    else:
        rows = api.diagnose(run_dir, step=step, failed=failed)
    if as_json:
        return click.echo("".join(f"{json.dumps(row)}\n" for row in rows), nl=False)
    if trajectory_id:
        return print_turns(trajectory, rows)
    print_trajectories(rows, {row["id"]: row["labels"] for row in rows})
    click.echo(f"Details: seal-lite diagnose {run_dir} --trajectory ID")


@main.group()
def interface():
    """The training interface of a run, version by version (it never reaches evaluation)."""


@interface.command("show")
@run_argument
@click.option("--version", "number", type=int, help="The version to show (default: the latest).")
@json_output
def interface_show(run_dir, number, as_json):
    """The timeline of interface versions, then one version's components in full (--json: the stored rows).

    \b
    Example:
      seal-lite interface show runs/quickstart --version 1 --json
    """
    from seal_lite.core.interface import describe_version

    chosen, versions = api.interface_version(run_dir, number), api.interface_versions(run_dir)
    if as_json:
        return click.echo(json.dumps(chosen if number is not None else list(versions.values()), indent=2))
    for row in versions.values():
        click.echo(f"v{row['version']}  step {row['step']}  parent {row['parent'] or '-'}  {row['reason']}")
    click.echo(f"\nversion {chosen['version']}:\n{describe_version(chosen)}")


@interface.command("diff")
@run_argument
@click.argument("a", type=int)
@click.argument("b", type=int)
def interface_diff(run_dir, a, b):
    """A unified diff of interface versions A and B.

    \b
    Example:
      seal-lite interface diff runs/quickstart 1 2
    """
    from seal_lite.core.interface import diff_versions

    diff = diff_versions(api.interface_version(run_dir, a), api.interface_version(run_dir, b))
    click.echo(diff or f"versions {a} and {b} are the same")

