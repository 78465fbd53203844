"""TRL's GRPO loss for SEAL, checked against a reference written from the formulas (tiny random model, fp32).

The batch is real: one SEAL step over BFCL multi_turn_base_0 (two turns) with four scripted episodes, so every
completion holds model tokens and environment tokens (a tool result and the next user turn), rewards differ
within the group, and the diagnosis weights differ from 1. TRL prepares its inputs as in training
(``_generate_and_score_completions``); ``compute_loss`` and autograd then give the loss, its derivative with
respect to the loss mask (from which the per-token loss follows) and the LoRA gradients. The reference
recomputes them from plain forward passes of the same model, one unpadded sequence at a time:

    logp_t = log softmax(logits_{t-1} / T)[token_t]    ref_t: the same with the LoRA adapter disabled
    r_t    = exp(logp_t - old_t)                        on-policy old_t = logp_t, detached
    k3_t   = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    loss_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) + beta k3_t       (x r_t on k3_t: see below)

A is the trajectory's SEAL advantage read from the store; the mask is the trajectory's env_mask. Aggregation
(trl 1.14.2 grpo_trainer.py, _compute_loss, lines 3224-3245): grpo averages each trajectory's token mean; bnpo
divides the token sum by the mask's own token count; dapo by the generation batch's loss-token count, a constant
fixed at rollout time; dr_grpo by B x max_completion_length.

KL: trl 1.14.2 defaults to ``use_bias_correction_kl=True`` (lines 3175-3176), which multiplies k3 by the
differentiable ratio r_t. Its value is unchanged on-policy but its gradient gains k3 * grad(logp) everywhere;
docs/method.md §2 step 9 asks for plain low_var_kl (k3), so build_trainer turns the flag off. The reference
follows the trainer's flag, and both settings are compared.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.policy import load_policy
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo, shared_prefix
from tests.helpers import ScriptedGenerator, tool_call_text

TASK_ID = "multi_turn_base_0"
G = 4
BETA, EPSILON = 0.04, 0.2


def scripts(ground_truth: list[list[str]]) -> list[list[str]]:
    """One model call per turn: a pass, a wrong call, two empty turns, a pass then an empty turn."""
    return [
        [tool_call_text(ground_truth[0]), tool_call_text(ground_truth[1])],
        [tool_call_text(["mkdir(dir_name='x')"]), tool_call_text(ground_truth[1])],
        ["I cannot.", "No."],
        [tool_call_text(ground_truth[0]), "Done."],
    ]


class Case:
    """A trainer built from the recipe, TRL's prepared inputs for one SEAL step, and the reference computation."""

    def __init__(self, root, model_dir: str, loss_type: str, weighting: bool, temperature: float = 1.0,
                 dual_clip: float | None = None, dtype: str = "float32", backend: str = "peft",
                 checkpointing: bool | None = None):
        self.dtype = dtype
        self.recipe = load_recipe(None, {
            "interface.tool_format": "signatures",  # short prompts: these test the update
            "data.task_ids": [TASK_ID], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.loss_type": loss_type,
            "grpo.beta": BETA, "grpo.epsilon": EPSILON, "grpo.diagnosis_weighting": weighting,
            "rollout.num_generations": G, "rollout.max_turns": 2, "rollout.max_calls_per_turn": 1,
            "rollout.temperature": temperature, "policy.dtype": dtype, "diagnoser.mode": "off",
            "grpo.dual_clip": dual_clip, "policy.backend": backend, "policy.gradient_checkpointing": checkpointing,
            "policy.lora_r": 8, "policy.lora_alpha": 16,  # the rank the bf16 tolerances below were set at
            # the whole batch in one loss call, as below (test_training checks that micro-batches equal it)
            "grpo.micro_batch_size": G,
        })
        task = load_tasks([TASK_ID])[0].truncated(2)
        store = Store(root / "seal.db")
        policy = load_policy(model_dir, self.recipe)
        generator = ScriptedGenerator(policy.tokenizer, scripts(task.ground_truth))
        step = SealStep(self.recipe, store, {task.id: task}, generator)
        self.trainer = grpo.build_trainer(policy, self.recipe, [task.id], step, str(root / "trl"))
        self.model = self.trainer.model
        # a non-zero adapter, so the policy differs from the reference model and the KL term has a gradient
        seed = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=seed) * 0.5)
        if checkpointing:  # as Trainer.train switches it on, from TRL's config
            self.model.gradient_checkpointing_enable(self.trainer.args.gradient_checkpointing_kwargs)
        self.model.train()
        self.trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; compute_loss reads it
        assert self.trainer.shared_prefix  # the default: TRL's reference pass below scores with shared prefixes
        self.inputs = self.trainer._generate_and_score_completions([{"prompt": task.id}] * G)
        self.batch = self.trainer.seal_batch
        self.rows = store.trajectories(step=1)
        self.lora_names = [name for name, p in self.model.named_parameters() if "lora_" in name]
        self.lora = [p for name, p in self.model.named_parameters() if "lora_" in name]
        self.width = self.inputs["completion_ids"].shape[1]
        self.loss_positions = self.pad([torch.tensor(mask) for mask in self.batch.env_mask]).bool()
        self.env_positions = self.inputs["completion_mask"].bool() & ~self.loss_positions
        self.ref = self.logps(adapter=False)
        with torch.no_grad():
            self.current = self.logps(adapter=True)
        # TRL's own reference pass (one forward per trajectory) computes every completion position, environment
        # tokens included; the shared-prefix pass computes only loss tokens and leaves 0 elsewhere
        self.unshared_inputs = {**self.inputs, "ref_per_token_logps": self.trl_ref_logps()}
        noise = torch.Generator().manual_seed(2)
        # old log-probs = current + deterministic noise in [-0.3, 0.3]: some ratios leave [1 - eps, 1 + eps]
        self.off_policy_old = [lp + (torch.rand(len(lp), generator=noise) * 2 - 1) * 0.3 for lp in self.current]
        self._trl, self._reference = {}, {}

    def pad(self, rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(row, (0, self.width - len(row))) for row in rows])

    @contextlib.contextmanager
    def sharing(self, shared: bool):
        """The trainer with shared-prefix scoring on (its default) or off (TRL's forward pass per trajectory)."""
        before = self.trainer.shared_prefix
        self.trainer.shared_prefix = shared
        try:
            yield
        finally:
            self.trainer.shared_prefix = before

    def trl_ref_logps(self) -> torch.Tensor:
        """TRL's reference log-probs as its own scoring computes them (adapter disabled, one pass per row)."""
        ids = torch.cat([self.inputs["prompt_ids"], self.inputs["completion_ids"]], dim=1)
        mask = torch.cat([self.inputs["prompt_mask"], self.inputs["completion_mask"]], dim=1)
        with self.sharing(False), torch.no_grad(), self.model.disable_adapter():
            return self.trainer._get_per_token_logps_and_entropies(self.model, ids, mask, self.width)[0]

    def trl(self, inputs: dict, shared: bool = True):
        """TRL's loss, its derivative with respect to the loss mask (tool_mask), and the LoRA gradients."""
        inputs = dict(inputs)
        tool_mask = inputs["tool_mask"].float().requires_grad_(True)
        inputs["tool_mask"] = tool_mask
        with self.sharing(shared):
            loss = self.trainer.compute_loss(self.model, inputs)
        mask_grad, *grads = torch.autograd.grad(loss, [tool_mask, *self.lora])
        return loss.detach(), mask_grad, grads

    def inputs_for(self, policy: str, shared: bool = True) -> dict:
        inputs = self.inputs if shared else self.unshared_inputs
        if policy == "on":
            return inputs
        return {**inputs, "old_per_token_logps": self.pad(self.off_policy_old)}

    def trl_result(self, policy: str, shared: bool = True):
        """``trl`` on the case's on- or off-policy inputs, computed once (the tests share a case)."""
        if (policy, shared) not in self._trl:
            self._trl[policy, shared] = self.trl(self.inputs_for(policy, shared), shared)
        return self._trl[policy, shared]

    # ---- the reference: plain forward passes and the formulas, nothing from TRL ----

    def logps(self, adapter: bool) -> list[torch.Tensor]:
        """Per-token log-probabilities of each completion, one unpadded sequence at a time."""
        temperature = self.recipe.rollout.temperature  # the distribution the rollouts were sampled from
        out = []
        for prompt, completion in zip(self.batch.prompt_ids, self.batch.completion_ids, strict=True):
            ids = torch.tensor([prompt + completion])
            if adapter:
                logits = self.model(input_ids=ids, logits_to_keep=len(completion) + 1, use_cache=False).logits
            else:
                with torch.no_grad(), self.model.disable_adapter():
                    logits = self.model(input_ids=ids, logits_to_keep=len(completion) + 1, use_cache=False).logits
            # logits at position t predict token t + 1: the last prompt position predicts the first completion token
            logprobs = torch.log_softmax(logits[0, :-1].float() / temperature, dim=-1)
            out.append(logprobs.gather(-1, torch.tensor(completion)[:, None])[:, 0])
        return out

    def per_token_loss(self, logps, old, kl_times_ratio: bool) -> list[torch.Tensor]:
        out = []
        advantages = [row["weighted_advantage"] for row in self.rows]
        cap = self.recipe.grpo.dual_clip or float("inf")  # dual-clip: the unclipped ratio is capped at c
        for logp, old_row, ref_row, advantage in zip(logps, old, self.ref, advantages, strict=True):
            ratio = torch.exp(logp - old_row)
            surrogate = torch.minimum(ratio.clamp(max=cap) * advantage,
                                      ratio.clamp(1 - EPSILON, 1 + EPSILON) * advantage)
            k3 = torch.exp(ref_row - logp) - (ref_row - logp) - 1
            out.append(-surrogate + BETA * (k3 * ratio if kl_times_ratio else k3))
        return out

    def aggregate(self, per_token: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
        loss_type = self.recipe.grpo.loss_type
        total = sum((loss * mask).sum() for loss, mask in zip(per_token, masks, strict=True))
        if loss_type == "grpo":  # each trajectory's token mean, then the mean over trajectories
            means = [(loss * mask).sum() / mask.sum().clamp(min=1) for loss, mask in zip(per_token, masks)]
            return torch.stack(means).mean()
        if loss_type == "bnpo":  # token mean, counting the tokens of the mask it is given
            return total / sum(mask.sum() for mask in masks).clamp(min=1)
        if loss_type == "dapo":  # token sum over the generation batch's loss-token count, fixed at rollout time
            return total / max(1, sum(sum(mask) for mask in self.batch.env_mask))
        if loss_type == "dr_grpo":  # a constant: B x the configured maximum completion length
            return total / (len(masks) * self.recipe.rollout.max_context_tokens)
        raise AssertionError(loss_type)

    def reference(self, policy: str, kl_times_ratio: bool):
        """Reference loss, derivative with respect to the mask, LoRA gradients and per-token loss (padded)."""
        if (policy, kl_times_ratio) not in self._reference:
            self._reference[policy, kl_times_ratio] = self._compute_reference(policy, kl_times_ratio)
        return self._reference[policy, kl_times_ratio]

    def _compute_reference(self, policy: str, kl_times_ratio: bool):
        logps = self.logps(adapter=True)
        old = [logp.detach() for logp in logps] if policy == "on" else self.off_policy_old
        per_token = self.per_token_loss(logps, old, kl_times_ratio)
        masks = [torch.tensor(mask, dtype=torch.float32, requires_grad=True) for mask in self.batch.env_mask]
        loss = self.aggregate(per_token, masks)
        grads = torch.autograd.grad(loss, [*masks, *self.lora])
        mask_grad = self.pad(list(grads[: len(masks)]))
        return loss.detach(), mask_grad, list(grads[len(masks):]), self.pad([t.detach() for t in per_token])


@functools.cache
def _case(root, model_dir: str, loss_type: str, weighting: bool, dual_clip: float | None = None,
          dtype: str = "float32", backend: str = "peft", checkpointing: bool | None = None) -> Case:
    return Case(root / f"{loss_type}-{weighting}-{dual_clip}-{dtype}-{backend}-{checkpointing}", model_dir, loss_type,
                weighting, dual_clip=dual_clip, dtype=dtype, backend=backend, checkpointing=checkpointing)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on 2 shared cores one thread is 2-3x faster than two contending ones
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def case(tmp_path_factory, tiny_model_dir):
    """Cases are built once per (loss type, weighting) and shared: TRL's compute_loss leaves them unchanged."""
    root = tmp_path_factory.mktemp("grpo_reference")
    yield lambda loss_type, weighting, dual_clip=None, dtype="float32", **policy: _case(
        root, tiny_model_dir, loss_type, weighting, dual_clip, dtype, **policy)
    _case.cache_clear()


def assert_close(actual, expected, what: str, rtol=1e-4, atol_scale=1e-5):
    """allclose with the absolute tolerance scaled to the largest expected value (fp32 sums over ~600 tokens)."""
    scale = float(expected.abs().max())
    assert scale > 0, f"{what}: the reference is all zeros, the comparison would prove nothing"
    diff = float((actual - expected).abs().max())
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol_scale * scale), f"{what}: {diff:.3g} of {scale:.3g}"


