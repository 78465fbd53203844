"""scripts/gpu_check.sh --tiny: every check of the GPU script runs its real code on 2-layer models on the CPU
(Unsloth, which needs a GPU, is reported as skipped), one JSON line each."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_tiny_runs_every_check_and_prints_one_json_line_each():
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--tiny"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200, check=False)  # a failed check must show its JSON line
    rows = {row["check"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert list(rows) == ["doctor", "steps-unsloth", "steps-peft-4bit", "gpu_memory"], done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]

    doctor = rows["doctor"]
    assert doctor["ok"] and doctor["self_test"]["message"] == "ok"
    assert doctor["self_test"]["linear4bit_layers"] == 2 * 7 and doctor["self_test"]["trainable_dtypes"] == ["float32"]
    if not torch.cuda.is_available():
        assert rows["steps-unsloth"] == {"check": "steps-unsloth", "ok": None, "skipped": "no GPU: Unsloth needs one"}

    steps = rows["steps-peft-4bit"]
    assert steps["ok"] and steps["backend"] == "peft-4bit" and steps["linear4bit_layers"] == 2 * 7
    assert steps["seal_steps"] == 2 and steps["optimizer_steps"] == 4 and len(steps["optimizer_step_s"]) == 4
    assert steps["lora_changed"] > 0 and steps["trainable_dtypes"] == ["float32"] and not steps["pad_is_stop"]

    memory = rows["gpu_memory"]
    assert memory["ok"] and memory["backend"] == "peft-4bit" and memory["micro_batch"] == 1 and memory["updates"] == 4
