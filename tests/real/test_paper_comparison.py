"""scripts/paper_comparison.py's runner end to end on a CPU (``--cpu-smoke``: SmolLM2-135M, one step of one task a
run): both arms of one seed trained and evaluated, then the base model, each part recorded as it finishes; the
same command again redoes nothing, and a record lost after its evaluation is rebuilt from the stored results."""

import json
from pathlib import Path

import pytest

from seal_lite.engines.store import Store
from tests.helpers import load_script

ROOT = Path(__file__).parents[2]


def test_the_runner_trains_evaluates_records_and_resumes(tmp_path, monkeypatch):
    script = load_script("paper_comparison")
    out, records = tmp_path / "out", tmp_path / "records"
    command = ["--cpu-smoke", "--seeds", "1", "--out", str(out), "--records", str(records),
               "--eval-split", "multi_turn_base_1,multi_turn_miss_param_1"]
    script.main(command)

    vanilla, seal = (json.loads((records / f"{arm}-seed0.json").read_text()) for arm in ("vanilla", "seal"))
    for record, arm in ((vanilla, "vanilla"), (seal, "seal")):
        assert record["arm"] == arm and record["seed"] == 0 and record["recipe"] == script.ARMS[arm]
        assert len(record["training"]["rewards"]) == 1 and record["training"]["trajectories"] == [2]
        assert sorted(record["held_out"]) == ["multi_turn_base_1", "multi_turn_miss_param_1"]
        assert record["evaluated_on"]["view"] == "signatures" and record["eval_minutes"] > 0
    stored = {arm: json.loads(Store(out / f"{arm}-seed0" / "seal.db").run()["recipe"]) for arm in ("vanilla", "seal")}
    assert stored["vanilla"]["seed"] == stored["seal"]["seed"] == 0  # paired: the same seed in both arms
    assert stored["seal"]["interface"]["schema_cues"] and not stored["vanilla"]["interface"]["schema_cues"]
    assert stored["seal"]["grpo"]["closed_loop"] and not stored["vanilla"]["grpo"]["closed_loop"]
    base = json.loads((records / "base.json").read_text())
    assert base["model"] == "smollm2-135m" and sorted(base["held_out"]) == sorted(vanilla["held_out"])
    summary = json.loads((records / "summary.json").read_text())
    assert summary["seal_minus_vanilla"]["seeds"] == [0] and summary["seal_minus_vanilla"]["smallest_p"] == 1.0
    assert set(summary["arms"]) == {"vanilla", "seal", "base"}

    # again: everything is recorded, so nothing runs; a record that lost its evaluation takes it from OUT
    monkeypatch.setattr(script, "seal_lite", lambda *args: pytest.fail(f"ran seal-lite {args} again"))
    del seal["held_out"]
    (records / "seal-seed0.json").write_text(json.dumps(seal))
    script.main(command)
    again = json.loads((records / "seal-seed0.json").read_text())
    assert sorted(again["held_out"]) == ["multi_turn_base_1", "multi_turn_miss_param_1"]
    assert again["eval_minutes"] is None  # evaluated before, not timed now
