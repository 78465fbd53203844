"""The placebo control (grpo.shuffle_rewards): the update gets each group's advantages in a random order, while
the store and the reward curve keep the real verdicts."""

import pytest

from seal_lite.core.advantages import group_advantages
from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from tests.helpers import HalfRightOnSome

TASKS = ["multi_turn_base_0", "multi_turn_base_3"]


def _steps(tmp_path, smol_tokenizer, shuffle: bool, steps: int = 3):
    """``steps`` steps on two tasks whose groups are half right (the first half of each group): the store's rows."""
    tasks = {task.id: task.truncated(1) for task in load_tasks(TASKS)}
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.num_generations, recipe.rollout.parser = 4, "lenient"
    recipe.grpo.tasks_per_step, recipe.grpo.shuffle_rewards = 2, shuffle
    store = Store(tmp_path / f"shuffle-{shuffle}.db")
    step = SealStep(recipe, store, tasks, HalfRightOnSome(smol_tokenizer, list(tasks.values()), TASKS))
    batches = [step(TASKS) for _ in range(steps)]
    return store, batches


def test_shuffled_rewards_keep_each_groups_advantages_but_not_who_gets_them(tmp_path, smol_tokenizer):
    real, _ = _steps(tmp_path, smol_tokenizer, shuffle=False)
    placebo, batches = _steps(tmp_path, smol_tokenizer, shuffle=True)
    rows = list(placebo.trajectories())
    assert [(r["step"], r["task_id"], r["reward"]) for r in rows] == [
        (r["step"], r["task_id"], r["reward"]) for r in real.trajectories()]  # the real verdicts are stored
    assert dict(placebo.metrics("reward/mean")) == dict(real.metrics("reward/mean")) == {1: 0.5, 2: 0.5, 3: 0.5}
    groups = [rows[start : start + 4] for start in range(0, len(rows), 4)]
    for group in groups:  # the same advantages as the real rewards give, in some order
        assert sorted(r["advantage"] for r in group) == pytest.approx(sorted(group_advantages([r["reward"] for r in group])))
    # ... and some of them go to a failed trajectory: the update no longer follows what passed
    assert any(r["reward"] == 0 and r["advantage"] > 0 for r in rows)
    assert all((r["reward"] > 0) == (r["advantage"] > 0) for r in real.trajectories())
    assert [a for batch in batches for a in batch.advantages] == pytest.approx([r["weighted_advantage"] for r in rows])
