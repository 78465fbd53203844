"""``seal-lite``: thin click commands over the library. Heavy imports happen inside commands, so --help is fast."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from seal_lite.recipe import RecipeError, describe_fields, load_recipe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="seal-lite")
def main():
    """seal-lite: train a tool-using agent with SEAL (diagnosis-weighted GRPO on BFCL multi-turn tasks).

    \b
    Start here:
      seal-lite run                          the CPU quickstart (embedded default recipe)
      seal-lite run recipes/quickstart.yaml  the same, from a file you can edit
      seal-lite recipe --fields              every recipe field with its default and meaning
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


def _load(recipe_path, overrides):
    try:
        return load_recipe(recipe_path, _parse_overrides(overrides))
    except RecipeError as error:
        click.echo(f"Invalid recipe:\n{error}", err=True)
        sys.exit(2)


def _free_out_dir(base: Path) -> Path:
    """runs/NAME, or runs/NAME-2, -3, ... when an earlier run already lives there."""
    candidate, n = base, 1
    while (candidate / "seal.db").exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


@main.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(file_okay=False), help="Run directory (default runs/<name>, "
              "or runs/<name>-2, ... if taken).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe field, e.g. --set grpo.steps=1 (repeatable).")
@click.option("--overwrite", is_flag=True, help="Replace a run that already exists in --out.")
def run(recipe, out, overrides, overwrite):
    """Run the SEAL loop: roll out on BFCL, verify, diagnose, weight, and update a LoRA policy.

    RECIPE is a YAML file; without it the embedded CPU quickstart runs. Everything the run does is written
    to RUN_DIR/seal.db (SQLite; tables documented in docs/store.md).

    \b
    Examples:
      seal-lite run
      seal-lite run recipes/quickstart.yaml --set grpo.steps=1 --out runs/try
    """
    config = _load(recipe, overrides)
    if out:
        out_dir = Path(out)
        if (out_dir / "seal.db").exists():
            if not overwrite:
                raise click.ClickException(f"{out_dir} already holds a run; choose another --out or pass --overwrite")
            for suffix in ("", "-wal", "-shm"):
                (out_dir / f"seal.db{suffix}").unlink(missing_ok=True)
    else:
        out_dir = _free_out_dir(config.out_dir())

    from seal_lite.console import RichProgress, print_recipe, print_summary
    from seal_lite.loop import run as run_loop

    print_recipe(config, out_dir)
    with RichProgress(config.grpo.steps) as progress:
        summary = run_loop(config, out_dir, progress)
    print_summary(summary)


@main.command()
@click.argument("recipe", required=False, type=click.Path(dir_okay=False))
@click.option("--fields", is_flag=True, help="List every field with its default and description.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a field (repeatable).")
def recipe(recipe, fields, overrides):
    """Validate a recipe and print it fully resolved (defaults < file < --set).

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

    config = _load(recipe, overrides)
    click.echo(yaml.safe_dump(config.model_dump(), sort_keys=False).rstrip())


if __name__ == "__main__":
    main()
