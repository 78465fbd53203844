"""Unsloth's log-probs against a rollout engine's (issue 64): Unsloth scores each row in a layout of its own, and
its loss scores its gradient log-probs itself. Unsloth needs an NVIDIA GPU, so its trainer is played here by a
stand-in that mirrors the pinned unsloth 2026.10.9 and unsloth_zoo 2026.10.9, file and line cited at each step.
The real one is checked on a GPU."""

import dataclasses

import pytest
import torch
from trl import GRPOTrainer

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.policy import load_policy
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo
from tests.helpers import HalfRightOnSome

# --- Unsloth's layout, mirrored ------------------------------------------------------------------------------------


def calculate_pad_tokens_in_prompt(input_ids, logits_to_keep, pad_token_id):
    """unsloth_zoo/rl_replacements.py:680-697: the pads before the last ``logits_to_keep`` positions, per row."""
    return (input_ids[:, :-logits_to_keep] == pad_token_id).sum(dim=1)


def left_pack_padding(tensor, pad_id):
    """unsloth_zoo/rl_replacements.py:778-784: every pad of a row moved to its end, the tokens kept in order."""
    order = torch.argsort(tensor != pad_id, dim=1, descending=True, stable=True)
    return torch.gather(tensor, 1, order)


def create_completion_attention_mask(completion_input_ids, left_pad_tokens_per_prompt, max_left_pad, pad_token_id):
    """unsloth_zoo/rl_replacements.py:700-723: Unsloth's loss mask in its own layout."""
    columns = torch.arange(completion_input_ids.size(1)).unsqueeze(0)
    shifted = columns >= (max_left_pad - left_pad_tokens_per_prompt).unsqueeze(1)
    return shifted & (completion_input_ids != pad_token_id)


def align_completion_tool_mask(tool_mask, completion_mask):
    """unsloth_zoo/rl_replacements.py:788-846 (with align_logprobs_with_mask): TRL's tool_mask moved into Unsloth's
    layout, each row shifted to start at its first completion column, times Unsloth's loss mask."""
    if tool_mask is None:
        return completion_mask
    destination = torch.argmax(completion_mask, dim=1, keepdim=True) + torch.arange(tool_mask.size(1))
    rows = torch.arange(tool_mask.size(0)).unsqueeze(1).expand_as(destination)
    inside = destination < completion_mask.size(1)
    aligned = torch.zeros_like(completion_mask)
    aligned[rows[inside], destination[inside]] = tool_mask[inside]
    return completion_mask * aligned


def unsloth_scores(model, input_ids, logits_to_keep, pad_token_id, temperature, max_left_pad=None):
    """unsloth/models/rl_replacements.py:3627-3634 (pads counted, rows packed, the mask rebuilt from the pad id) and
    its padded loop, :4167-4173 (the last logits_to_keep + max_left_pad positions scored): (B, W + max_left_pad).
    ``max_left_pad``: the rows' largest pad count unless given."""
    if max_left_pad is None:
        max_left_pad = int(calculate_pad_tokens_in_prompt(input_ids, logits_to_keep, pad_token_id).max())
    width = logits_to_keep + max_left_pad
    packed = left_pack_padding(input_ids, pad_token_id)
    logits = model(input_ids=packed, attention_mask=(packed != pad_token_id).long()).logits
    logits = logits[:, -(width + 1) : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, packed[:, -width:, None]).squeeze(-1)


