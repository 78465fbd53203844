"""A real ``seal-lite run`` keeps library noise in RUN/run.log, shows it with -v, and reports to a real tracker.

The runs are ``seal-lite`` processes with a tiny random policy, so each library starts fresh: bitsandbytes logs
"Failed to load CPU gemm_4bit_forward ..." at import on a CPU with AVX512_BF16 (checked where the CPU has it), and
TRL warns about its experimental ``rollout_func`` on every CPU when TRL_EXPERIMENTAL_SILENCE is 0. A tracker that
is not installed is one warning; Trackio's local database is read back and compared with the store."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from seal_lite.core import metrics as m
from seal_lite.engines.store import Store

TRL_WARNING = "You are using 'rollout_func', which is an experimental feature"
BNB_WARNING = "Failed to load CPU gemm_4bit_forward from kernels-community"


def bnb_warns_at_import() -> bool:
    """Whether bitsandbytes 0.50 logs BNB_WARNING here: on a CPU with AVX512_BF16, without the kernels package."""
    if importlib.util.find_spec("bitsandbytes") is None or importlib.util.find_spec("kernels") is not None:
        return False
    from bitsandbytes.functional import has_avx512bf16

    return has_avx512bf16()


@pytest.fixture
def recipe_file(tmp_path, tiny_model_dir):
    recipe = {
        "name": "quiet", "policy": {"model": tiny_model_dir, "dtype": "float32"},
        "data": {"task_ids": ["multi_turn_base_0", "multi_turn_base_1"]},
        "rollout": {"num_generations": 2, "max_new_tokens": 8, "max_model_calls": 1, "max_turns": 1},
        "interface": {"tool_format": "signatures"}, "diagnoser": {"mode": "off"},
        "grpo": {"steps": 1, "tasks_per_step": 1},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def seal_lite(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "seal_lite", *map(str, args)], capture_output=True, text=True,
                          timeout=1200, check=True, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "0", **env})


def test_library_noise_goes_to_the_run_log_and_verbose_shows_it(tmp_path, recipe_file):
    quiet = seal_lite("run", recipe_file, "--out", tmp_path / "quiet", "--set", "logging.report_to=wandb")
    terminal, log = quiet.stdout + quiet.stderr, (tmp_path / "quiet" / "run.log").read_text()
    assert "step 1/1" in terminal and "seal-lite run summary" in terminal  # the run's own lines
    assert TRL_WARNING not in terminal and TRL_WARNING in log
    if bnb_warns_at_import():
        assert BNB_WARNING not in terminal and BNB_WARNING in log
    if importlib.util.find_spec("wandb") is None:  # a tracker that is not installed: one warning, the store alone
        warning = ("logging.report_to = wandb: wandb is not installed (pip install wandb); this run's metrics stay "
                   "in its store (seal.db) alone")
        assert terminal.count(warning) == 1 and warning in log
        assert not (tmp_path / "quiet" / "wandb").exists()
    assert Store(tmp_path / "quiet" / "seal.db").run()["status"] == "finished"

    verbose = seal_lite("run", recipe_file, "--out", tmp_path / "verbose", "-v")
    assert TRL_WARNING in verbose.stderr and TRL_WARNING in (tmp_path / "verbose" / "run.log").read_text()
    if bnb_warns_at_import():
        assert BNB_WARNING in verbose.stderr


def test_trackio_local_database_holds_each_step_as_the_store_does(tmp_path, recipe_file):
    pytest.importorskip("trackio")
    out, trackio_dir = tmp_path / "tracked", tmp_path / "trackio"
    seal_lite("run", recipe_file, "--out", out, "--set", "logging.report_to=trackio", "--set", "grpo.steps=2",
              TRACKIO_DIR=str(trackio_dir))
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage; "
            f"print(json.dumps(SQLiteStorage.get_logs('seal-lite', {out.name!r})))")  # the rows its dashboard reads
    rows = json.loads(subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, check=True,
                                     env={**os.environ, "TRACKIO_DIR": str(trackio_dir)}).stdout)
    seal_rows = {row["train/global_step"]: row for row in rows if m.REWARD_MEAN.name in row}
    trainer_rows = {row["train/global_step"]: row for row in rows if "train/loss" in row}
    store = Store(out / "seal.db")
    assert sorted(seal_rows) == sorted(trainer_rows) == [1, 2]  # one optimizer step per SEAL step
    for step in (1, 2):
        metrics = {name: value for name, value in store.step_metrics(step).items() if m.describe(name) is not m.TRL_LOG}
        assert {name: seal_rows[step][name] for name in metrics} == pytest.approx(metrics)
        assert trainer_rows[step]["train/loss"] == pytest.approx(store.step_metrics(step)["grpo/loss"])


def test_the_gguf_conversion_bars_go_to_the_log(tmp_path, monkeypatch, capfd):
    from transformers.utils import logging as transformers_logging

    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.runs.run_log import library_output

    monkeypatch.setenv("SEAL_LITE_CACHE", str(tmp_path / "cache"))  # a newcomer's first run converts the GGUF
    # as in a first run, before any policy is loaded (load_policy turns transformers' bars off for the run)
    monkeypatch.setattr(transformers_logging, "_tqdm_active", True)
    with library_output(tmp_path / "run.log"):
        resolve_model("smollm2-135m")
    terminal = "".join(capfd.readouterr())
    assert "GGUF tensors" not in terminal and "%|" not in terminal
    bars = [line for line in (tmp_path / "run.log").read_text().splitlines() if "GGUF tensors" in line]
    assert len(bars) == 1 and "100%" in bars[0]  # the bar's last state, one line
