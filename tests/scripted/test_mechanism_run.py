"""The mechanism test's parts end to end at toy size (scripts/mechanism_test.py): a vanilla run whose checkpoints are
the states, each state's probe gradients and batches updated three ways, the first-order check against a real
update, and the analysis from the records; the parts resume from their records. A tiny random policy that answers
half its messages with the ground truth stands in for Qwen2.5-Coder-0.5B."""

import json
import math

import pytest

from seal_lite.engines.transformers_generate import TransformersGenerator
from seal_lite.envs.bfcl import load_tasks, split_ids
from tests.helpers import answer_with_ground_truth, load_script

mechanism = load_script("mechanism_test")
SETS = {"probe": ["multi_turn_base_100", "multi_turn_base_101"], "abstain": ["multi_turn_miss_param_11"],
        "pool": ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2", "multi_turn_base_3"]}


@pytest.fixture
def design(tmp_path, tiny_model_dir, monkeypatch):
    tasks = load_tasks([task_id for ids in SETS.values() for task_id in ids])
    answer_with_ground_truth(monkeypatch, tasks, lambda row: row % 2 == 0, others_play=True)  # a screen's tasks too
    sets = tmp_path / "sets"
    sets.mkdir()
    for name, ids in SETS.items():
        (sets / f"{name}.txt").write_text("\n".join(ids) + "\n")
    return mechanism.Design(
        overrides={"policy.model": tiny_model_dir, "policy.dtype": "float32", "rollout.backend": "transformers",
                   "rollout.max_new_tokens": 8, "rollout.max_model_calls": 1, "grpo.mini_batches": 1,
                   "grpo.dynamic_sampling": None, "grpo.learning_rate": 1e-2},
        work=tmp_path / "work", records=tmp_path / "records", sets=sets, state_steps=(2,), batches=2,
        batch_tasks=2, group=2, checked=1, learning_rate=1e-2)


def test_the_parts_record_every_figure_and_resume(design, capsys):
    states = mechanism.vanilla_states(design)
    assert set(states["states"]) == {"1"} and len(states["rewards"]) == 2  # state 1: the checkpoint after step 2
    for state in (0, 1):
        mechanism.measure_state(design, state)
    records = sorted(path.name for path in design.records.glob("*.json"))
    assert records == ["batch-state0-0.json", "batch-state0-1.json", "batch-state1-0.json", "batch-state1-1.json",
                       "probes-state0.json", "probes-state1.json", "states.json"]
    probes = [json.loads((design.records / f"probes-state{s}.json").read_text()) for s in (0, 1)]
    assert [p["adam_step"] for p in probes] == [0, 2] and probes[0]["values"] != probes[1]["values"]
    batch = json.loads((design.records / "batch-state1-0.json").read_text())
    assert len(batch["tasks"]) == 2 and [len(r) for r in batch["rewards"]] == [2, 2]
    assert set(batch["delta"]) == {"vanilla", "seal", "seal_base"} and "check" in batch
    assert all(isinstance(v, float) for arm in batch["delta"].values() for v in arm.values())
    assert not mechanism.twinned_probes(load_tasks(SETS["probe"]), load_tasks(SETS["pool"]))  # so J1u is J1 here
    assert all(arm["J1u"] == pytest.approx(arm["J1"]) for arm in batch["delta"].values())
    assert "check" not in json.loads((design.records / "batch-state1-1.json").read_text())  # only the first

    figures = mechanism.result(design.records)
    assert figures["batches"] == 4 and figures["states"] == [0, 1] and figures["check"]["pairs"] == 4
    assert math.isfinite(figures["R"]) and figures["R_interval"][0] <= figures["R"] <= figures["R_interval"][1]
    assert 0 < figures["sign_flip_p"] <= 1 and isinstance(figures["stop"], bool)
    assert isinstance(figures["first_order_reliable"], bool) and "R_real" in figures

    before = {path.name: path.stat().st_mtime_ns for path in design.records.glob("*.json")}
    mechanism.measure_state(design, 1)  # resumes: its batches are recorded, so nothing is played or taken again
    assert {path.name: path.stat().st_mtime_ns for path in design.records.glob("*.json")} == before
    (design.records / "batch-state1-1.json").unlink()
    mechanism.measure_state(design, 1)  # one batch missing: the state's probes again, then that batch alone
    assert (design.records / "batch-state1-1.json").exists()
    assert (design.records / "batch-state1-0.json").stat().st_mtime_ns == before["batch-state1-0.json"]


def test_the_schema_check_plays_each_task_both_ways_in_both_views(design):
    record = mechanism.schema_check(design, samples=2, official_tasks=1)
    assert set(record["views"]) == {"signatures", "official"}
    signatures, official = record["views"]["signatures"], record["views"]["official"]
    assert set(signatures["off"]["passes"]) == set(SETS["pool"]) and len(official["on"]["passes"]) == 1
    # the scripted policy answers the first of each pair right whatever the prompt: the cue changes nothing here
    assert all(passes == 1 for arm in ("off", "on") for passes in signatures[arm]["passes"].values())
    assert signatures["mean_difference"] == 0 and signatures["sign_flip_p"] == 1.0
    assert json.loads((design.records / "schema.json").read_text())["views"] == record["views"]


def test_a_screen_is_recorded_as_it_goes_and_resumes_from_its_records_alone(design, monkeypatch):
    design.screen_tasks = 3
    mechanism.screen(design, "probe")
    record = json.loads((design.records / "screen-probe.json").read_text())
    assert record["split"] == "eval" and record["samples"] == 6 and len(record["tasks"]) == 3
    assert all(row["samples"] == 6 and 0 <= row["passes"] <= 6 for row in record["tasks"].values())

    import shutil

    shutil.rmtree(design.work / "probe-screen")  # a machine that kept nothing of runs/
    played = []
    monkeypatch.setattr(TransformersGenerator, "generate", lambda self, batch, *args: played.append(batch) or [])
    rates = mechanism.screen(design, "probe")
    assert not played and json.loads((design.records / "screen-probe.json").read_text()) == record
    assert rates == {task_id: row["passes"] / 6 for task_id, row in record["tasks"].items()}


def test_the_sets_come_from_the_screens_records(design):
    for name, split in (("probe", "eval"), ("pool", "train")):
        rows = {task_id: {"samples": 6, "passes": passes, "seconds": 1.0}
                for task_id, passes in zip(split_ids(split)[:4], (3, 0, 6, 1))}
        mechanism.write_record(design, f"screen-{name}.json", {"split": split, "samples": 6, "tasks": rows})
    chosen = mechanism.choose_sets(design)
    assert chosen["probe"]["screened"] == 4 and len(chosen["probe"]["tasks"]) == 2  # 3/6 and 1/6 are in range
    assert chosen["abstain"]["tasks"] and all("miss_param" in task_id for task_id in chosen["abstain"]["tasks"])
    assert design.read_set("pool") == chosen["pool"]["tasks"] and design.read_set("probe") == chosen["probe"]["tasks"]
