"""The run report: figures, interface timeline, evaluation table and trajectories from a real run's store,
rendered by headless Chromium where it is installed (scripts/setup.sh installs it when it can)."""

import base64
import gzip
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.html_report import moving_average, signal_shares, write_report
from seal_lite.runs.evaluate_bfcl import evaluate, result_rows
from seal_lite.runs.train import run
from tests.helpers import ScriptedGenerator, tool_call_text


@pytest.fixture(scope="module")
def reported_run(tmp_path_factory, tiny_model_dir, smol_tokenizer):
    """Two real SEAL steps (tiny random policy), plus stored evaluations of two models, then the report."""
    run_dir = tmp_path_factory.mktemp("run")
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "policy.model": tiny_model_dir, "policy.dtype": "float32", "diagnoser.mode": "off",
        "data.task_ids": ["multi_turn_base_0", "multi_turn_base_1"], "grpo.tasks_per_step": 1, "grpo.steps": 2,
        "rollout.num_generations": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 8,
        "rollout.max_model_calls": 2,
    })
    run(recipe, run_dir)
    store = Store(run_dir / "seal.db")
    task = load_tasks(["multi_turn_base_1"])[0].truncated(1)
    for label, script in (("base", ["No."]), ("step 2", [tool_call_text(task.ground_truth[0]), "Done."])):
        results = evaluate([task], ScriptedGenerator(smol_tokenizer, [script]), recipe.rollout)
        store.save_evaluations(result_rows(label, "multi_turn_base_1", results))
    # a diagnoser answer linked to one turn, as the in-process diagnoser stores it (tests/real/test_diagnoser.py)
    store.db["diagnoses"].insert({"key": "k1", "model": "smollm2", "status": "ok", "label": "empty_turn_model_response",
                                  "explanation": "The model answered in prose.", "recovery_hint": "Call cd first."})
    store.db.execute("update turns set diagnosis_key = 'k1' where trajectory_id like 's2-%' and turn_index = 0")
    store.db.conn.commit()
    return run_dir, store, write_report(run_dir)


def test_report_holds_every_part_from_the_store(reported_run):
    run_dir, store, page = reported_run
    text = page.read_text()
    images = re.findall(r"src='data:image/png;base64,([^']+)'", text)
    assert len(images) == 4 and all(base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n" for data in images)
    for name in ("reward", "labels", "rho", "weights"):
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 1000
    versions = store.interface_versions()
    assert len(re.findall(r"<h3>v\d+ \(after step", text)) == len(versions)
    # the evaluation table puts both models side by side: base failed the task, step 2 passed it
    table = text[text.index("class='evaluation'"):]
    assert "<th>base</th><th>step 2</th>" in table
    assert "<td>0.0 (0.0), n=1</td><td>100.0 (100.0), n=1</td>" in table
    # sample trajectories from the last step, one table row per stored turn
    shown = re.findall(r"<h3>(s2-[^:]+):", text)
    assert shown and all(tid.startswith("s2-") for tid in shown)
    assert text.count("<tr class='turn'>") == sum(len(store.turns(tid)) for tid in shown)
    assert "The model answered in prose. Call cd first." in text  # the local diagnoser's explanation and hint
    assert "Reward trend" not in text  # 2 steps: too few to test a trend


def test_from_four_steps_the_reward_caption_carries_the_trend_test(reported_run, tmp_path):
    """The same store with steps 3 and 4 added (copies of step 2 with other rewards): the caption's τ and p are
    the trend test's on the stored per-step rewards."""
    from seal_lite.core.trend import reward_trend

    run_dir, _, _ = reported_run
    copy = tmp_path / "run"
    copy.mkdir()
    with sqlite3.connect(run_dir / "seal.db") as source, sqlite3.connect(copy / "seal.db") as target:
        source.backup(target)  # the write-ahead log too, which a copy of the file would miss
    store = Store(copy / "seal.db")
    for step, reward in ((3, 0.75), (4, 1.0)):
        row = {**next(store.db["steps"].rows_where("step = 2")), "step": step, "reward_mean": reward}
        store.db["steps"].insert(row)
        store.db["metrics"].insert({"step": step, "name": "reward/mean", "value": reward})
    rewards = [value for _, value in store.metrics("reward/mean")]
    assert len(rewards) == 4
    assert f"Reward trend: {reward_trend(rewards).describe()}" in write_report(copy).read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (scripts/setup.sh installs "
                    "it as root with apt)")
def test_headless_chromium_shows_all_four_figures(reported_run):
    _, _, page = reported_run
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=900, check=True).stdout
    assert 'data-figures-shown="4"' in dom


