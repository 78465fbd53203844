"""Compare two runs' stores row by row, wall-clock columns and timings excepted; exit 1 on any difference.

Used to show that a refactor left behaviour unchanged: run the same seeded recipe before and after it, then

    python scripts/compare_stores.py runs/before/seal.db runs/after/seal.db

Ignored: columns that hold a time (``*_at``, ``*_s``, ``seconds``), the metrics that do (``time/*``, ``*_s``,
``diagnoser/seconds``, TRL's ``grpo/step_time``), and the run directory inside paths and the stored recipe (the two
runs live in different directories), and a recipe field that only one store has, at seal-lite's default: a field
added since the other run, which changes nothing (listed, not counted). Run both with ``--set diagnoser.timeout_s=600``, so that a slow machine
cannot turn a diagnoser answer into a timeout.
"""

import argparse
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from seal_lite.core.recipe import Recipe  # noqa: E402  (the checkout's seal_lite, not an installed one)

TIME_NAMES = ("seconds", "step_time")


def is_timing(name: str) -> bool:
    """A column or metric (its last part) that holds a wall-clock time or a duration."""
    name = name.rsplit("/", 1)[-1]
    return name.endswith(("_at", "_s")) or name in TIME_NAMES


def table_rows(path: Path, table: str) -> dict[tuple, dict]:
    """The table's rows by primary key (timings dropped, the run directory written as <run>)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    keys = [row["name"] for row in connection.execute(f"pragma table_info([{table}])") if row["pk"]] or ["rowid"]
    rows = [dict(row) for row in connection.execute(f"select rowid, * from [{table}] order by rowid")]
    connection.close()
    run_dir = str(path.parent)
    kept = {}
    for row in rows:
        if table == "metrics" and (row["name"].startswith("time/") or is_timing(row["name"])):
            continue
        key = tuple(row[name] for name in keys)
        row = {name: value for name, value in row.items() if not is_timing(name) and name != "rowid"}
        for name, value in row.items():
            if isinstance(value, str) and run_dir in value:
                row[name] = value.replace(run_dir, "<run>")
        if table == "runs":
            recipe = json.loads(row["recipe"])
            recipe.pop("output_dir", None)
            row["recipe"] = recipe
        kept[key] = row
    return kept


def tables(path: Path) -> list[str]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = [row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")]
    connection.close()
    return sorted(name for name in names if not name.startswith("sqlite_"))


def flat(recipe: dict) -> dict:
    """A recipe as {"section.field": value}, a top-level field as itself; a field's value is kept whole, a mapping
    (grpo.utilities) included."""
    out = {}
    for key, value in recipe.items():
        if isinstance(value, dict):
            out.update((f"{key}.{field}", field_value) for field, field_value in value.items())
        else:
            out[key] = value
    return out


def new_default_fields(old: dict, new: dict) -> list[str]:
    """Recipe fields that one recipe has and the other lacks, at seal-lite's default; removed from both."""
    default = flat(Recipe().model_dump())
    found = []
    for recipe, other in ((old, new), (new, old)):
        fields, others = flat(recipe), flat(other)
        for name in sorted(fields.keys() - others.keys()):
            section, _, field = name.rpartition(".")
            if name in default and fields[name] == default[name]:
                (recipe[section] if section else recipe).pop(field)
                found.append(f"{name} = {fields[name]!r}")
    return found


def differences(before: Path, after: Path, notes: list[str] | None = None) -> list[str]:
    found = []
    for table in sorted(set(tables(before)) | set(tables(after))):
        if table not in tables(before) or table not in tables(after):
            found.append(f"{table}: only in {'after' if table in tables(after) else 'before'}")
            continue
        old, new = table_rows(before, table), table_rows(after, table)
        if table == "runs":
            for key in old.keys() & new.keys():
                added = new_default_fields(old[key]["recipe"], new[key]["recipe"])
                if notes is not None:
                    notes += [f"runs: recipe field {field}, in one store only, at its default" for field in added]
        if old.keys() != new.keys():
            found.append(f"{table}: {len(old.keys() - new.keys())} rows only before, {len(new.keys() - old.keys())} "
                         "only after")
        for key in sorted(old.keys() & new.keys(), key=str):
            if old[key] != new[key]:
                names = sorted(name for name in old[key].keys() | new[key].keys()
                               if old[key].get(name) != new[key].get(name))
                found.append(f"{table}: row {key} differs in {', '.join(names)}")
                break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    notes: list[str] = []
    found = differences(args.before, args.after, notes)
    for line in found:
        print(line)
    counted = {table: len(table_rows(args.before, table)) for table in tables(args.before)}
    print("identical" if not found else f"{len(found)} difference(s)", "-",
          ", ".join(f"{table} {n}" for table, n in counted.items()))
    for line in notes:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