def gradient_difference(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> tuple[float, float]:
    """(|actual - expected| / |expected|, cosine) of the LoRA gradients taken as one vector."""
    actual, expected = (torch.cat([g.flatten() for g in gs]) for gs in (actual, expected))
    relative = float((actual - expected).norm() / expected.norm())
    return relative, float(torch.nn.functional.cosine_similarity(actual, expected, dim=0))


def compare_bf16(c: Case, policy: str, kl_times_ratio: bool, trl_result=None, shared: bool = True):
    """``compare`` for a base model computing in bf16 (8 mantissa bits): TRL's padded batch and the reference's
    unpadded rows round differently, and off-policy ratios near the clip bounds can fall either side, so single
    entries differ by up to a fifth of the largest (measured: the whole LoRA gradient within 0.21 of its norm,
    cosine 0.98, dapo off-policy; 0.012 and 0.9999 on-policy). The loss is compared to 2%, the gradient as one
    vector; a loss on environment tokens moves it by more than 1000 times its norm."""
    loss, _, grads = trl_result or c.trl_result(policy, shared)
    ref_loss, _, ref_grads, _ = c.reference(policy, kl_times_ratio)
    assert torch.allclose(loss, ref_loss, rtol=2e-2), (float(loss), float(ref_loss))
    relative, cosine = gradient_difference(grads, ref_grads)
    assert relative < 0.3 and cosine > 0.95, (relative, cosine)


def compare(c: Case, policy: str, kl_times_ratio: bool, trl_result=None, shared: bool = True):
    loss, mask_grad, grads = trl_result or c.trl_result(policy, shared)
    ref_loss, ref_mask_grad, ref_grads, ref_per_token = c.reference(policy, kl_times_ratio)

    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-7), (float(loss), float(ref_loss))
    # d loss / d mask: each token's loss times its weight in the aggregation (for grpo and bnpo also the
    # normaliser's dependence on the mask). Padding excluded; environment positions included where the pass
    # computes their log-probs (one pass per trajectory): the shared-prefix pass computes none, its per-token
    # loss there is another number that the mask removes
    positions = c.inputs["completion_mask"].bool() if not shared else c.loss_positions
    assert_close(mask_grad[positions], ref_mask_grad[positions], "d loss / d mask", atol_scale=1e-3)
    loss_type = c.recipe.grpo.loss_type
    if loss_type in ("dapo", "dr_grpo"):
        # linear in the mask: normaliser x derivative is TRL's per-token loss itself
        normaliser = c.loss_positions.sum() if loss_type == "dapo" else G * c.recipe.rollout.max_context_tokens
        per_token = mask_grad * normaliser
        assert_close(per_token[c.loss_positions], ref_per_token[c.loss_positions], "per-token loss")
    for name, grad, ref_grad in zip(c.lora_names, grads, ref_grads, strict=True):
        assert_close(grad, ref_grad, name)
    return ref_grads


