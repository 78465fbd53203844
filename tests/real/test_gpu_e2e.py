"""scripts/gpu_e2e.sh --cpu: every part of the GPU end-to-end script runs its real code on the CPU (peft and a 2-layer
random model instead of Unsloth and Qwen2.5-1.5B's widths; colab-t4's NF4 in fp16 as it is), each part leaving its
JSON file as it ends."""

import json
import os
import subprocess
import sys
from pathlib import Path

from seal_lite.core.recipe import load_recipe
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def gpu_e2e(out: Path, *arguments: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHON": sys.executable, "OUT": str(out)}
    return subprocess.run(["bash", "scripts/gpu_e2e.sh", "--cpu", *arguments], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, check=False)  # a failed part must show its JSON line


def test_gpu_e2e_cpu_mode_runs_every_part_and_leaves_one_json_file_each(tmp_path):
    done = gpu_e2e(tmp_path)
    rows = {row["part"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert list(rows) == ["run_resume", "eval_base", "engine_logprobs", "paged_fp16"], done.stdout + done.stderr
    assert done.returncode == 0, done.stdout
    for part, row in rows.items():  # each file as the part left it, naming what stands in for a user's parts
        assert json.loads((tmp_path / f"{part}.json").read_text()) == row
        assert row["ok"] is True and row["cpu"] is True and "diagnoser" in row["stand_ins"]

    run = rows["run_resume"]  # killed after step 1's checkpoint, resumed from it, every step stored once
    assert run["killed_after_step"] == 1 and run["resumed_line"] == "Resuming after step 1"
    assert run["steps_stored"] == [1, 2, 3] and run["status"] == "finished" and len(run["checkpoint_dirs"]) == 1
    assert run["steps_lora_moved"] == run["steps_with_signal"] != [] and run["diagnoses"] > 0
    assert run["validation_steps"] == [0, 1, 2, 3] and run["best_adapter"] and run["staged_adapters_left"] == []
    assert rows["eval_base"]["evaluations"] == {"base": 4, "step 3": 4}
    engine = rows["engine_logprobs"]
    for branch in ("off_policy", "on_policy"):  # fp32 on the CPU: generation and training score alike
        assert engine[branch]["gap_mean"] and all(gap < 1e-3 for gap in engine[branch]["gap_mean"].values())
        assert len(engine[branch]["context_lengths"]) > 1 and all(engine[branch]["lora_change"].values())
    paged = rows["paged_fp16"]  # colab-t4's step: NF4 in fp16 played by the paged engine, then the update
    assert paged["checks"] and all(paged["checks"].values()), paged
    assert paged["policy_in_play"] == {"dtype": "float16", "nf4": True} and paged["attention_in_play"] == ["paged|sdpa"]
    assert paged["releases"] == [{"ran": True}] and paged["update_skipped"] == 0 and paged["lora_change"] > 0
    assert paged["engine_gap_mean"] < 1e-3 and paged["update_s"] > 0 and "verdict" in paged["stand_ins"]
    # fp16's GradScaler ran (the one accelerate makes on a GPU) and skipped no optimizer step
    assert paged["grad_scaler"]["steps_in_a_row"] == paged["optimizer_steps"] > 0


def test_a_part_that_fails_leaves_its_reason_and_the_next_part_still_runs(tmp_path):
    """eval_base needs run_resume's run: alone, it fails with its reason in its file; paged_fp16 still passes."""
    done = gpu_e2e(tmp_path, "--parts", "eval_base,paged_fp16")
    assert done.returncode == 1
    evaluation = json.loads((tmp_path / "eval_base.json").read_text())
    assert evaluation["ok"] is False and evaluation["error"] == "no run to evaluate: run_resume did not leave one"
    assert json.loads((tmp_path / "paged_fp16.json").read_text())["ok"] is True


def test_on_a_gpu_engine_logprobs_trains_on_unsloth_and_run_resume_on_the_gpu_recipes_backend(tmp_path):
    """engine_logprobs imports Unsloth, whose patched trainer takes no other backend, so its recipe names unsloth on
    a GPU; run_resume's names peft-4bit, the GPU recipes' own; on a CPU peft stands in for both. (The recipes only:
    the model folder is there already, so nothing is built or loaded.)"""
    gpu_e2e_module = load_script("gpu_e2e")
    (tmp_path / "model-qwen2-1.5b").mkdir()
    (tmp_path / "model-qwen2-1.5b" / "config.json").write_text("{}")

    def backend(part: str, cpu: bool) -> str:
        context = gpu_e2e_module.Context(tmp_path, tmp_path, part, cpu)
        return load_recipe(context.recipe_file("http://127.0.0.1:1")).policy.backend

    assert backend("engine_logprobs", cpu=False) == "unsloth"
    assert backend("run_resume", cpu=False) == "peft-4bit"
    assert backend("engine_logprobs", cpu=True) == backend("run_resume", cpu=True) == "peft"


def test_the_update_benchmarks_compare_the_ways_on_one_batch(tmp_path):
    """--parts update_prefix,update_unsloth: the same group of 8 paper-shaped trajectories updated one pass per
    trajectory and with its prompt computed once; the gradients agree (fp32 here) and the shared prefix really ran,
    reading the opening once. Then the Unsloth part (peft stands in on a CPU) is timed against both and its
    gradients compared with the shared prefix's."""
    done = gpu_e2e(tmp_path, "--parts", "update_prefix,update_unsloth")
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads((tmp_path / "update_prefix.json").read_text())
    assert row["shared_prefix"]["shared_prefix"] and not row["per_trajectory"]["shared_prefix"]
    assert row["shared_prefix"]["prompt_tokens"] > 4000 and row["gradient_norm"] > 0
    assert row["relative_gradient_difference"] <= 1e-3 and row["speedup"] > 0
    assert row["read_ratio"] > 3  # the opening once a group: a 5k-token opening against completions of a few hundred
    unsloth = json.loads((tmp_path / "update_unsloth.json").read_text())
    assert unsloth["ok"] and unsloth["unsloth"]["backend"] == "peft" and not unsloth["unsloth"]["shared_prefix"]
    assert unsloth["unsloth"]["read_tokens"] == row["per_trajectory"]["read_tokens"]
    assert unsloth["unsloth_over_shared_prefix"] > 0 and unsloth["unsloth_over_per_trajectory"] > 0
    assert unsloth["gradients_compared"].split(" of ")[0] == unsloth["gradients_compared"].split(" of ")[1] != "0"
    assert unsloth["relative_gradient_difference"] <= 1e-3


def test_the_rollout_benchmark_plays_the_same_episodes_with_both_engines(tmp_path):
    """--parts rollout_engines: G = 8 greedy episodes of a real task's 5k-token opening, played by chunked generate
    and by the paged engine on the same policy: the same tokens, and the paged engine reads the opening once."""
    done = gpu_e2e(tmp_path, "--parts", "rollout_engines")
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads((tmp_path / "rollout_engines.json").read_text())
    assert row["same_episodes"] and row["paged"]["generated"] == row["generate"]["generated"] > 0
    assert row["generate"]["read"] > 8 * 4000 and row["read_ratio"] > 4 and row["speedup"] > 0
