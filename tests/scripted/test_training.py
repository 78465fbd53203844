"""One real GRPO step through TRL on a tiny random model, fed by the real SEAL step with scripted rollouts."""

import json

import pytest
import torch

from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import load_recipe
from seal_lite.core.types import RolloutBatch
from seal_lite.engines.policy import load_policy
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.step.rollout import rollout_group
from seal_lite.training import grpo, shared_prefix
from tests.helpers import ScriptedGenerator, tool_call_text


def test_weighted_grpo_step_updates_lora_on_model_tokens_only(tmp_path, tiny_model_dir, monkeypatch):
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(tiny_model_dir, recipe)
    tokenizer = policy.tokenizer
    scripts = [[tool_call_text(task.ground_truth[0]), "Done."], [tool_call_text(["mkdir(dir_name='x')"]), "Done."]]
    generator = ScriptedGenerator(tokenizer, scripts)
    seal_step = SealStep(recipe, store, {task.id: task}, generator)

    captured = {}
    original = grpo.SealGRPOTrainer._generate_and_score_completions

    def capture(self, inputs):
        captured["output"] = original(self, inputs)
        return captured["output"]

    monkeypatch.setattr(grpo.SealGRPOTrainer, "_generate_and_score_completions", capture)
    trainer = grpo.build_trainer(policy, recipe, [task.id], seal_step, str(tmp_path / "trl"),
                                 callbacks=[grpo.StoreCallback(store, updates=1)])
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    before = {n: p for n, p in lora_before.items() if "lora_B" in n}
    assert all(torch.count_nonzero(p) == 0 for p in before.values())  # LoRA B starts at zero
    trainer.train()

    # rewards: the ground-truth episode passes, the other fails; advantages are SEAL's, times the weights
    rows = store.trajectories(step=1)
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    assert rows[0]["weighted_advantage"] > 0 > rows[1]["weighted_advantage"]
    assert [r["weighted_advantage"] for r in rows] == [r["advantage"] * r["weight"] for r in rows]
    output = captured["output"]
    assert output["advantages"].tolist() == pytest.approx([r["weighted_advantage"] for r in rows], rel=1e-6)

    # TRL's loss mask equals our env_mask: model tokens only, padding and environment tokens excluded
    loss_mask = (output["completion_mask"] * output["tool_mask"]).tolist()
    batch = trainer.seal_batch
    for row, env_mask in zip(loss_mask, batch.env_mask):
        assert row == env_mask + [0] * (len(row) - len(env_mask))
        assert 0 < sum(env_mask) < len(env_mask)  # both kinds of token are present

    # a real update happened: the LoRA B matrices moved, and the store logged the loss and LoRA norm
    after = {n: p.detach() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert any(torch.count_nonzero(after[n]) > 0 for n in before)
    assert store.metrics("grpo/lora_norm")[0][1] > 0
    assert store.steps()[0]["loss"] is not None
    # how far the update moved the LoRA: the norm of its change over every LoRA parameter (A and B)
    moved = torch.stack([(p.detach() - lora_before[n]).pow(2).sum() for n, p in trainer.model.named_parameters()
                         if "lora_" in n]).sum().sqrt()
    assert store.metrics("grpo/lora_change") == [(1, pytest.approx(float(moved), rel=1e-5))] and moved > 0


def test_equal_rewards_leave_lora_unchanged(tmp_path, tiny_model_dir):
    """A group whose members all fail has A = 0, so the weighted update is exactly zero (beta = 0)."""
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.beta": 0.0,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(tiny_model_dir, recipe)
    tokenizer = policy.tokenizer
    generator = ScriptedGenerator(tokenizer, [["I cannot."], ["No."]])
    trainer = grpo.build_trainer(policy, recipe, [task.id], SealStep(recipe, store, {task.id: task}, generator),
                                 str(tmp_path / "trl"), callbacks=[grpo.StoreCallback(store, updates=1)])
    trainer.train()
    assert all(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)
    assert store.metrics("grpo/lora_change") == [(1, 0.0)]  # what the run's summary reports as "no update"


def test_a_rollout_batch_is_built_from_trajectories_in_order(smol_tokenizer):
    """What SealStep hands TRL (and the teaching notebook builds by hand): one entry per trajectory, in order."""
    recipe = load_recipe(None, {"interface.tool_format": "signatures", "rollout.max_turns": 1})
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    scripts = [[tool_call_text(task.ground_truth[0]), "Done."], [tool_call_text(["mkdir(dir_name='x')"]), "Done."]]
    generator = ScriptedGenerator(smol_tokenizer, scripts)
    trajectories = rollout_group(task, 2, generator, recipe.rollout, TrainingInterface(tool_format="signatures"))
    batch = RolloutBatch.from_trajectories(trajectories, [0.0, 1.0], [-0.5, 0.5])
    assert batch.prompt_ids == [t.prompt_ids for t in trajectories]
    assert batch.completion_ids == [t.completion_ids for t in trajectories]
    assert batch.env_mask == [t.env_mask for t in trajectories]
    assert (batch.rewards, batch.advantages, batch.sampled_logprobs) == ([0.0, 1.0], [-0.5, 0.5], None)
    for trajectory in trajectories:  # an engine that reports its sampling log-probs (llama.cpp)
        trajectory.sampled_logprobs = [0.0] * len(trajectory.completion_ids)
    assert RolloutBatch.from_trajectories(trajectories, [0.0, 1.0], [0.0, 0.0]).sampled_logprobs == [
        t.sampled_logprobs for t in trajectories]
    with pytest.raises(ValueError, match="one of each per trajectory"):
        RolloutBatch.from_trajectories(trajectories, [0.0], [0.0, 0.0])


def test_mini_batches_and_ppo_epochs_map_onto_seal_steps(tmp_path, tiny_model_dir):
    """4 optimizer steps per SEAL step (2 mini-batches x 2 PPO epochs): one store row, loss and checkpoint each."""
    from seal_lite.runs.train import run

    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "policy.model": tiny_model_dir, "policy.dtype": "float32", "diagnoser.mode": "off",
        "data.task_ids": ["multi_turn_base_0", "multi_turn_base_1"], "grpo.tasks_per_step": 1, "grpo.steps": 2,
        "grpo.mini_batches": 2, "grpo.num_iterations": 2, "rollout.num_generations": 2, "rollout.max_turns": 1,
        "rollout.max_new_tokens": 8, "rollout.max_model_calls": 1,
    })
    run(recipe, tmp_path)
    store = Store(tmp_path / "seal.db")
    assert [s["step"] for s in store.steps()] == [1, 2]
    assert all(s["loss"] is not None for s in store.steps())
    assert [step for step, _ in store.metrics("grpo/loss")] == [1, 2]
    rows = list(store.db["checkpoints"].rows_where(order_by="step"))
    assert [(r["step"], r["path"]) for r in rows] == [(1, "checkpoints/checkpoint-4"), (2, "checkpoints/checkpoint-8")]
    assert json.loads(rows[-1]["seal_state"])["step"] == 2


