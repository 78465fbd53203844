"""Compare two runs' stores row by row, wall-clock columns and timings excepted; exit 1 on any difference.

Used to show that a refactor left behaviour unchanged: run the same seeded recipe before and after it, then

    python scripts/compare_stores.py runs/before/seal.db runs/after/seal.db

Ignored: columns that hold a time (``*_at``, ``*_s``, ``seconds``), the ``time/*`` and ``*_s`` metrics, and the
run directory inside paths and the stored recipe (the two runs live in different directories).
"""

import argparse
import json
import sqlite3
import sys
from pathlib import Path

TIME_COLUMNS = ("seconds",)


def is_timing(column: str) -> bool:
    return column.endswith(("_at", "_s")) or column in TIME_COLUMNS


def table_rows(path: Path, table: str) -> list[dict]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    rows = [dict(row) for row in connection.execute(f"select * from [{table}] order by rowid")]
    connection.close()
    run_dir = str(path.parent)
    kept = []
    for row in rows:
        if table == "metrics" and (row["name"].startswith("time/") or row["name"].endswith("_s")):
            continue
        row = {key: value for key, value in row.items() if not is_timing(key)}
        for key, value in row.items():
            if isinstance(value, str) and run_dir in value:
                row[key] = value.replace(run_dir, "<run>")
        if table == "runs":
            recipe = json.loads(row["recipe"])
            recipe.pop("output_dir", None)
            row["recipe"] = recipe
        kept.append(row)
    return sorted(kept, key=lambda row: json.dumps(row, sort_keys=True, default=str))


def tables(path: Path) -> list[str]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = [row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")]
    connection.close()
    return sorted(name for name in names if not name.startswith("sqlite_"))


def differences(before: Path, after: Path) -> list[str]:
    found = []
    for table in sorted(set(tables(before)) | set(tables(after))):
        if table not in tables(before) or table not in tables(after):
            found.append(f"{table}: only in {'after' if table in tables(after) else 'before'}")
            continue
        old, new = table_rows(before, table), table_rows(after, table)
        if len(old) != len(new):
            found.append(f"{table}: {len(old)} rows before, {len(new)} after")
        for old_row, new_row in zip(old, new):
            if old_row != new_row:
                keys = sorted(key for key in old_row.keys() | new_row.keys() if old_row.get(key) != new_row.get(key))
                found.append(f"{table}: first differing row differs in {', '.join(keys)}")
                break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    found = differences(args.before, args.after)
    for line in found:
        print(line)
    counted = {table: len(table_rows(args.before, table)) for table in tables(args.before)}
    print("identical" if not found else f"{len(found)} difference(s)", "-",
          ", ".join(f"{table} {n}" for table, n in counted.items()))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