class UnslothGRPOTrainer(GRPOTrainer):
    """Unsloth's trainer as far as seal-lite meets it, named as Unsloth's is: its scoring pass returns its own layout,
    detached; its loss asks for its gradient log-probs with ``compute_efficient``, scores them itself when not
    given them, and aligns TRL's tool_mask to its layout. The loss is a plain policy gradient with the importance
    ratio, not Unsloth's clipped one: what is tested is which log-probs and which tokens reach it."""

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_efficient=False, *args, **kwargs):
        if compute_efficient:  # rl_replacements.py:3437-3442: the loss will score them
            return None, None
        with torch.inference_mode():
            logps = unsloth_scores(model, input_ids, logits_to_keep, self.processing_class.pad_token_id,
                                   self.temperature)
        return logps.detach(), None, None  # rl_replacements.py:4242

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # rl_replacements.py:4800-4802
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        width, pad = inputs["completion_ids"].size(1), self.processing_class.pad_token_id
        # rl_replacements.py:4823-4849: trl 1.14.2 has no _get_per_token_logps, so this method, positionally
        logps = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, width, None, False, True)[0]
        old = inputs.get("old_per_token_logps")
        if logps is None:  # unsloth_zoo grpo_accumulated_loss: with gradient, as wide as the old log-probs (:2964-2970)
            logps = unsloth_scores(model, input_ids, width, pad, self.temperature,
                                   None if old is None else old.size(1) - width)
        # unsloth_zoo/rl_replacements.py:2961-2981: the loss mask in that layout, TRL's tool_mask aligned to it
        left_pads = calculate_pad_tokens_in_prompt(input_ids, width, pad)
        window = left_pack_padding(input_ids, pad)[:, -logps.size(1) :]
        mask = create_completion_attention_mask(window, left_pads, logps.size(1) - width, pad).long()
        mask = align_completion_tool_mask(inputs.get("tool_mask"), mask)
        ratio = torch.exp(logps - (logps.detach() if old is None else old))
        return -(ratio * inputs["advantages"][:, None] * mask).sum() / mask.sum().clamp(min=1)


class SealOverUnsloth(grpo.SealGRPOTrainer, UnslothGRPOTrainer):
    """SEAL's trainer as it is built after ``import unsloth``: over Unsloth's."""


# --- the realignment itself ----------------------------------------------------------------------------------------

PAD = 0
PROMPTS = [[11, 12, 13, 14, 15], [21, 22], [31, 32, 33, 34]]  # three prompt lengths
COMPLETIONS = [[16, 17], [23, 24, 25, 26], [35]]  # and three completion lengths


def _trl_batch():
    """prompt_ids left-padded, completion_ids right-padded, as trl 1.14.2 pads them (grpo_trainer.py:2502-2523)."""
    longest_prompt, width = max(map(len, PROMPTS)), max(map(len, COMPLETIONS))
    prompt_ids = torch.tensor([[PAD] * (longest_prompt - len(p)) + p for p in PROMPTS])
    completion_ids = torch.tensor([c + [PAD] * (width - len(c)) for c in COMPLETIONS])
    return prompt_ids, completion_ids, (completion_ids != PAD).long()


def test_unsloths_columns_go_back_to_the_completion_tokens_they_score():
    """Each of Unsloth's columns labelled with the token it scores (its window of the packed rows): realigned, every
    completion token of every row is back in its own column, whatever the row's prompt and completion lengths."""
    prompt_ids, completion_ids, completion_mask = _trl_batch()
    width = completion_ids.size(1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    max_left_pad = int(calculate_pad_tokens_in_prompt(input_ids, width, PAD).max())
    scored_tokens = left_pack_padding(input_ids, PAD)[:, -(width + max_left_pad) :].float()
    assert scored_tokens.shape == (3, width + 3)  # the shortest prompt has 3 pads

    realigned = grpo.unsloth_to_completion_coordinates(scored_tokens, prompt_ids, PAD, width)
    assert realigned.shape == completion_ids.shape
    assert torch.equal(realigned * completion_mask, completion_ids.float())
    # without the realignment the columns are other tokens' (and there are more of them)
    assert not torch.equal(scored_tokens[:, :width] * completion_mask, completion_ids.float())


def test_a_tool_mask_filtered_in_trl_columns_masks_the_same_tokens_in_unsloths_loss():
    """The tool_mask the engine comparison filters (TRL's columns) is aligned by Unsloth's loss to its own; the
    realignment is the inverse of that alignment, so a filtered token is the one Unsloth's loss drops."""
    prompt_ids, completion_ids, completion_mask = _trl_batch()
    width = completion_ids.size(1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    left_pads = calculate_pad_tokens_in_prompt(input_ids, width, PAD)
    window = left_pack_padding(input_ids, PAD)[:, -(width + int(left_pads.max())) :]
    unsloth_mask = create_completion_attention_mask(window, left_pads, int(left_pads.max()), PAD).long()
    tool_mask = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1]])

    in_unsloths_loss = align_completion_tool_mask(tool_mask, unsloth_mask)
    back = grpo.unsloth_to_completion_coordinates(in_unsloths_loss, prompt_ids, PAD, width)
    assert torch.equal(back, tool_mask * completion_mask)