@pytest.mark.parametrize("weighting", [True, False], ids=["weighted", "unweighted"])
def test_batch_is_informative(case, weighting):
    """Guards the comparisons below against a degenerate batch that would let them pass trivially."""
    c = case("dapo", weighting)
    assert [row["reward"] for row in c.rows] == [1.0, 0.0, 0.0, 0.0]
    weights = [row["weight"] for row in c.rows]
    if weighting:
        assert len({round(w, 6) for w in weights}) >= 3 and any(abs(w - 1) > 0.2 for w in weights)
    else:
        assert weights == [1.0] * G
    advantages = [row["weighted_advantage"] for row in c.rows]
    assert advantages == pytest.approx([row["advantage"] * row["weight"] for row in c.rows])
    # every completion starts and ends with model tokens and holds environment tokens in between
    for mask in c.batch.env_mask:
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
    # TRL received SEAL's advantages, and its loss mask is SEAL's env_mask
    assert c.inputs["advantages"].tolist() == pytest.approx(advantages, rel=1e-6)
    assert (c.inputs["completion_mask"] * c.inputs["tool_mask"]).bool().equal(c.loss_positions)
    # TRL's reference log-probs are the model's with the adapter disabled; the adapter moved the policy away
    # from them far enough for the KL term to count
    assert torch.allclose(c.inputs["ref_per_token_logps"][c.loss_positions], c.pad(c.ref)[c.loss_positions], atol=1e-5)
    k3 = [torch.exp(r - lp) - (r - lp) - 1 for lp, r in zip(c.current, c.ref)]
    assert BETA * float(torch.cat(k3).mean()) > 1e-4  # > 25x the loss tolerance below
    # the off-policy old log-probs put some loss tokens outside the clip range and some inside
    ratio = torch.exp(c.pad(c.current) - c.pad(c.off_policy_old))[c.loss_positions]
    outside = (ratio < 1 - EPSILON) | (ratio > 1 + EPSILON)
    assert 0.2 < float(outside.float().mean()) < 0.8


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "per-trajectory"])
@pytest.mark.parametrize(("loss_type", "weighting", "policy"), [
    *[(loss_type, weighting, policy) for loss_type in ("dapo", "grpo")
      for weighting, policy in ((True, "on"), (True, "off"), (False, "off"))],
    ("bnpo", True, "off"),
    ("dr_grpo", True, "off"),
])
def test_loss_and_lora_gradients_match_reference(case, loss_type, weighting, policy, shared):
    c = case(loss_type, weighting)
    compare(c, policy, kl_times_ratio=c.trainer.args.use_bias_correction_kl, shared=shared)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "per-trajectory"])
