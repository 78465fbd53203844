"""The interface test's parts end to end at toy size (scripts/interface_test.py): Part A's 2x2 plays and J4's failed
first messages, state 1 regenerated from the mechanism test's recipe, and Part B's paired batches read on the probes
without any interface, each resumable from its records. A tiny random policy that answers half its messages with
the ground truth stands in for Qwen2.5-Coder-0.5B, so the rewards mix and the updates are not zero."""

import json

import pytest

from seal_lite.envs.bfcl import load_tasks
from tests.helpers import answer_with_ground_truth, load_script

interface_test = load_script("interface_test")
SETS = {"probe": ["multi_turn_base_100", "multi_turn_base_101"], "abstain": ["multi_turn_miss_param_11"],
        "pool": ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_2"]}


@pytest.fixture
def design(tmp_path, tiny_model_dir, monkeypatch):
    tasks = load_tasks([task_id for ids in SETS.values() for task_id in ids])
    answer_with_ground_truth(monkeypatch, tasks, lambda row: row % 2 == 0, others_play=True)
    sets = tmp_path / "sets"
    sets.mkdir()
    for name, ids in SETS.items():
        (sets / f"{name}.txt").write_text("\n".join(ids) + "\n")
    return interface_test.Design(
        overrides={"policy.model": tiny_model_dir, "policy.dtype": "float32", "rollout.backend": "transformers",
                   "rollout.max_new_tokens": 8, "rollout.max_model_calls": 1, "grpo.mini_batches": 1,
                   "grpo.dynamic_sampling": None, "grpo.learning_rate": 1e-2},
        records=tmp_path / "records", sets=sets, work=tmp_path / "work", samples=2, j4_samples=1, state_step=2,
        batches=2, batch_tasks=2, group=2)


def test_part_a_records_every_arm_and_resumes(design, capsys):
    interface_test.part_a(design)
    arms = interface_test.read_arms(design.records / "part-a")
    assert set(arms) == set(interface_test.ARMS)
    assert all(set(record["tasks"]) == set(SETS["pool"]) for record in arms.values())
    assert "Behavioral guidelines" in arms["cap"]["system_prompt"] and "Behavioral" not in arms["plain"]["system_prompt"]
    assert (design.records / "j4-messages.json").exists()
    before = {arm: (design.records / "part-a" / f"{arm}.json").read_text() for arm in arms}
    interface_test.part_a(design)  # everything recorded: nothing is played again
    assert {arm: (design.records / "part-a" / f"{arm}.json").read_text() for arm in arms} == before


def test_part_b_reads_each_arms_update_on_the_plain_probes_and_resumes(design, capsys):
    (design.records).mkdir(parents=True)
    message = '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'  # an unknown tool
    (design.records / "j4-messages.json").write_text(json.dumps({"messages": {
        "multi_turn_base_100": {"message": message, "statuses": ["unknown_tool"], "sample": 0}}, "count": 1}))
    # the toy policy cannot repeat the real run's rewards: the check refuses to go on, and says so in the record
    with pytest.raises(SystemExit, match="did not repeat the mechanism test's"):
        interface_test.states(design)
    record = json.loads((design.records / "states.json").read_text())
    assert set(record["states"]) == {"1"} and record["repeats_mechanism_run"] is False
    interface_test.part_b(design)
    batches = interface_test.part_b_batches(design)
    assert batches is not None and [len(rows) for rows in batches.values()] == [2, 2]
    for state, rows in batches.items():
        for row in rows:
            assert row["seed"] == 1000 * state + 500 + row["batch"]
            for arm in ("plain", "interface"):
                assert set(row["arms"][arm]["delta"]) == set(interface_test.OBJECTIVES)
                assert ("delta_adam" in row["arms"][arm]) == (state == 1)
            assert -1.0 <= row["cosine"] <= 1.0
    probes = json.loads((design.records / "probes-state1.json").read_text())
    assert probes["j4_probes"] == 1 and probes["adam_step"] == 2
    assert "Behavioral guidelines" in probes["system_prompts"]["interface"]
    stamp = (design.records / "batch-state0-1.json").stat().st_mtime_ns
    interface_test.part_b(design)  # recorded: nothing is loaded or played again
    assert (design.records / "batch-state0-1.json").stat().st_mtime_ns == stamp
    interface_test.summary(design)
    assert "Part B primary" in capsys.readouterr().out