class ClaimsCertainty(ScriptedGenerator):
    """A rollout engine that reports log-prob 0 for every token it produced (llama.cpp reports its own)."""

    def generate(self, batch, max_new_tokens, temperature):
        out = super().generate(batch, max_new_tokens, temperature)
        self.sampled_logprobs = [[0.0] * len(ids) for ids in out]
        return out


def _engine_step(tmp_path, model_dir, max_gap: float, mini_batches: int = 1, engine_logprobs: bool = True):
    """One SEAL step whose rollouts come with an engine's log-probs (``ClaimsCertainty``) or without. Returns the
    store, the trainer and the number of decoder passes."""
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.beta": 0.0,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
        "rollout.max_logprob_gap": max_gap, "grpo.mini_batches": mini_batches,
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(model_dir, recipe)
    scripts = [[tool_call_text(task.ground_truth[0]), "Done."], [tool_call_text(["mkdir(dir_name='x')"]), "Done."]]
    generator = (ClaimsCertainty if engine_logprobs else ScriptedGenerator)(policy.tokenizer, scripts)
    seal_step = SealStep(recipe, store, {task.id: task}, generator)
    trainer = grpo.build_trainer(policy, recipe, [task.id], seal_step, str(tmp_path / "trl"),
                                 callbacks=[grpo.StoreCallback(store, updates=grpo.updates_per_step(recipe))])
    passes = []
    shared_prefix.decoder_and_head(trainer.model)[0].register_forward_hook(lambda *_: passes.append(1))
    trainer.train()
    return store, trainer, len(passes)