# --- a SEAL step on Unsloth's trainer ------------------------------------------------------------------------------

TASKS = ["multi_turn_base_0", "multi_turn_base_3"]


class ReportsThePolicysOwnLogprobs(HalfRightOnSome):
    """An engine that samples from the trained model itself: the log-prob it reports for each token is the policy's,
    at the rollout temperature, scored on the sequence alone (no padding)."""

    def __init__(self, model, tokenizer, tasks, learnable):
        super().__init__(tokenizer, tasks, learnable)
        self.model = model

    def generate(self, batch, max_new_tokens, temperature):
        out = super().generate(batch, max_new_tokens, temperature)
        self.sampled_logprobs = []
        with torch.no_grad():
            for context, ids in zip(batch, out, strict=True):
                logits = self.model(torch.tensor([list(context) + ids])).logits[0, len(context) - 1 : -1]
                logps = (logits.float() / temperature).log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])
                self.sampled_logprobs.append(logps.squeeze(-1).tolist())
        return out


class ClaimsCertainty(HalfRightOnSome):
    """An engine that reports log-prob 0 for every token: more than 5 nats from a random model's."""

    def generate(self, batch, max_new_tokens, temperature):
        out = super().generate(batch, max_new_tokens, temperature)
        self.sampled_logprobs = [[0.0] * len(ids) for ids in out]
        return out


def _unsloth_step(tmp_path, model_dir, monkeypatch, engine, mini_batches):
    """One SEAL step of two tasks with different prompt lengths, each group's rows of different completion
    lengths, on the unsloth backend's trainer; each micro-batch of the on-policy update holds the whole batch.
    ``engine(policy, tasks)``: the rollout engine."""
    monkeypatch.setattr(grpo, "SealGRPOTrainer", SealOverUnsloth)
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures",  # short prompts: these test the update
        "data.task_ids": TASKS, "grpo.tasks_per_step": 2, "grpo.steps": 1, "grpo.beta": 0.0,
        "grpo.learning_rate": 1e-2, "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
        "rollout.max_logprob_gap": 1.0, "grpo.mini_batches": mini_batches, "grpo.micro_batch_size": 4 // mini_batches,
    })
    tasks = {task.id: task.truncated(1) for task in load_tasks(TASKS)}
    store = Store(tmp_path / "seal.db")
    policy = dataclasses.replace(load_policy(model_dir, recipe), backend="unsloth")
    generator = engine(policy, list(tasks.values()))
    seal_step = SealStep(recipe, store, tasks, generator)
    trainer = grpo.build_trainer(policy, recipe, TASKS, seal_step, str(tmp_path / "trl"),
                                 callbacks=[grpo.StoreCallback(store, updates=grpo.updates_per_step(recipe))])
    trainer.train()
    return store, trainer


@pytest.mark.parametrize("mini_batches", [1, 2], ids=["on-policy", "old-log-probs"])
def test_on_unsloth_an_engine_sampling_from_the_policy_agrees_with_it_and_the_update_learns(
        tmp_path, tiny_model_dir, monkeypatch, mini_batches):
    """The engine's log-probs are the policy's own, so once Unsloth's are realigned every gap is float rounding and
    nothing is filtered; the LoRA moves, so Unsloth's loss had gradient log-probs (scored by itself on-policy)."""
    def engine(policy, tasks):
        return ReportsThePolicysOwnLogprobs(policy.model, policy.tokenizer, tasks, TASKS)

    store, trainer = _unsloth_step(tmp_path, tiny_model_dir, monkeypatch, engine, mini_batches)
    assert grpo.is_unsloths(type(trainer))
    batch = trainer.seal_batch
    assert len(set(map(len, batch.prompt_ids))) == 2 and len(set(map(len, batch.completion_ids))) > 1
    assert store.metrics("grpo/engine/logprob_gap_max")[0][1] < 1e-4
    assert store.metrics("grpo/engine/filtered_share") == [(1, 0.0)]
    assert any(torch.count_nonzero(p) > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)


