"""logging.report_to: tensorboard on a real run (tiny random policy, real BFCL tasks): the event files TensorBoard reads
hold each step's metrics as the store holds them, at the trainer's global step, beside TRL's own ``train/*``."""

import os

import pytest

from seal_lite.core import metrics as m
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.store import Store


def test_tensorboard_event_files_hold_what_the_store_holds(tmp_path, tiny_model_dir):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from seal_lite.runs.train import run

    recipe = load_recipe(None, {
        "interface.tool_format": "signatures", "policy.model": tiny_model_dir, "policy.dtype": "float32",
        "diagnoser.mode": "off", "data.task_ids": ["multi_turn_base_0", "multi_turn_base_1"],
        "grpo.tasks_per_step": 1, "grpo.steps": 2, "grpo.mini_batches": 2,  # 2 optimizer steps per SEAL step
        "rollout.num_generations": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
        "rollout.max_model_calls": 1, "logging.report_to": "tensorboard",
    })
    run(recipe, tmp_path)
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ  # set for transformers' callback only while the run ran

    events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={accumulator.SCALARS: 0})
    events.Reload()
    logged = {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    store = Store(tmp_path / "seal.db")
    for step in (1, 2):
        metrics = {name: value for name, value in store.step_metrics(step).items()
                   if m.describe(name) is not m.TRL_LOG}  # TRL's own log is the trainer's train/*
        assert m.REWARD_MEAN.name in metrics and m.INTERFACE_VERSION.name in metrics and m.LORA_CHANGE.name in metrics
        assert {name: logged[name][2 * step] for name in metrics} == pytest.approx(metrics)
        assert logged["train/loss"][2 * step] == pytest.approx(store.step_metrics(step)["grpo/loss"])
    assert set(logged[m.REWARD_MEAN.name]) == {2, 4}  # the trainer's global steps of SEAL steps 1 and 2