def test_signal_shares_and_the_moving_average(tmp_path):
    store = Store(tmp_path / "seal.db")
    rows = [(1, "a", 1.0), (1, "a", 0.0), (1, "b", 0.0), (1, "b", 0.0), (2, "a", 1.0), (2, "a", 1.0)]
    store.db["trajectories"].insert_all([{"id": f"{i}", "step": step, "task_id": task, "reward": reward}
                                         for i, (step, task, reward) in enumerate(rows)])
    assert signal_shares(store) == {1: 0.5, 2: 0.0}  # step 1: a's group is mixed, b's is not
    # dynamic sampling stores only the groups it kept: the drawn groups' share, recorded by the loop, wins
    store.db["metrics"].insert({"step": 2, "name": "sampling/drawn_groups_with_signal", "value": 0.25}, alter=True)
    assert signal_shares(store) == {1: 0.5, 2: 0.25}
    assert moving_average([0.0, 1.0, 0.5, 0.5], 2) == [0.0, 0.5, 0.75, 0.5]


def test_the_report_renders_a_store_from_before_the_migrations_without_changing_it(tmp_path):
    """tests/data/seal_v1.db.gz: a real two-step run's store as the code before the migrations wrote it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store_v1 = Path(__file__).resolve().parent.parent / "data" / "seal_v1.db.gz"
    (run_dir / "seal.db").write_bytes(gzip.decompress(store_v1.read_bytes()))
    content = (run_dir / "seal.db").read_bytes()
    text = write_report(run_dir).read_text()
    assert len(re.findall(r"src='data:image/png;base64,", text)) == 4 and "seal-lite run quickstart" in text
    assert len(re.findall(r"<h3>v\d+ \(after step", text)) == 2 and "No BFCL evaluation yet" in text
    assert text.count("<tr class='turn'>") >= 4 and re.findall(r"<h3>(s2-[^:]+):", text)
    assert (run_dir / "seal.db").read_bytes() == content  # read as it is: neither upgraded nor touched


def test_the_model_card_beside_the_adapter_says_how_it_was_trained(reported_run):
    """`seal-lite report` replaces peft's template README.md in RUN/adapter with the run's card: hub metadata,
    the SEAL parts, the rewards, the held-out results with their intervals, the last interface, and the recipe."""
    import json

    import yaml
    from click.testing import CliRunner

    from seal_lite.cli import main
    from seal_lite.runs.model_card import hub_id, wilson_interval

    run_dir, store, _ = reported_run
    shown = CliRunner().invoke(main, ["report", str(run_dir)])
    assert shown.exit_code == 0 and f"model card: {run_dir / 'adapter' / 'README.md'}" in shown.output
    card = (run_dir / "adapter" / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    metadata = yaml.safe_load(front)
    assert metadata["library_name"] == "peft" and "base_model" not in metadata  # a local test model: no hub id
    assert "seal-lite" in metadata["tags"]
    rewards = " ".join(f"{row['reward_mean']:.2f}" for row in store.steps())
    assert f"averaged over the groups the step drew: {rewards}." in body
    assert "| φ_schema (schema cues) | on |" in body and "| closed-loop ρ | on |" in body
    low, high = wilson_interval(1, 1)
    assert f"| step 2 | base | 1 | 100.0% [{100 * low:.1f}, {100 * high:.1f}] |" in body
    assert "| base | base | 1 | 0.0% [0.0, " in body
    assert "phi_cap (capability guidelines): on" in body  # the last interface version, described
    recipe = yaml.safe_load(body.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert recipe == json.loads(store.run()["recipe"])
    assert hub_id("qwen2.5-coder-0.5b") == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and hub_id("Qwen/Qwen2.5-7B") == \
        "Qwen/Qwen2.5-7B" and hub_id(str(run_dir)) is None
    assert wilson_interval(0, 16)[0] == 0.0 and 0.15 < wilson_interval(0, 16)[1] < 0.25