@pytest.mark.parametrize(("loss_type", "policy"), [("dapo", "off"), ("grpo", "on")])
def test_bf16_loss_and_lora_gradients_match_reference(case, loss_type, policy, shared):
    """The same comparison with the base model computing in bf16 (LoRA weights fp32), whatever this CPU's auto."""
    c = case(loss_type, True, dtype="bfloat16")
    assert c.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert {p.dtype for p in c.lora} == {torch.float32}
    compare_bf16(c, policy, kl_times_ratio=c.trainer.args.use_bias_correction_kl, shared=shared)


def test_bf16_tolerances_still_catch_environment_tokens_in_the_loss(case):
    """The bf16 tolerance is not loose enough to pass a wrong mask: a loss over every completion token (TRL
    without the env_mask) leaves it."""
    c = case("dapo", True, dtype="bfloat16")
    inputs = {**c.inputs_for("off"), "tool_mask": torch.ones_like(c.inputs["tool_mask"])}
    with pytest.raises(AssertionError):
        compare_bf16(c, "off", kl_times_ratio=c.trainer.args.use_bias_correction_kl, trl_result=c.trl(inputs))


def test_both_kl_variants_match_reference(case):
    """With the flag off TRL's KL is the paper's k3; the two variants' gradients differ, so the reference tells."""
    c = case("dapo", True)
    flag = c.trainer.args.use_bias_correction_kl
    try:
        c.trainer.args.use_bias_correction_kl = not flag
        other = compare(c, "on", kl_times_ratio=not flag, trl_result=c.trl(c.inputs_for("on")))
    finally:
        c.trainer.args.use_bias_correction_kl = flag
    this = c.reference("on", kl_times_ratio=flag)[2]
    assert max(float((a - b).abs().max()) for a, b in zip(this, other)) > 1e-3 * max(float(g.abs().max()) for g in this)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prefix", "per-trajectory"])