@pytest.mark.parametrize("mini_batches", [1, 2], ids=["on-policy", "old-log-probs"])
@pytest.mark.parametrize(("max_gap", "filtered"), [(1.0, 1.0), (100.0, 0.0)])
def test_tokens_the_two_engines_disagree_on_carry_no_loss(tmp_path, tiny_model_dir, max_gap, filtered, mini_batches):
    """A rollout engine claiming log-prob 0 for every token disagrees with a random model (about -10.8) by far
    more than 1 nat: with max_logprob_gap 1 every token leaves the loss and LoRA stays put; with 100 none do. The
    trained side of the comparison is the update's own log-probs: computed in the loss on-policy, TRL's old
    log-probs with 2 mini-batches."""
    store, trainer, _ = _engine_step(tmp_path, tiny_model_dir, max_gap, mini_batches)
    assert store.metrics("grpo/engine/filtered_share") == [(1, filtered)]
    assert store.metrics("grpo/engine/logprob_gap_mean")[0][1] > 5
    moved = any(torch.count_nonzero(p) > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)
    assert moved == (filtered == 0.0)


def test_the_engine_comparison_costs_no_forward_pass(tmp_path, tiny_model_dir):
    """On-policy, the comparison reuses the log-probs the loss computes: a step with an engine's log-probs runs
    the decoder exactly as often as the same step without them (an extra scoring pass would add passes)."""
    store, _, compared = _engine_step(tmp_path / "compared", tiny_model_dir, 100.0, engine_logprobs=True)
    assert store.metrics("grpo/engine/filtered_share") == [(1, 0.0)]  # compared, nothing filtered
    store, _, plain = _engine_step(tmp_path / "plain", tiny_model_dir, 100.0, engine_logprobs=False)
    assert store.metrics("grpo/engine/filtered_share") == []  # no engine log-probs, no comparison
    assert compared == plain > 0


def _two_step_lora(tmp_path, tiny_model_dir, beta: float, signal_first: bool, skip: bool):
    """Two steps, one with a learning signal (one episode passes) and one without (both fail). Returns the final
    LoRA weights, the number of model forward passes in each step, and the stored skip flags."""
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 2, "grpo.beta": beta,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(tiny_model_dir, recipe)
    signal = [[tool_call_text(task.ground_truth[0]), "Done."], [tool_call_text(["mkdir(dir_name='x')"]), "Done."]]
    scripts = [s + ["No."] if signal_first else ["No."] + s for s in signal]
    seal_step = SealStep(recipe, store, {task.id: task}, ScriptedGenerator(policy.tokenizer, scripts))
    trainer = grpo.build_trainer(policy, recipe, [task.id], seal_step, str(tmp_path / "trl"),
                                 callbacks=[grpo.StoreCallback(store, updates=1)])
    trainer.skip_without_signal = skip
    forwards = []  # the decoder runs in every scoring pass, TRL's (through the model) and the shared-prefix one
    decoder, _ = shared_prefix.decoder_and_head(trainer.model)
    decoder.register_forward_hook(lambda *_: forwards.append(seal_step.step))
    trainer.train()
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    return lora, [forwards.count(1), forwards.count(2)], [flag for _, flag in store.metrics("grpo/update_skipped")]


@pytest.mark.parametrize(("beta", "signal_first", "skipped_steps"), [
    (0.0, True, [0.0, 1.0]),    # no KL: a step without signal has a zero gradient
    (0.0, False, [1.0, 0.0]),
    (0.01, False, [1.0, 0.0]),  # KL on, but the policy is still the reference: its gradient is zero too
    (0.01, True, [0.0, 0.0]),   # KL on after a real update: the KL gradient must be computed
])
def test_a_step_without_learning_signal_skips_the_model_but_not_the_optimizer(tmp_path, tiny_model_dir, beta,
                                                                              signal_first, skipped_steps):
    """A skipped step runs no forward pass, yet the weights end exactly where the full computation puts them:
    Adam still steps on the zero gradient, so its momentum from an earlier step moves the weights as it should."""
    skipped, forwards, flags = _two_step_lora(tmp_path / "skip", tiny_model_dir, beta, signal_first, skip=True)
    full, full_forwards, full_flags = _two_step_lora(tmp_path / "full", tiny_model_dir, beta, signal_first, skip=False)
    assert flags == skipped_steps and full_flags == [0.0, 0.0]
    assert [count == 0 for count in forwards] == [flag == 1.0 for flag in skipped_steps]
    assert all(count > 0 for count in full_forwards)
    assert any(torch.count_nonzero(p) > 0 for n, p in full.items() if "lora_B" in n)  # the signal step moved LoRA
    for name in full:
        assert torch.allclose(skipped[name], full[name], rtol=0, atol=1e-7), name