@pytest.mark.parametrize("mini_batches", [1, 2], ids=["on-policy", "old-log-probs"])
def test_on_unsloth_the_tokens_the_engines_disagree_on_leave_unsloths_loss(tmp_path, tiny_model_dir, monkeypatch,
                                                                          mini_batches):
    """Every token is more than 1 nat off, so the filtered tool_mask takes all of them out of Unsloth's loss: the
    LoRA stays put."""
    def engine(policy, tasks):
        return ClaimsCertainty(policy.tokenizer, tasks, TASKS)

    store, trainer = _unsloth_step(tmp_path, tiny_model_dir, monkeypatch, engine, mini_batches)
    assert store.metrics("grpo/engine/logprob_gap_mean")[0][1] > 5
    assert store.metrics("grpo/engine/filtered_share") == [(1, 1.0)]
    assert all(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)


# --- Unsloth's trainer under another backend -----------------------------------------------------------------------

def test_a_policy_not_on_unsloth_is_refused_by_unsloths_patched_trainer(tmp_path, tiny_model_dir, monkeypatch):
    """``import unsloth`` patches TRL in the whole process, and its trainer calls ``model.for_training()``, which a peft
    model lacks: build_trainer refuses before any rollout, and says what to change."""
    monkeypatch.setattr(grpo, "SealGRPOTrainer", SealOverUnsloth)
    recipe = load_recipe(None, {"data.task_ids": TASKS, "grpo.tasks_per_step": 2, "rollout.num_generations": 2,
                                "policy.dtype": "float32"})
    policy = load_policy(tiny_model_dir, recipe)
    assert policy.backend == "peft"
    with pytest.raises(grpo.TrainerError, match=r"policy.backend peft, but the trainer is Unsloth's: .*"
                                                r"model.for_training\(\).*use policy.backend unsloth"):
        grpo.build_trainer(policy, recipe, TASKS, lambda task_ids: None, str(tmp_path / "trl"))


def test_log_probs_the_shared_prefix_scored_are_compared_in_trls_columns_on_unsloths_trainer(tmp_path,
                                                                                           tiny_model_dir):
    """The engine comparison moves Unsloth's scores back to TRL's columns, but log-probs the shared prefix scored
    are in TRL's columns already: compared as they are, an engine that agrees with them shows no gap and keeps
    every token (moved as if Unsloth's, the left-padded rows would index before their first column)."""
    from datasets import Dataset
    from trl import GRPOConfig

    recipe = load_recipe(None, {"policy.dtype": "float32"})
    policy = load_policy(tiny_model_dir, recipe)
    trainer = SealOverUnsloth(
        model=policy.model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, bf16=False,
                        use_cpu=True, report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": ["a"]}), processing_class=policy.tokenizer,
        peft_config=policy.peft_config, shared_prefix=True)
    pad = policy.tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad if token == PAD else token for token in row] for row in _trl_batch()[0].tolist()])
    _, completion_ids, completion_mask = _trl_batch()
    trained = torch.randn(completion_ids.shape, generator=torch.Generator().manual_seed(0))  # TRL's columns
    inputs = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "completion_mask": completion_mask,
              "tool_mask": torch.ones_like(completion_mask)}

    gap = trainer._filter_engine_gap(inputs, trained, trained.clone())
    assert torch.equal(gap, torch.zeros(int(completion_mask.sum())))
    assert torch.equal(inputs["tool_mask"], torch.ones_like(completion_mask))
