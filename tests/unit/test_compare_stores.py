"""scripts/compare_stores.py, the check that a refactor left a seeded run's store unchanged: timings and the run
directory may differ, anything else is a difference. Tested on a real store (tests/data/seal_v1.db.gz)."""

import gzip
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def a_copy_of_the_real_store(directory: Path) -> Path:
    directory.mkdir()
    path = directory / "seal.db"
    with gzip.open(ROOT / "tests" / "data" / "seal_v1.db.gz") as packed, open(path, "wb") as unpacked:
        shutil.copyfileobj(packed, unpacked)
    return path


def compare(before: Path, after: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_stores.py"), str(before), str(after)],
                          capture_output=True, text=True)


def change(path: Path, sql: str) -> None:
    with sqlite3.connect(path) as db:
        assert db.execute(sql).rowcount > 0


def test_timings_and_the_run_directory_are_not_differences(tmp_path):
    before, after = a_copy_of_the_real_store(tmp_path / "a"), a_copy_of_the_real_store(tmp_path / "b")
    change(after, "update steps set started_at = started_at + 60")
    change(after, "update metrics set value = value * 2 where name in ('time/rollout_s', 'diagnoser/seconds')")
    change(after, "update diagnoses set seconds = seconds + 1")
    result = compare(before, after)
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("identical")


def test_a_changed_label_or_metric_is_a_difference(tmp_path):
    before = a_copy_of_the_real_store(tmp_path / "a")
    label = a_copy_of_the_real_store(tmp_path / "b")
    change(label, "update turns set label = 'pass' where rowid = (select min(rowid) from turns where label != 'pass')")
    result = compare(before, label)
    assert result.returncode == 1
    assert "differs in label" in result.stdout and result.stdout.startswith("turns: row")
    metric = a_copy_of_the_real_store(tmp_path / "c")
    change(metric, "update metrics set value = value + 1 where name = 'reward/mean'")
    assert "reward/mean') differs in value" in compare(before, metric).stdout


def test_a_recipe_field_added_at_its_default_is_listed_not_counted(tmp_path):
    """A run stored before a field existed (data.environment) compares equal to one that states its default; the
    same field at another value is a difference."""
    before, after = a_copy_of_the_real_store(tmp_path / "a"), a_copy_of_the_real_store(tmp_path / "b")
    change(before, "update runs set recipe = json_remove(recipe, '$.data.environment')")
    change(after, "update runs set recipe = json_set(recipe, '$.data.environment', 'bfcl')")
    result = compare(before, after)
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("identical") and "data.environment = 'bfcl'" in result.stdout
    other = a_copy_of_the_real_store(tmp_path / "c")
    change(other, "update runs set recipe = json_set(recipe, '$.data.environment', 'library')")
    assert compare(before, other).returncode == 1
