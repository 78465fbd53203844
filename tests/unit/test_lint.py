"""The repository passes ruff with the rules in pyproject.toml ([tool.ruff]): lint errors fail the test command."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test install: pip install -e '.[test]'"
    result = subprocess.run([ruff, "check", "--output-format", "concise", "seal_lite", "tests", "benchmarks",
                             "scripts"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
