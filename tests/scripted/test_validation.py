"""Validation during training (recipe section ``validation``) on real runs with a tiny random policy and real BFCL
tasks: rows at the right steps, a best adapter that ``seal-lite eval --best`` scores and the model card names, a run
that trains exactly as it would without validation, and a best adapter that always matches the store."""

import pytest
import torch
from safetensors.torch import load_file

from seal_lite import api
from seal_lite.core.errors import ConfigError, RunError
from seal_lite.core.recipe import RecipeError, load_recipe
from seal_lite.core.recipe_sections import ValidationConfig
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import BFCL, load_tasks
from seal_lite.runs import validation as validation_module
from seal_lite.runs.evaluate_bfcl import BEST_ADAPTER, best_step, scores_by_step
from seal_lite.runs.preflight import check
from seal_lite.runs.train import run
from seal_lite.runs.validation import (
    STAGED_PREFIX,
    settle_best_adapter,
    validation_task_ids,
)
from tests.helpers import answer_with_ground_truth

HELD_OUT = ["multi_turn_base_100", "multi_turn_base_101"]


def tiny_recipe(model_dir: str, **validation):
    return load_recipe(None, {
        "policy.model": model_dir, "policy.dtype": "float32", "diagnoser.mode": "off",
        "rollout.backend": "transformers", "interface.tool_format": "signatures",
        "data.task_ids": ["multi_turn_base_0", "multi_turn_base_1"], "grpo.tasks_per_step": 1, "grpo.steps": 3,
        "rollout.num_generations": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
        "rollout.max_model_calls": 1, "rollout.max_context_tokens": 16384,  # the official view's
        **{f"validation.{key}": value for key, value in validation.items()},
    })


def lora_weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "adapter_model.safetensors"))


def test_validation_steps_follow_every_the_last_step_and_before_training():
    config = ValidationConfig(every=10, before_training=True)
    assert [step for step in range(73) if config.after(step, 72)] == [0, 10, 20, 30, 40, 50, 60, 70, 72]
    assert config.count(72) == 9 and config.slice_size() == 400
    assert not any(ValidationConfig().after(step, 72) for step in range(73)) and ValidationConfig().count(72) == 0
    assert [step for step in range(4) if ValidationConfig(every=2).after(step, 3)] == [2, 3]


def test_the_slice_takes_the_first_tasks_of_each_category_in_the_splits_order():
    ids = validation_task_ids(ValidationConfig(tasks_per_category=2, categories=["base", "miss_param"]), BFCL)
    assert len(ids) == 4 and [i.rsplit("_", 1)[0] for i in ids] == ["multi_turn_base"] * 2 + ["multi_turn_miss_param"] * 2
    assert len(validation_task_ids(ValidationConfig(), BFCL)) == 400  # the release's: every held-out task
    for config in (ValidationConfig(tasks_per_category=2, categories=["base", "miss_param"]),
                   ValidationConfig(tasks_per_category=500), ValidationConfig(task_ids=HELD_OUT)):
        assert config.slice_size() == len(validation_task_ids(config, BFCL))  # what the plan counts
    assert validation_task_ids(ValidationConfig(task_ids=HELD_OUT, tasks_per_category=1), BFCL) == HELD_OUT


def test_bad_validation_settings_are_refused_with_the_fix():
    with pytest.raises(RecipeError, match="validation.every"):
        load_recipe(None, {"validation.every": 0})
    with pytest.raises(RecipeError, match="validation.every.*rollout.max_context_tokens to 16384"):
        load_recipe(None, {"validation.every": 5})  # the quickstart's 4096 cannot hold the official view
    with pytest.raises(RecipeError, match="validation.task_ids.*multi_turn_base_99999.*no such task"):
        check(load_recipe(None, {"validation.task_ids": ["multi_turn_base_99999"]}))
    problems = load_recipe(None, {"validation.every": 5, "grpo.tasks_per_step": 2, "data.task_ids": HELD_OUT,
                                  "rollout.max_context_tokens": 16384}).process_problems(2)
    assert problems and "validation.every" in problems[0] and "seal-lite eval RUN --step N" in problems[0]