def _train_recording(tmp_path, model_dir, loss_type: str, micro: int | None, **settings):
    """One SEAL step over a real two-turn BFCL task (4 scripted episodes: model tokens, tool results and user turns
    in every completion), 2 mini-batches x 2 PPO epochs = 4 optimizer steps, micro-batches of ``micro``
    trajectories, other recipe ``settings`` by dotted name. Returns (optimizer steps, TRL's config, loss per step,
    LoRA gradients per step, tokens through the decoder)."""
    from transformers import TrainerCallback

    recipe = load_recipe(None, settings | {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.mini_batches": 2,
        "grpo.num_iterations": 2, "grpo.micro_batch_size": micro, "grpo.loss_type": loss_type, "grpo.beta": 0.04,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 4, "rollout.max_turns": 2,
        "rollout.max_calls_per_turn": 1, "policy.dtype": "float32", "diagnoser.mode": "off",
    })
    task = load_tasks(["multi_turn_base_0"])[0].truncated(2)
    truth = task.ground_truth
    scripts = [[tool_call_text(truth[0]), tool_call_text(truth[1])],
               [tool_call_text(["mkdir(dir_name='x')"]), tool_call_text(truth[1])],
               ["I cannot.", "No."],
               [tool_call_text(truth[0]), "Done."]]
    policy = load_policy(model_dir, recipe)
    step = SealStep(recipe, Store(tmp_path / "seal.db"), {task.id: task}, ScriptedGenerator(policy.tokenizer, scripts))
    grads = []

    class Gradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n})

    trainer = grpo.build_trainer(policy, recipe, [task.id], step, str(tmp_path / "trl"), callbacks=[Gradients()])
    trainer.args.logging_steps = 1  # the loss of every optimizer step
    trainer.args.save_strategy = "no"
    tokens = []
    decoder, _ = shared_prefix.decoder_and_head(trainer.model)
    decoder.register_forward_pre_hook(lambda _, args, kwargs: tokens.append(kwargs["input_ids"].numel()),
                                      with_kwargs=True)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer.state.global_step, trainer.args, losses, grads, sum(tokens)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])  # dapo: batch-token normaliser; grpo: per sequence
def test_one_trajectory_per_micro_batch_trains_exactly_like_whole_mini_batches(tmp_path, tiny_model_dir, loss_type):
    """Memory no longer grows with the batch, and nothing else changes: the same optimizer steps, losses and
    LoRA gradients as one forward/backward pass over each whole mini-batch (the earlier behaviour)."""
    whole = _train_recording(tmp_path / "whole", tiny_model_dir, loss_type, micro=2)
    single = _train_recording(tmp_path / "single", tiny_model_dir, loss_type, micro=1)
    # (the gradients of steps 2-4 are taken at the weights the earlier steps left, so those agree as well)
    args, args_1 = whole[1], single[1]
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 1)
    assert (args_1.per_device_train_batch_size, args_1.gradient_accumulation_steps) == (1, 2)
    # float tolerance relative to each tensor's scale: fp32 sums in another order, and from step 2 on the weights an
    # lr-1e-2 Adam step left (measured: at most 6e-5 of the largest entry)
    assert_same_training(whole, single)


def assert_same_training(expected, actual, tolerance: float = 2e-4):
    """The same optimizer steps, losses and LoRA gradients per step, to ``tolerance`` of each tensor's scale."""
    (steps, _, losses, grads, _), (steps_1, _, losses_1, grads_1, _) = expected, actual
    assert steps == steps_1 == 4 and len(grads) == len(grads_1) == 4
    assert losses_1 == pytest.approx(losses, rel=1e-5, abs=1e-7)
    assert any(abs(loss) > 1e-4 for loss in losses)  # a real learning signal, not zeros compared with zeros
    for before, after in zip(grads, grads_1, strict=True):
        assert any(g.abs().max() > 0 for g in before.values())
        for name in before:
            scale = before[name].abs().max().item()
            torch.testing.assert_close(after[name], before[name], rtol=0, atol=tolerance * scale + 1e-10, msg=name)


@pytest.mark.parametrize(("backend", "checkpointing"), [("peft", False), ("peft", True), ("peft-4bit", False)])
def test_shared_prefix_trains_exactly_like_one_pass_per_trajectory(tmp_path, tiny_model_dir, backend, checkpointing):
    """Whole training steps with shared-prefix scoring against TRL's pass per trajectory: 2 mini-batches x 2 PPO
    epochs (so TRL's old-log-prob pass runs, and the ratios leave 1 from step 2 on), KL against the reference
    (adapter disabled), gradient accumulation over micro-batches, with and without gradient checkpointing, on
    fp32 LoRA and on bitsandbytes NF4 layers: the same losses and LoRA gradients at every optimizer step, while
    the decoder reads far fewer tokens."""
    settings = {"policy.backend": backend, "policy.gradient_checkpointing": checkpointing}
    shared = _train_recording(tmp_path / "shared", tiny_model_dir, "grpo", micro=None, **settings)
    per_trajectory = _train_recording(tmp_path / "unshared", tiny_model_dir, "grpo", micro=None,
                                      **settings | {"grpo.shared_prefix": False})
    assert (shared[1].per_device_train_batch_size, per_trajectory[1].per_device_train_batch_size) == (2, 1)
    assert shared[1].gradient_checkpointing == checkpointing
    assert_same_training(per_trajectory, shared)
    assert shared[4] < 0.75 * per_trajectory[4]  # each micro-batch of 2 reads its prompt once


