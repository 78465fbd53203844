"""Dynamic sampling (grpo.dynamic_sampling): groups without a learning signal are replaced, within a budget."""

from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from tests.helpers import HalfRightOnSome

POOL = ["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_10"]


def _step(tmp_path, smol_tokenizer, budget, learnable, name):
    tasks = {task.id: task.truncated(1) for task in load_tasks(POOL)}
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.num_generations, recipe.rollout.parser = 4, "lenient"
    recipe.grpo.tasks_per_step, recipe.grpo.dynamic_sampling = 2, budget
    generator = HalfRightOnSome(smol_tokenizer, list(tasks.values()), learnable)
    store = Store(tmp_path / f"{name}.db")
    step = SealStep(recipe, store, tasks, generator)
    return step, generator, store


def test_groups_without_signal_are_replaced_by_groups_with_one(tmp_path, smol_tokenizer):
    step, generator, store = _step(tmp_path, smol_tokenizer, 3, ["multi_turn_base_3", "multi_turn_base_10"], "fill")
    drawn = ["multi_turn_base_0", "multi_turn_base_3"]  # TRL's draw: the first has no signal
    batch = step(drawn)

    # every group of the batch now has a signal; multi_turn_base_0's group was dropped for a learnable task's
    groups = [batch.rewards[i : i + 4] for i in (0, 4)]
    assert all(len(set(group)) > 1 for group in groups)
    stored = {row["task_id"] for row in store.trajectories()}
    assert "multi_turn_base_0" not in stored and stored == {"multi_turn_base_3", "multi_turn_base_10"}
    assert generator.played[:2] == drawn and "multi_turn_base_10" in generator.played
    assert dict(store.metrics("sampling/groups_rolled_out"))[1] == len(generator.played) <= 2 + 3
    assert dict(store.metrics("grpo/groups_with_signal"))[1] == 1.0
    # the step's reward is the drawn groups' (base_0: 0 of 4, base_3: 2 of 4), not the update batch's
    assert dict(store.metrics("reward/mean"))[1] == store.steps()[0]["reward_mean"] == 0.25
    assert dict(store.metrics("reward/update_mean"))[1] == sum(batch.rewards) / 8 == 0.5
    assert dict(store.metrics("sampling/drawn_groups_with_signal"))[1] == 0.5


def test_the_budget_bounds_the_extra_groups(tmp_path, smol_tokenizer):
    step, generator, store = _step(tmp_path, smol_tokenizer, 2, [], "budget")  # nothing is learnable
    batch = step(["multi_turn_base_0", "multi_turn_base_2"])
    assert len(generator.played) == 2 + 2  # the two drawn groups and exactly the budget of extra ones
    assert batch.rewards == [0.0] * 8 and not any(batch.advantages)
    assert dict(store.metrics("grpo/groups_with_signal"))[1] == 0.0

    off, generator, _ = _step(tmp_path, smol_tokenizer, None, [], "off")
    off(["multi_turn_base_0", "multi_turn_base_2"])
    assert len(generator.played) == 2