def test_a_validated_run_keeps_its_best_adapter_and_trains_exactly_as_without_validation(tmp_path, tiny_model_dir):
    plain, validated = tmp_path / "plain", tmp_path / "validated"
    run(tiny_recipe(tiny_model_dir), plain)
    summary = run(tiny_recipe(tiny_model_dir, every=2, before_training=True, task_ids=HELD_OUT), validated)

    store = Store(validated / "seal.db")
    assert sorted({row["step"] for row in store.validations()}) == [0, 2, 3]  # before, every 2, the last
    assert {row["task_id"] for row in store.validations()} == set(HELD_OUT)
    assert summary.validation == scores_by_step(store) and summary.best == best_step(store, "accuracy")
    # the training itself is untouched: the same steps, trajectories, interface and final LoRA
    plain_store = Store(plain / "seal.db")
    for field in ("reward_mean", "loss", "weight_min", "weight_max", "interface_version"):
        assert [row[field] for row in store.steps()] == [row[field] for row in plain_store.steps()]
    assert [row["messages"] for row in store.trajectories()] == [row["messages"] for row in plain_store.trajectories()]
    assert store.interface_versions() == plain_store.interface_versions()
    trained = lora_weights(validated / "adapter")
    assert all(torch.equal(trained[name], value) for name, value in lora_weights(plain / "adapter").items())

    # a random policy scores 0 everywhere: ties keep the earliest, the base model's (its LoRA B is still 0)
    assert summary.best == (0, 0.0)
    best = lora_weights(validated / BEST_ADAPTER)
    assert not any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in best.items())
    assert not list(validated.glob(f"{STAGED_PREFIX}*"))

    results = api.evaluate(validated, best=True, steps=(3,), split=",".join(HELD_OUT))
    assert list(results["summary"]) == ["best (step 0)", "step 3"]
    api.report(validated)
    card = (validated / BEST_ADAPTER / "README.md").read_text()
    assert "This adapter is the run's best validation checkpoint: step 0" in card
    assert "| 0 (best) | 2 |" in card and "| 3 | 2 |" in card
    assert "This adapter is the final one: step 3" in (validated / "adapter" / "README.md").read_text()
    exported = api.export(validated, "merged", best=True)
    assert exported.adapter == validated / BEST_ADAPTER and exported.path == validated / "export" / "best" / "merged"
    with pytest.raises(RunError, match="no best validation checkpoint"):
        api.evaluate(plain, best=True, split=",".join(HELD_OUT))
    with pytest.raises(ConfigError, match="--best and --step"):
        api.export(validated, "merged", best=True, step=3)


def test_the_best_adapter_follows_the_best_score(tmp_path, tiny_model_dir, monkeypatch):
    """The policy answers the held-out tasks right only in the validation after step 2: that adapter becomes
    the best, and a later, worse one does not replace it."""
    validating, right_at = {}, 2
    tasks = load_tasks(["multi_turn_base_0", "multi_turn_base_1", *HELD_OUT])
    validate = validation_module.Validator.__call__

    def recording(self, step):
        validating["step"] = step
        try:
            return validate(self, step)
        finally:
            validating.pop("step")

    monkeypatch.setattr(validation_module.Validator, "__call__", recording)
    # right in every validation after step 2; in training, right half the time (a learning signal)
    answer_with_ground_truth(monkeypatch, tasks, lambda row: validating.get("step") == right_at if "step" in validating
                             else torch.rand(()) < 0.5)
    recipe = tiny_recipe(tiny_model_dir, every=1, task_ids=HELD_OUT, metric="turn_pass_rate")
    recipe.grpo.keep_checkpoints = 3
    summary = run(recipe, tmp_path)
    scores = scores_by_step(Store(tmp_path / "seal.db"))
    assert list(scores) == [1, 2, 3] and scores[2]["turn_pass_rate"] > max(scores[1]["turn_pass_rate"],
                                                                            scores[3]["turn_pass_rate"])
    assert summary.best[0] == 2
    best, final = lora_weights(tmp_path / BEST_ADAPTER), lora_weights(tmp_path / "adapter")
    step_2 = lora_weights(tmp_path / Store(tmp_path / "seal.db").checkpoints()[1]["path"])
    assert all(torch.equal(best[name], value) for name, value in step_2.items())  # step 2's adapter,
    assert any(not torch.equal(best[name], final[name]) for name in best)  # not the last one


