"""The SEAL loop on a user's own tools with the real parts: `seal-lite run` on the shipped library environment
(recipes/library.yaml), SmolLM2 playing in llama.cpp, then `seal-lite diagnose` on what it stored. The loop's logic
on this environment with scripted answers is tests/scripted/test_own_tools.py's."""

import json
from pathlib import Path

from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.engines.store import Store

RECIPE = Path(__file__).parents[2] / "recipes" / "library.yaml"


def test_a_real_step_on_the_library_stores_labels_with_causes(tmp_path):
    out = tmp_path / "run"
    settings = ["policy.model=smollm2-135m", "data.task_ids=[library_4]", "grpo.tasks_per_step=1", "grpo.steps=1",
                "rollout.num_generations=2", "rollout.max_turns=1", "rollout.max_model_calls=1",
                "rollout.max_new_tokens=32", "grpo.dynamic_sampling=null", "diagnoser.mode=off"]
    result = CliRunner().invoke(main, ["run", str(RECIPE), "--out", str(out),
                                       *[word for setting in settings for word in ("--set", setting)]])
    assert result.exit_code == 0, result.output
    store = Store(out / "seal.db")
    assert json.loads(store.run()["recipe"])["data"]["environment"] == "library"
    trajectories = store.trajectories()
    assert [row["task_id"] for row in trajectories] == ["library_4", "library_4"]
    for row in trajectories:
        turns = store.turns(row["id"])
        assert len(turns) == 1  # rollout.max_turns
        (turn,) = turns
        assert (turn["cause"] is None) == (turn["label"] in SUCCESS_LABELS)  # every failure has its cause
        assert row["reward"] == float(turn["label"] == "pass")
    shown = CliRunner().invoke(main, ["diagnose", str(out), "--trajectory", trajectories[0]["id"]])
    assert shown.exit_code == 0 and trajectories[0]["id"] in shown.output