def test_environment_tokens_carry_no_loss_or_gradient(case, shared):
    """Wild old and reference log-probs on environment positions change nothing: the mask removes them.

    The derivative with respect to the mask is non-zero there, so the zero contribution comes from the mask,
    not from a loss that happens to vanish; and the same change on one model token does move the loss.
    """
    c = case("dapo", True)
    env = c.env_positions
    inputs = c.inputs_for("off", shared)
    loss, mask_grad, grads = c.trl_result("off", shared)
    assert float(mask_grad[env].abs().min()) > 0
    old, ref = inputs["old_per_token_logps"], inputs["ref_per_token_logps"]
    wild_loss, _, wild_grads = c.trl({**inputs, "old_per_token_logps": old - 5.0 * env,
                                      "ref_per_token_logps": ref + 5.0 * env}, shared)
    assert torch.equal(loss, wild_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, wild_grads, strict=True))
    moved = old.clone()
    moved[tuple(torch.nonzero(c.loss_positions)[0].tolist())] -= 5.0
    with torch.no_grad(), c.sharing(shared):
        assert not torch.equal(c.trainer.compute_loss(c.model, {**inputs, "old_per_token_logps": moved}), loss)


def test_trainer_uses_the_papers_kl(case):
    assert case("dapo", True).trainer.args.use_bias_correction_kl is False  # both variants verified above


def test_log_probs_are_scored_at_the_rollout_temperature(tmp_path, tiny_model_dir):
    c = Case(tmp_path, tiny_model_dir, "dapo", True, temperature=0.7)
    assert torch.allclose(c.inputs["ref_per_token_logps"][c.loss_positions], c.pad(c.ref)[c.loss_positions], atol=1e-5)


# ---- shared-prefix scoring (issue 16): the same numbers as one forward pass per trajectory ----