def validations(store: Store, scores: dict[int, bool]) -> None:
    for step, valid in scores.items():
        store.save_validations(step, [{"task_id": HELD_OUT[0], "category": "base", "valid": valid,
                                       "turns_passed": int(valid), "turns": 1, "labels": ["pass" if valid else "no_call"]}])


def staged(run_dir, step: int, content: str):
    directory = run_dir / f"{STAGED_PREFIX}{step}"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(content)
    return directory


def test_settling_moves_the_stores_best_into_place_and_drops_every_other_staged_adapter(tmp_path):
    store = Store(tmp_path / "seal.db")
    validations(store, {1: False, 2: True})
    (tmp_path / BEST_ADAPTER).mkdir()
    (tmp_path / BEST_ADAPTER / "adapter_config.json").write_text("step 1")
    staged(tmp_path, 2, "step 2")
    staged(tmp_path, 3, "step 3, rolled back")  # a killed run's step that never committed
    settle_best_adapter(tmp_path, store, "accuracy")
    assert (tmp_path / BEST_ADAPTER / "adapter_config.json").read_text() == "step 2"
    assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == [BEST_ADAPTER]

    validations(store, {4: True})  # equal to step 2's: a tie keeps the earlier step
    staged(tmp_path, 4, "step 4")
    settle_best_adapter(tmp_path, store, "accuracy")
    assert (tmp_path / BEST_ADAPTER / "adapter_config.json").read_text() == "step 2"

    # killed after the old best was moved aside, before the new one was moved in: the next settle finishes
    (tmp_path / BEST_ADAPTER).rename(tmp_path / f".{BEST_ADAPTER}-old")
    staged(tmp_path, 2, "step 2 again")
    settle_best_adapter(tmp_path, store, "accuracy")
    assert (tmp_path / BEST_ADAPTER / "adapter_config.json").read_text() == "step 2 again"
    assert not (tmp_path / f".{BEST_ADAPTER}-old").exists()


def test_a_resumed_run_drops_the_validations_of_the_steps_it_rolls_back(tmp_path):
    store = Store(tmp_path / "seal.db")
    validations(store, {0: False, 1: True, 2: True})
    store.rollback_after(1)
    assert sorted({row["step"] for row in store.validations()}) == [0, 1]


def test_a_run_killed_after_a_validation_resumes_with_one_validation_per_step_and_its_best(tmp_path, tiny_model_dir,
                                                                                           monkeypatch):
    """Killed after step 3's validation, before its commit: the resumed run drops that validation with the step,
    validates step 3 again once, and keeps the best adapter the store names."""
    commit = Store.commit_checkpoint

    def killed_at_step_3(self, step, path, seal_state):
        if step == 3:
            raise KeyboardInterrupt("killed")
        commit(self, step, path, seal_state)

    recipe = tiny_recipe(tiny_model_dir, every=1, before_training=True, task_ids=HELD_OUT)
    monkeypatch.setattr(Store, "commit_checkpoint", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(recipe, tmp_path)
    assert sorted({row["step"] for row in Store(tmp_path / "seal.db").validations()}) == [0, 1, 2, 3]
    assert (tmp_path / BEST_ADAPTER).is_dir()  # the base model's: step 0 settled before training
    monkeypatch.setattr(Store, "commit_checkpoint", commit)
    summary = run(recipe, tmp_path)
    store = Store(tmp_path / "seal.db")
    created = {}
    for row in store.validations():
        created.setdefault(row["step"], set()).add(row["created_at"])
    assert sorted(created) == [0, 1, 2, 3] and all(len(times) == 1 for times in created.values())
    assert summary.best == best_step(store, "accuracy") and (tmp_path / BEST_ADAPTER / "adapter_config.json").is_file()
    assert not list(tmp_path.glob(f"{STAGED_PREFIX}*")) and not list(tmp_path.glob(f".{BEST_ADAPTER}-old"))
