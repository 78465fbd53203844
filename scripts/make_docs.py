"""Write the generated sections of the manual: every command's `--help` into docs/commands.md (between its
`help` markers) and the metric list of seal_lite/core/metrics.py into docs/store.md (between its `metrics`
markers).

    python scripts/make_docs.py          # rewrite the sections
    python scripts/make_docs.py --check  # exit 1 if a section is out of date

tests/real/test_docs.py runs the same comparisons, so the manual cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from seal_lite.cli import main  # noqa: E402  (the checkout's seal_lite, not an installed one)
from seal_lite.core.metrics import METRICS  # noqa: E402

COMMANDS_MD = ROOT / "docs" / "commands.md"
START, END = "<!-- help: start -->", "<!-- help: end -->"
STORE_MD = ROOT / "docs" / "store.md"
METRICS_START, METRICS_END = "<!-- metrics: start -->", "<!-- metrics: end -->"
WRITERS = {"step": "Written with each step's rows (`seal_lite/core/records.py`):",
           "update": "Written after the step's policy update (TRL's log, `StoreCallback` in `seal_lite/training/grpo.py`):"}


def command_paths(group: click.Group = main, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the tree as its words after `seal-lite`, the group itself first, subcommands sorted; hidden
    ones (a process seal-lite starts for itself) left out."""
    paths = [prefix]
    for name in sorted(group.commands):
        command = group.commands[name]
        if command.hidden:
            continue
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


def help_text(path: tuple[str, ...]) -> str:
    """What `seal-lite PATH --help` prints on an 80-column terminal."""
    result = CliRunner().invoke(main, [*path, "--help"], prog_name="seal-lite", terminal_width=80)
    if result.exit_code != 0:
        raise RuntimeError(f"seal-lite {' '.join(path)} --help failed:\n{result.output}")
    return result.output.rstrip()


def help_section() -> str:
    """The generated part of docs/commands.md, markers included."""
    parts = [START]
    for path in command_paths():
        title = " ".join(("seal-lite", *path))
        parts += [f"### `{title}`", "", "```", help_text(path), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def metrics_section() -> str:
    """The generated part of docs/store.md, markers included: one line per metric, by who writes it."""
    parts = [METRICS_START]
    for writer, heading in WRITERS.items():
        parts += [heading, ""] + [f"- `{metric.name}`: {metric.description}" for metric in METRICS
                                  if metric.writer == writer] + [""]
    parts.append(METRICS_END)
    return "\n".join(parts)


def current_section(text: str, start: str = START, end: str = END) -> str:
    first, last = text.index(start), text.index(end) + len(end)
    return text[first:last]


SECTIONS = ((COMMANDS_MD, START, END, help_section), (STORE_MD, METRICS_START, METRICS_END, metrics_section))


def main_() -> int:
    stale = []
    for path, start, end, section in SECTIONS:
        text = path.read_text()
        new = text.replace(current_section(text, start, end), section())
        if new != text and "--check" in sys.argv[1:]:
            stale.append(path.relative_to(ROOT))
        elif new != text:
            path.write_text(new)
    for path in stale:
        print(f"{path} is out of date: run python scripts/make_docs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main_())