def test_micro_batch_size_defaults_to_one_group_and_must_divide_the_mini_batch():
    from seal_lite.core.recipe import RecipeError

    base = {"grpo.tasks_per_step": 2, "rollout.num_generations": 4, "grpo.mini_batches": 2}  # mini-batches of 4
    assert load_recipe(None, base).micro_batch() == 4  # one group: its prompt is computed once
    assert load_recipe(None, base).micro_batch(shared_prefix=False) == 1  # e.g. Unsloth: one trajectory
    assert load_recipe(None, base | {"grpo.shared_prefix": False}).micro_batch() == 1
    assert load_recipe(None, base | {"grpo.mini_batches": 4}).micro_batch() == 2  # half a group per mini-batch
    assert load_recipe(None, {**base, "grpo.tasks_per_step": 3, "grpo.mini_batches": 2}).micro_batch() == 2
    assert load_recipe(None, base | {"grpo.micro_batch_size": 2}).micro_batch() == 2
    assert load_recipe(None, base | {"grpo.loss_type": "bnpo"}).micro_batch() == 4  # bnpo: its token mean
    with pytest.raises(RecipeError, match=r"grpo.micro_batch_size = 3: it must divide the mini-batch \(4"):
        load_recipe(None, base | {"grpo.micro_batch_size": 3})
    with pytest.raises(RecipeError, match="bnpo's token mean is taken per micro-batch"):
        load_recipe(None, base | {"grpo.loss_type": "bnpo", "grpo.micro_batch_size": 1})


def test_a_run_resumed_in_a_later_epoch_draws_the_uninterrupted_runs_tasks(tmp_path, tiny_model_dir):
    """An epoch is one pass over the training tasks, in an order drawn from the recipe's seed. TRL's sampler draws
    epoch k's order as the k-th permutation of one seeded generator, so a run resumed in epoch k > 0 (a new
    trainer) drew epoch 0's order again; transformers calls ``set_epoch`` before each epoch, which now reseeds.
    Resumed within an epoch, transformers skips the batches already trained (accelerate's skip_first_batches)."""
    from accelerate import skip_first_batches

    task_ids = [f"multi_turn_base_{i}" for i in range(6)]
    recipe = load_recipe(None, {
        "policy.model": tiny_model_dir, "policy.dtype": "float32", "diagnoser.mode": "off", "seed": 1,
        "data.task_ids": task_ids, "grpo.tasks_per_step": 2, "rollout.num_generations": 2, "grpo.steps": 12,
    })

    def rows(epochs, name, skip=0):  # each epoch's rows (task ids), as a new trainer's transformers loop draws them
        trainer = grpo.build_trainer(load_policy(tiny_model_dir, recipe), recipe, task_ids, None, str(tmp_path / name))
        loader = trainer.get_train_dataloader()
        drawn = []
        for epoch in epochs:
            epoch_loader = skip_first_batches(loader, skip) if skip and epoch == epochs[0] else loader
            epoch_loader.set_epoch(epoch)
            drawn.append([row["prompt"] for batch in epoch_loader for row in batch])
        return drawn, loader.total_batch_size

    uninterrupted, batch = rows(range(4), "uninterrupted")
    orders = [list(dict.fromkeys(epoch)) for epoch in uninterrupted]  # the tasks in the order of their first rows
    generator = torch.Generator().manual_seed(recipe.seed)  # TRL's orders: the runs recorded before the fix repeat
    assert orders == [[task_ids[i] for i in torch.randperm(len(task_ids), generator=generator)] for _ in range(4)]
    assert orders[0] not in orders[1:]  # so a resumed run that drew epoch 0's order again fails this test
    assert rows([1, 2], "resumed-1")[0] == uninterrupted[1:3]
    assert rows([3], "resumed-3")[0] == uninterrupted[3:]
    assert rows([2, 3], "resumed-mid-2", skip=3)[0] == [uninterrupted[2][3 * batch:], uninterrupted[3]]
