"""The README and the manual in docs/ cannot drift from the code (as sqlite-utils tests its docs).

Every `seal-lite ...` command they print (in code blocks and inline code) must name a real command, use only
options that command accepts, and set only recipe fields that exist; every recipe and relative link they name
must exist; and docs/commands.md must hold each command's current `--help`, which scripts/make_docs.py writes.
The README's five-minute tour runs word for word on a small real run, whose printed summary must match its store.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import sqlite_utils
import yaml

from seal_lite.cli import main
from seal_lite.core.recipe import RecipeError, load_recipe
from tests.helpers import load_script

ROOT = Path(__file__).parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS, *sorted((ROOT / "docs" / "results").glob("*.md"))]

make_docs = load_script("make_docs")


def without_generated_help(text: str) -> str:
    """docs/commands.md's generated section is checked against --help itself, not parsed as prose."""
    if make_docs.START in text:
        return text.replace(make_docs.current_section(text), "")
    return text


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, re.MULTILINE | re.DOTALL)


def command_lines(text: str) -> list[str]:
    """Every seal-lite command line: lines of code blocks and inline code spans, from `seal-lite` on.

    A `# comment`, a pipe into another program (`| jq ...`) and anything after `&&` or `;` are cut off; a
    synopsis keeps its brackets (`[--out DIR]`, `(RUN | MODEL)`), since only the words are checked."""
    text = without_generated_help(text)
    candidates = [line for _, body in code_blocks(text) for line in re.sub(r"\\\n\s*", "", body).splitlines()]
    prose = re.sub(r"^ *```\w*\n.*?^ *```", "", text, flags=re.MULTILINE | re.DOTALL)
    candidates += re.findall(r"`([^`\n]*seal-lite [^`\n]*)`", prose)
    lines = []
    for candidate in candidates:
        match = re.search(r"(?:^|[\s/!])seal-lite( .*|$)", candidate)
        if not match:
            continue
        line = "seal-lite" + match.group(1)
        line = re.split(r"\s+#\s|\s&&\s|;\s|\s\|\s(?![A-Z(])", line)[0]
        lines.append(line.strip())
    return lines


def resolve(words: list[str]) -> tuple[list[str], click.Command]:
    """The command path at the start of words (after seal-lite) and its click command."""
    command, names = main, []
    while words and isinstance(command, click.Group) and words[0] in command.commands:
        names.append(words.pop(0))
        command = command.commands[names[-1]]
    return names, command


def problems_of(line: str) -> list[str]:
    """What is wrong with one printed seal-lite command line, against the real command tree and recipe schema."""
    words = re.findall(r"[^\s\[\]()|]+", line)[1:]
    names, command = resolve(list(words))
    if words and not names and not words[0].startswith("-"):
        return [f"{line!r}: seal-lite has no command {words[0]!r}"]
    if isinstance(command, click.Group) and command is not main:
        rest = words[len(names):]
        if rest and not rest[0].startswith("-"):
            return [f"{line!r}: seal-lite {' '.join(names)} has no subcommand {rest[0]!r}"]
    known = {opt for parameter in command.params for opt in [*parameter.opts, *parameter.secondary_opts]}
    known |= {"--help", "-h"} | ({"--version"} if command is main else set())
    problems = []
    for word in words[len(names):]:
        option = word.split("=", 1)[0]
        if option.startswith("--") and option not in known:
            problems.append(f"{line!r}: seal-lite {' '.join(names)} has no option {option}")
    problems += override_problems(line, names)
    return problems


def override_problems(line: str, names: list[str]) -> list[str]:
    """Each concrete `--set section.field=value` must load into the recipe it is given with."""
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        return []
    recipe = None
    if names and names[0] in {"run", "recipe", "screen"} and len(words) > 1 and words[1].endswith(".yaml"):
        recipe = ROOT / words[1]
    problems = []
    for flag, value in zip(words, words[1:]):
        key, _, text = value.partition("=")
        if flag != "--set" or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", key):
            continue
        try:
            load_recipe(recipe, {key: yaml.safe_load(text)})
        except RecipeError as error:
            problems.append(f"{line!r}: --set {value}: {error}")
    return problems


def test_the_readme_opens_with_what_it_is_then_the_two_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# seal-lite\n\n")
    language, body = code_blocks(readme)[0]
    assert language == "bash" and body.splitlines() == ["bash scripts/setup.sh && .venv/bin/seal-lite run",
                                                        "bash scripts/setup.sh && .venv/bin/python -m pytest -q"]
    assert body.splitlines()[1] in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_front_page():
    """At most 8,000 characters, and every page of the manual says first what a reader finds there."""
    assert len((ROOT / "README.md").read_text()) <= 8_000
    for page in DOCS:
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2] and not lines[2].startswith(("#", "|", "-")), \
            f"{page.name}: a title, then a sentence on what the page holds"