def max_relative_difference(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest |actual - expected| of each pair, relative to the largest |expected| entry of that pair."""
    return max(float((a - e).abs().max() / e.abs().max()) for a, e in zip(actual, expected, strict=True)
               for a, e in [(a.detach(), e.detach())])


@pytest.mark.parametrize(("loss_type", "weighting", "policy", "dual_clip"), [
    *[(loss_type, weighting, policy, None) for loss_type in ("dapo", "grpo", "bnpo", "dr_grpo")
      for weighting in (True, False) for policy in ("on", "off")],
    ("dapo", True, "off", 1.25),  # the dual-clip cap binds on some ratios (they reach 1.35)
])
def test_shared_prefix_loss_and_lora_gradients_equal_one_pass_per_trajectory(case, loss_type, weighting, policy,
                                                                             dual_clip):
    """The G = 4 trajectories share their prompt: scoring them with it computed once gives TRL's loss, its
    derivative on every loss token and every LoRA gradient as one pass per trajectory does (fp32, to float
    summation order), for every loss type, with and without diagnosis weights, on-policy and with clipped ratios,
    with the KL term on (beta > 0, reference pass with the adapter disabled)."""
    c = case(loss_type, weighting, dual_clip)
    shared_loss, shared_mask_grad, shared_grads = c.trl_result(policy, shared=True)
    loss, mask_grad, grads = c.trl_result(policy, shared=False)
    assert float(loss.abs()) > 1e-4 and all(float(g.abs().max()) > 0 for g in grads)  # a real signal
    assert torch.allclose(shared_loss, loss, rtol=1e-5, atol=1e-7), (float(shared_loss), float(loss))
    on = c.loss_positions
    # (grpo on-policy: each token's loss minus its row's mean, a difference of near-equal numbers)
    assert max_relative_difference([shared_mask_grad[on]], [mask_grad[on]]) < 1e-4
    assert max_relative_difference(shared_grads, grads) < 2e-5, "LoRA gradients differ"  # measured: at most 7e-6
    if dual_clip:  # the cap is what these inputs test: it binds on some tokens with a negative advantage
        ratio = torch.exp(c.pad(c.current) - c.pad(c.off_policy_old))[on]
        advantages = torch.tensor([row["weighted_advantage"] for row in c.rows])[:, None].expand_as(on)[on]
        assert bool(((ratio > dual_clip) & (advantages < 0)).any())


@pytest.fixture
def trl_log_softmax_in_fp32(monkeypatch):
    """TRL's pass per trajectory takes the log-softmax of 16-bit logits in 16 bits (bf16 log-probs near -10 are 0.06
    apart, and the off-policy ratio exp(new - old) moves by as much); the shared prefix takes it in fp32. The 16-bit
    comparisons of the two give TRL's pass the same fp32 log-softmax, so that they compare the passes, not that
    rounding."""
    from trl.trainer import grpo_trainer

    plain, with_entropy = grpo_trainer.selective_log_softmax, grpo_trainer.selective_log_softmax_and_entropy
    monkeypatch.setattr(grpo_trainer, "selective_log_softmax",
                        lambda logits, *args, **kwargs: plain(logits.float(), *args, **kwargs))
    monkeypatch.setattr(grpo_trainer, "selective_log_softmax_and_entropy",
                        lambda logits, *args, **kwargs: with_entropy(logits.float(), *args, **kwargs))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_bf16_shared_prefix_loss_and_lora_gradients_equal_one_pass_per_trajectory(case, loss_type,
                                                                                  trl_log_softmax_in_fp32):
    """In bf16 the shared prefix's keys and values are the same bf16 numbers TRL's padded rows compute, so the
    two passes differ only in summation order and padding: far less than either differs from the fp32-style
    reference above."""
    c = case(loss_type, True, dtype="bfloat16")
    shared_loss, _, shared_grads = c.trl_result("off", shared=True)
    loss, _, grads = c.trl(c.inputs_for("off", shared=False), shared=False)  # not the cached 16-bit softmax's
    assert float(loss.abs()) > 1e-4 and all(float(g.abs().max()) > 0 for g in grads)
    assert torch.allclose(shared_loss, loss, rtol=1e-3), (float(shared_loss), float(loss))
    relative, _ = gradient_difference(shared_grads, grads)
    assert relative < 0.05, relative  # measured on an AVX512_BF16 Xeon: 0.013 (dapo), 0.007 (grpo)


def test_shared_prefix_log_probs_equal_one_pass_per_trajectory(case):
    """Per-token log-probs, with gradients as the loss computes them: equal to TRL's pass per trajectory and to
    the plain reference on every loss token. The prompt runs through the model once (not G times), and logits
    are computed for loss tokens only (environment tokens inside the completions get none)."""
    c = case("dapo", True)
    trainer, inputs = c.trainer, c.inputs
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    decoder, head = shared_prefix.decoder_and_head(c.model)
    tokens, head_rows = [], []
    hooks = [decoder.register_forward_pre_hook(lambda _, args, kwargs: tokens.append(kwargs["input_ids"].numel()),
                                               with_kwargs=True),
             head.register_forward_pre_hook(lambda _, args: head_rows.append(args[0].shape[:-1].numel()))]
    scores = {}
    try:
        for shared in (True, False):
            tokens.clear(), head_rows.clear()
            c.trainer._loss_positions = inputs["completion_mask"] * inputs["tool_mask"]
            with c.sharing(shared):
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(c.model, ids, mask, c.width,
                                                                                 compute_entropy=True)
            c.trainer._loss_positions = None
            scores[shared] = (logps, entropies, sum(tokens), sum(head_rows))
    finally:
        for hook in hooks:
            hook.remove()
    on = c.loss_positions
    (logps, entropies, tokens, rows), (logps_1, entropies_1, tokens_1, rows_1) = scores[True], scores[False]
    assert logps.requires_grad and logps_1.requires_grad
    assert max_relative_difference([logps[on]], [logps_1[on]]) < 1e-6
    assert max_relative_difference([logps[on]], [c.pad(c.current)[on]]) < 1e-6
    assert max_relative_difference([entropies[on]], [entropies_1[on]]) < 1e-6
    assert float(logps.detach()[~on].abs().max()) == 0.0  # nothing computed, nothing returned, off the loss tokens
    prompt = len(c.batch.prompt_ids[0])
    assert all(len(ids) == prompt for ids in c.batch.prompt_ids) and prompt > 300
    assert tokens_1 == G * ids.size(1)  # TRL: every row, padding included
    assert tokens <= prompt + sum(len(completion) + 1 for completion in c.batch.completion_ids)  # the prompt once
    assert rows_1 == G * (c.width + 1) and rows <= int(on.sum())  # logits: TRL every position, here loss tokens


def test_a_detached_prefix_would_fail_the_comparison(case, monkeypatch):
    """The comparison above can fail: cut the gradient from the suffixes into the prefix's keys and values (the
    approximation the issue rules out) and the LoRA gradients move far outside its tolerance."""
    c = case("dapo", True)
    update = shared_prefix.PrefixLayer.update

    def detached(self, key_states, value_states, *args, **kwargs):
        if self.prefix is not None:
            self.prefix = tuple(tensor.detach() for tensor in self.prefix)
        return update(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(shared_prefix.PrefixLayer, "update", detached)
    loss, _, grads = c.trl(c.inputs_for("off"), shared=True)
    expected_loss, _, expected_grads = c.trl_result("off", shared=False)
    assert torch.allclose(loss, expected_loss, rtol=1e-5)  # the same values: only the gradient is cut
    assert max_relative_difference(grads, expected_grads) > 1e-2


def test_the_prefixs_keys_and_values_are_freed_before_its_own_backward(tiny_model_dir, monkeypatch):
    """Memory: once every suffix's backward has gone through the prefix's keys and values, nothing holds them
    (gradient checkpointing recomputes what the prefix's layers need), so they are gone while the prefix's layers
    are still being backpropagated; the gradients are those of one pass per trajectory."""
    import weakref

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompt, tails = list(range(100, 140)), [[7, 8, 9, 10], [7, 11, 12, 13], [14, 15, 16, 17]]
    input_ids = torch.tensor([prompt + tail for tail in tails])
    mask, scored = torch.ones_like(input_ids), torch.ones(len(tails), 4, dtype=torch.bool)

    kept = []
    release = shared_prefix.PrefixRelease.__init__

    def recording(self, prefix, suffixes):
        kept.extend(weakref.ref(tensor) for pair in prefix for tensor in pair)
        release(self, prefix, suffixes)

    monkeypatch.setattr(shared_prefix.PrefixRelease, "__init__", recording)
    alive_in_prefix_backward = []
    decoder, _ = shared_prefix.decoder_and_head(model)

    def on_first_forward(module, args, output):
        if not alive_in_prefix_backward:  # the prefix pass: its next-to-last layer's output gets its gradient
            hidden = output[0] if isinstance(output, tuple) else output  # from the last layer's backward
            hidden.register_hook(lambda grad: alive_in_prefix_backward.append(sum(r() is not None for r in kept)))
            alive_in_prefix_backward.append(None)

    handle = decoder.layers[-2].register_forward_hook(on_first_forward)
    logps, _ = shared_prefix.score_completions(model, input_ids, mask, 4, scored, 1.0)
    handle.remove()
    (logps * torch.arange(1, 13.0).view(3, 4)).sum().backward()
    shared = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    assert len(kept) == 2 * len(decoder.layers) and alive_in_prefix_backward == [None, 0]

    model.zero_grad()
    for row in range(len(tails)):  # one pass per trajectory
        full = model(input_ids=input_ids[row : row + 1]).logits[0, -5:-1].log_softmax(-1)
        (full.gather(-1, input_ids[row, -4:, None])[:, 0] * torch.arange(4 * row + 1, 4 * row + 5.0)).sum().backward()
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            assert torch.allclose(shared[name], parameter.grad, atol=1e-6), name


def tokens_read(model) -> tuple[list[int], object]:
    """A counter of the tokens the decoder embeds (every forward pass over them, recomputes included)."""
    count = [0]
    decoder, _ = shared_prefix.decoder_and_head(model)
    handle = decoder.embed_tokens.register_forward_pre_hook(
        lambda module, args, kwargs=None: count.__setitem__(0, count[0] + args[0].numel()))
    return count, handle


@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointing", "no-checkpointing"])
def test_kept_suffix_graphs_give_the_same_gradients_and_read_each_suffix_once(tiny_model_dir, checkpointing):
    """With the model's gradient checkpointing a suffix may keep its graph (its layers' inputs) for the backward
    pass instead of being recomputed there: within ``hold_bytes`` it is read once, beyond it twice, and the
    log-probs and LoRA gradients are the same either way. Without checkpointing nothing is kept (a kept graph would
    be every activation)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # a non-zero adapter: every LoRA matrix then has a gradient
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    prompt, tails = list(range(100, 140)), [[7, 8, 9, 10], [7, 11, 12, 13], [14, 15, 16, 17]]
    input_ids = torch.tensor([prompt + tail for tail in tails])
    mask, scored = torch.ones_like(input_ids), torch.ones(len(tails), 4, dtype=torch.bool)
    decoder, head = shared_prefix.decoder_and_head(model)
    config = decoder.config
    prefix = shared_prefix.split_point(input_ids.tolist())  # 40 prompt tokens and the shared 7: 40 in the prefix
    suffix = input_ids.size(1) - prefix  # 5 tokens each
    one = shared_prefix.held_bytes(config.num_hidden_layers, config.hidden_size, suffix, head.weight.element_size())

    def score(hold_bytes: float):
        model.zero_grad()
        count, handle = tokens_read(model)
        logps, _ = shared_prefix.score_completions(model, input_ids, mask, 4, scored, 1.0, hold_bytes=hold_bytes)
        (logps * torch.arange(1, 13.0).view(3, 4)).sum().backward()
        handle.remove()
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}, count[0]

    recomputed, kept, one_kept = score(0.0), score(float("inf")), score(one)
    assert recomputed[2] == prefix + 2 * 3 * suffix
    assert kept[2] == prefix + (1 if checkpointing else 2) * 3 * suffix
    assert one_kept[2] == prefix + (5 if checkpointing else 6) * suffix  # the first suffix kept, two recomputed
    for logps, grads, _ in (kept, one_kept):
        assert torch.allclose(logps, recomputed[0], atol=1e-6)
        assert all(torch.allclose(grads[n], recomputed[1][n], atol=1e-6) for n in grads)
    assert all(float(g.abs().max()) > 0 for g in recomputed[1].values())


