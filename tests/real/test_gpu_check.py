"""scripts/gpu_check.sh --tiny: every check of the GPU script runs its real code on 2-layer models on the CPU
(Unsloth, which needs a GPU, is reported as skipped). Each check leaves its JSON file in OUT as it ends, and the
script prints them together at the end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="--tiny on a GPU machine runs Unsloth too: other rows")
def test_gpu_check_tiny_runs_every_check_and_leaves_one_json_file_each(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "OUT": str(tmp_path)}
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--tiny"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1200, check=False)  # a failed check must show its JSON line
    rows = {row["check"]: row for row in map(json.loads, done.stdout.splitlines())}
    checks = ["steps", "parity", "parity_fp16", "adapter", "over_length", "memory", "timing", "fit_24gb", "vllm"]
    assert list(rows) == ["unsloth"] + [f"peft-4bit-{check}" for check in checks], done.stdout + done.stderr
    log = (tmp_path / "peft-4bit.log").read_text()
    assert done.returncode == 0, done.stdout + log[-3000:]
    for check in checks:  # each file as the check wrote it
        assert json.loads((tmp_path / f"peft-4bit-{check}.json").read_text()) == rows[f"peft-4bit-{check}"]
    assert rows["unsloth"] == {"check": "unsloth", "ok": None, "skipped": "no GPU: Unsloth needs one"}

    steps = rows["peft-4bit-steps"]
    assert steps["backend"] == "peft-4bit" and steps["linear4bit_layers"] == 2 * 7 and not steps["unsloth_trainer"]
    assert steps["lora_changed"] > 0 and steps["trainable_dtypes"] == ["float32"] and not steps["pad_is_stop"]
    parity = rows["peft-4bit-parity"]
    assert parity["relative_difference"] <= parity["tolerance"] and parity["environment_tokens"] > 0
    assert rows["peft-4bit-parity_fp16"]["skipped"] == "float16 training needs a GPU"
    assert rows["peft-4bit-adapter"]["lora_weights"] == rows["peft-4bit-adapter"]["trained_lora_weights"] == 2 * 7 * 2
    long = rows["peft-4bit-over_length"]
    assert long["padded_width"] > long["context"] and long["lora_changed"] > 0
    calls = rows["peft-4bit-memory"]["calls"]
    assert {call["model"] for call in calls} == {"tiny-a", "tiny-b"} and len(calls) >= 4
    assert all(0.8 <= call["model_over_measured"] <= 1.2 for call in calls), calls
    assert rows["peft-4bit-timing"]["decode_ms_per_step"] > 0
    fit = rows["peft-4bit-fit_24gb"]  # the recipe's rows per call (its budget over its context), 2,048 wide here
    assert fit["recipe"] == "gpu-24gb" and fit["rows"] == 2 and fit["width"] == 2032 and fit["call_gb"] > 0
    speeds = rows["peft-4bit-vllm"]  # vLLM's CPU build here: the check's code, not a GPU's figures
    assert speeds["vllm_tokens_per_s"] > 0 and speeds["generate_tokens_per_s"] > 0
    assert speeds["prompt_tokens_cached"] > 0  # the episodes of the group shared their prompt


def test_a_check_that_fails_leaves_its_file_and_the_next_check_still_runs(tmp_path):
    """The adapter check needs the steps check's adapter: run alone, it fails with its reason in its file, and the
    timing check after it still runs and passes."""
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--backend", "peft-4bit", "--checks",
                           "adapter,timing", "--tiny", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 1
    adapter = json.loads((tmp_path / "peft-4bit-adapter.json").read_text())
    assert adapter["ok"] is False and adapter["error"] == "the steps check did not train an adapter"
    assert json.loads((tmp_path / "peft-4bit-timing.json").read_text())["ok"] is True