def readme_library_example() -> str:
    """The Python block of the README's "Use as a library" section."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use as a library", 1)[1].split("\n## ", 1)[0]
    (code,) = [body for language, body in code_blocks(section) if language == "python"]
    return code


def test_the_readme_library_example_runs_as_printed_but_for_the_training_run(monkeypatch, capsys):
    """Word for word through the public facade: prompt, verify and load_recipe run for real; the training run is
    only bound to run's real signature (a training step is the tour's test's job)."""
    import inspect

    import seal_lite

    signature, runs = inspect.signature(seal_lite.run), []
    monkeypatch.setattr(seal_lite, "run", lambda *args, **kwargs: runs.append(signature.bind(*args, **kwargs)))
    monkeypatch.chdir(ROOT)
    exec(compile(readme_library_example(), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "<tools>" in printed  # prompt: the official tool block
    assert "False ['" in printed  # verify: the verdict, then one label per ground-truth turn
    (bound,) = runs
    recipe = next(iter(bound.arguments.values()))
    assert recipe.grpo.steps == 1


def test_the_manual_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in DOCS:
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_printed_command_and_option_exists(page):
    lines = command_lines(page.read_text())
    problems = [problem for line in lines for problem in problems_of(line)]
    assert not problems, "\n".join(problems)


def test_the_readme_prints_the_tour():
    lines = command_lines((ROOT / "README.md").read_text())
    tour = {tuple(resolve(line.split()[1:])[0]) for line in lines}
    assert tour >= {("run",), ("prompt",), ("diagnose",), ("interface", "show"), ("report",), ("eval",)}


def test_the_checker_catches_a_removed_option_a_missing_command_and_a_field():
    assert problems_of("seal-lite run --out runs/x --set grpo.steps=1") == []
    assert problems_of("seal-lite eval (RUN | MODEL) [--split eval|train|IDS] [--tasks N]") == []
    assert problems_of("seal-lite diagnose runs/quickstart --json | jq .labels") == []
    assert "has no option --no-such-option" in problems_of("seal-lite run --no-such-option")[0]
    assert "has no command 'fly'" in problems_of("seal-lite fly")[0]
    assert "has no subcommand 'rename'" in problems_of("seal-lite interface rename runs/x")[0]
    assert "grpo.no_such_field" in problems_of("seal-lite run --set grpo.no_such_field=1")[0]
    assert len(command_lines("Try `seal-lite run --fast`.\n```bash\n$ .venv/bin/seal-lite eval x --nope  # c\n```")) == 2


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_recipe_override_names_a_real_field(page):
    """`--set section.field=value` anywhere, also outside a seal-lite line, loads into the default recipe."""
    problems = []
    text = without_generated_help(page.read_text())
    for key, value in re.findall(r"--set ([a-z_]+(?:\.[a-z_]+)+)=([^\s`'\"]+)", text):
        try:
            load_recipe(None, {key: yaml.safe_load(value)})
        except RecipeError as error:
            problems.append(f"--set {key}={value}: {error}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_recipe_and_relative_link_exists(page):
    text = without_generated_help(page.read_text())
    missing = [path for path in re.findall(r"recipes/[\w.-]+\.yaml", text) if not (ROOT / path).is_file()]
    if page.name in {"README.md", "recipes.md"}:
        names = re.findall(r"`([\w.*-]+\.yaml)`", text)
        missing += [name for name in names if name != "recipe.yaml" and not list((ROOT / "recipes").glob(name))]
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            missing.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {missing}"


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.MULTILINE | re.DOTALL)
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return slugs


def test_commands_md_holds_every_commands_current_help():
    text = (ROOT / "docs" / "commands.md").read_text()
    assert make_docs.current_section(text) == make_docs.help_section(), \
        "docs/commands.md's --help section is out of date: run python scripts/make_docs.py"
    for path in make_docs.command_paths():
        assert f"### `{' '.join(('seal-lite', *path))}`" in text


def test_store_md_lists_every_metric_as_core_metrics_defines_it():
    text = (ROOT / "docs" / "store.md").read_text()
    assert make_docs.current_section(text, make_docs.METRICS_START, make_docs.METRICS_END) == \
        make_docs.metrics_section(), "docs/store.md's metric list is out of date: run python scripts/make_docs.py"


def tour_lines() -> list[str]:
    """The seal-lite lines of the README's tour, in order (the first command of the README runs the quickstart)."""
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return [line for language, body in code_blocks(tour) if language == "bash"
            for line in body.splitlines() if line.startswith("seal-lite ")]


def test_the_readme_tour_runs_as_printed_and_prints_what_the_store_holds(tmp_path):
    """Each tour command, word for word, on a small real run in runs/quickstart (the quickstart's
    Qwen2.5-Coder-0.5B from its pip GGUF, real BFCL, a real TRL step, the same model as the diagnoser explaining a
    failed turn); the run's summary must match its seal.db, and eval stores what it printed.

    The run itself is the quickstart with smaller budgets and the README's trajectory's task, so the printed
    `--trajectory` id exists; `seal-lite eval` then inherits those budgets from the run's recipe."""
    from seal_lite.runs.tasks import select_task_ids

    lines = tour_lines()
    (trajectory,) = {word for line in lines for word in re.findall(r"--trajectory (\S+)", line)}
    task = re.fullmatch(r"s1-(.+)-g0", trajectory).group(1)
    assert task in select_task_ids(load_recipe()), "the README's trajectory is not from the quickstart's tasks"
    settings = [f"data.task_ids=[{task}]", "grpo.tasks_per_step=1", "grpo.steps=1", "rollout.num_generations=2",
                "rollout.max_model_calls=2", "diagnoser.max_per_step=1", "grpo.dynamic_sampling=null"]
    environment = {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def seal_lite(arguments: list[str], returncode: int = 0) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "seal_lite", *arguments], cwd=tmp_path, capture_output=True,
                                text=True, timeout=1800, env=environment, check=False)  # a hang guard
        assert result.returncode == returncode, f"seal-lite {shlex.join(arguments)}:\n{result.stderr[-3000:]}"
        return result

    summary = seal_lite(["run", *[word for setting in settings for word in ("--set", setting)]]).stdout
    out = tmp_path / "runs" / "quickstart"
    check_summary_against_store(summary, out, cwd=tmp_path)
    answered = list(sqlite_utils.Database(out / "seal.db")["diagnoses"].rows_where("status = 'ok'"))
    failed = sqlite_utils.Database(out / "seal.db").execute("select count(*) from trajectories where reward = 0")
    assert len(answered) == min(1, failed.fetchone()[0])  # at most one a step (diagnoser.max_per_step)
    assert all(row["model"].startswith("qwen2.5-coder-0.5b") for row in answered)
    outputs = {line: seal_lite(shlex.split(line)[1:]).stdout for line in lines if line != "seal-lite run"}
    assert trajectory in outputs[next(line for line in lines if "--trajectory" in line)]
    assert (out / "report" / "report.html").is_file()

    # the trained policy next to the base model on held-out tasks; results are stored with the run
    evaluation = outputs[next(line for line in lines if line.startswith("seal-lite eval"))]
    assert "base" in evaluation and "step 1" in evaluation
    stored = sqlite_utils.Database(out / "seal.db").execute("select model, count(*) from evaluations group by model")
    assert dict(stored.fetchall()) == {"base": 4, "step 1": 4}  # --tasks 1: one task of each of the 4 categories
    missing = seal_lite(["eval", "runs/quickstart", "--step", "7"], returncode=1)
    assert "keeps checkpoints of steps [1], not 7" in missing.stderr


def check_summary_against_store(text: str, out: Path, cwd: Path) -> None:
    """The table `seal-lite run` prints at the end says what seal.db holds."""
    db = sqlite_utils.Database(out / "seal.db")
    assert set(db.table_names()) >= {"runs", "steps", "tasks", "trajectories", "turns", "interface_versions", "metrics"}
    assert next(db["runs"].rows)["status"] == "finished"
    steps, trajectories = list(db["steps"].rows), list(db["trajectories"].rows)
    assert len(steps) == 1 and len(trajectories) == 2 and db["turns"].count == 2

    def row(name):
        match = re.search(rf"{re.escape(name)}\s*│\s*(.+?)\s*│", text)
        assert match, f"summary lacks {name!r}:\n{text}"
        return match.group(1)

    assert int(row("steps")) == len(steps)
    reward = sum(t["reward"] for t in trajectories) / 2
    assert row("reward per step (official verdict)") == f"{reward:.2f}  {'▁▅█'[round(2 * reward)]}  mean {reward:.3f}"
    labels = dict(db.execute("select label, count(*) from turns group by label").fetchall())
    assert row("turn labels") == ", ".join(f"{label} {n}" for label, n in sorted(labels.items(), key=lambda x: -x[1]))
    low, high = (float(x) for x in row("diagnosis weight range").split(" - "))
    assert (low, high) == (round(steps[0]["weight_min"], 2), round(steps[0]["weight_max"], 2))
    assert (cwd / row("database")).resolve() == (out / "seal.db").resolve()  # relative to where it ran
    assert steps[0]["loss"] is not None and (out / "adapter" / "adapter_config.json").exists()

    # on a CPU the default rollout engine is llama.cpp with the exported LoRA. The update runs exactly when the
    # group's two rewards differ; then the engines' log-probs are compared and the LoRA moves
    assert "rollouts llamacpp" in text
    metrics = dict(db.execute("select name, value from metrics where step = 1").fetchall())
    signal = len({t["reward"] for t in trajectories}) == 2
    assert row("groups with a signal").startswith("100%" if signal else "0%")
    assert (metrics["grpo/update_skipped"] == 1.0) == (not signal) == ("no learning signal" in text)
    assert ("grpo/engine/logprob_gap_mean" in metrics) == signal
    assert (metrics["grpo/lora_change"] > 0) == signal
    assert row("LoRA moved per step").startswith(f"{metrics['grpo/lora_change']:.3g}")
    assert metrics["time/prefill_s"] > 0 and metrics["time/decode_s"] > 0 and metrics["time/update_s"] > 0