def test_on_the_gpu_recipes_4bit_backend_each_groups_prompt_is_read_once_with_the_same_gradients(case, monkeypatch,
                                                                                                 trl_log_softmax_in_fp32):
    """The GPU recipes' backend (peft-4bit: NF4 base weights, bf16 compute, gradient checkpointing), suffix graphs
    kept as on a GPU with memory free: TRL's loss and LoRA gradients with the group's prompt computed once agree
    with one pass per trajectory as the bf16 comparison above does, and the decoder reads the prompt once (the
    split point, then each trajectory's rest) where TRL's scoring reads every padded row whole."""
    from bitsandbytes.nn import Linear4bit

    c = case("grpo", True, dtype="bfloat16", backend="peft-4bit", checkpointing=True)
    assert sum(isinstance(module, Linear4bit) for module in c.model.modules()) > 0
    monkeypatch.setattr(grpo, "hold_budget", lambda device: float("inf"))  # every suffix kept, whatever RAM is free
    rows = [prompt + completion for prompt, completion in zip(c.batch.prompt_ids, c.batch.completion_ids)]
    prefix = shared_prefix.split_point(rows)
    read = {}
    for shared in (True, False):
        count, handle = tokens_read(c.model)
        read[shared] = (c.trl(c.inputs_for("off", shared), shared), count[0])
        handle.remove()
    (shared_loss, _, shared_grads), (loss, _, grads) = read[True][0], read[False][0]
    assert prefix > 100 and read[True][1] == prefix + sum(len(row) - prefix for row in rows)
    assert read[False][1] == len(rows) * (c.inputs["prompt_ids"].size(1) + c.width)
    assert float(loss.abs()) > 1e-4 and all(float(g.abs().max()) > 0 for g in grads)
    assert torch.allclose(shared_loss, loss, rtol=1e-3), (float(shared_loss), float(loss))
    relative, _ = gradient_difference(shared_grads, grads)
    assert relative < 0.05, relative


