"""Write every command's `--help` into docs/commands.md, between its `help` markers.

    python scripts/make_docs.py          # rewrite the section
    python scripts/make_docs.py --check  # exit 1 if the section is out of date

tests/real/test_docs.py runs the same comparison, so the manual cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from seal_lite.cli import main  # noqa: E402  (the checkout's seal_lite, not an installed one)

COMMANDS_MD = ROOT / "docs" / "commands.md"
START, END = "<!-- help: start -->", "<!-- help: end -->"


def command_paths(group: click.Group = main, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the tree as its words after `seal-lite`, the group itself first, subcommands sorted."""
    paths = [prefix]
    for name in sorted(group.commands):
        command = group.commands[name]
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


def current_section(text: str) -> str:
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def render(text: str) -> str:
    """text with its help section replaced by the current one."""
    return text.replace(current_section(text), help_section())


def main_() -> int:
    text = COMMANDS_MD.read_text()
    new = render(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/commands.md is out of date: run python scripts/make_docs.py", file=sys.stderr)
            return 1
        return 0
    COMMANDS_MD.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