# --- the update as a T4 runs it: fp16, checkpointed suffixes, the budget for kept graphs ---------------------------

def test_log_probs_are_fp32_whatever_the_models_dtype():
    """A T4's policy computes in fp16, where log-probs near -10 are 0.008 apart: the LM head's logits go to fp32
    before the log-softmax, so the log-probs (and the ratio TRL takes of them) keep fp32's precision."""
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(64, 4096, bias=False).half()
    with torch.no_grad():
        head.weight.copy_(torch.randn(4096, 64, generator=generator) * 0.5)
    hidden = torch.randn(300, 64, generator=generator).half()
    targets = torch.randint(0, 4096, (300,), generator=generator)
    logps, entropies = shared_prefix.head_logps(head, hidden, targets, 0.7, entropy=True, entropy_grad=False,
                                                recompute=False)
    reference = (head(hidden).double() / 0.7).log_softmax(-1)  # the fp16 logits, then exact arithmetic
    assert logps.dtype == entropies.dtype == torch.float32
    assert float((logps.detach().double() - reference.gather(1, targets[:, None])[:, 0]).abs().max()) < 1e-5
    assert logps.min() < -10  # where fp16 rounds a log-prob by up to 0.004


def test_the_recomputed_suffix_is_checkpointed_with_its_tokens_as_an_argument(tiny_model_dir, monkeypatch):
    """torch stashes and restores the RNG of the devices of a checkpoint's tensor arguments only: a suffix
    recomputed in the backward pass must get its tokens as an argument, or on a GPU its replay would draw other
    LoRA dropout masks than its forward did (the CPU's RNG is always stashed, so only the call shows it here)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    calls = []
    checkpoint = shared_prefix.checkpoint

    def recording_checkpoint(function, *args, **kwargs):
        calls.append((function.__name__, [type(arg) for arg in args]))
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(shared_prefix, "checkpoint", recording_checkpoint)
    input_ids = torch.tensor([list(range(100, 130)) + tail for tail in ([7, 8, 9], [7, 10, 11])])
    logps, _ = shared_prefix.score_completions(model, input_ids, torch.ones_like(input_ids), 3,
                                               torch.ones(2, 3, dtype=torch.bool), 1.0, hold_bytes=0.0)
    logps.sum().backward()
    suffixes = [types for name, types in calls if name == "suffix_logps"]
    assert len(suffixes) == 2 and all(torch.Tensor in types for types in suffixes)


def test_the_budget_for_kept_suffix_graphs_counts_the_allocators_cache(monkeypatch):
    """After the rollouts PyTorch keeps their KV cache's memory for itself: the driver reports it taken, yet the
    update's tensors would get it. The budget is half of the driver's free memory plus that cache; on a CPU, half
    the RAM available."""
    import psutil

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * gib, 16 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 9 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * gib)
    assert shared_prefix.hold_budget(torch.device("cuda", 0)) == shared_prefix.HOLD_SHARE * 8 * gib
    available = psutil.virtual_memory().available
    assert 0.4 * available < shared_prefix.hold_budget(torch.device("cpu")) < 0.6 * available
