"""The masking self-test of `seal-lite doctor`: one real multi-turn GRPO step, checking that only the tokens the
policy generated carry loss and gradient (``masking_self_test``'s docstring says how).

Heavy libraries (torch, transformers, trl) are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class SelfTestResult:
    passed: bool
    message: str  # "ok", or every check that failed, separated by "; "
    model: str
    task_id: str
    trajectories: int = 0
    model_tokens: int = 0  # tokens the policy generated, inside the completions
    env_tokens: int = 0  # environment tokens inside the completions (user turns, tool results, template glue)
    tool_results: int = 0  # tool messages inside the completions (the rest is user turns and template glue)
    max_env_grad: float | None = None  # max |dL/dlogit| on the logits that predict environment tokens
    min_model_grad: float | None = None  # per position: max over the vocabulary of |dL/dlogit|
    mean_model_grad: float | None = None
    loss: float | None = None
    backend: str = "peft"
    dtype: str | None = None  # the compute dtype the step trained in
    linear4bit_layers: int = 0  # bitsandbytes NF4 layers in the policy (peft-4bit)
    trainable_dtypes: list[str] = dataclasses.field(default_factory=list)  # of the LoRA parameters: fp32 only
    lora_changed: int = 0  # LoRA entries the GRPO step moved (of lora_entries)
    lora_entries: int = 0
    seconds: float = 0.0


def masking_self_test(model_dir: str, *, task_id: str = "multi_turn_base_0", turns: int = 2,
                      num_generations: int = 2, max_new_tokens: int = 16, max_model_calls: int = 4,
                      seed: int = 0, dtype: str = "auto", backend: str = "peft",
                      label: str | None = None) -> SelfTestResult:
    """Check on one real multi-turn GRPO step that only the tokens the policy generated carry loss and gradient.

    The model at ``model_dir`` rolls out ``num_generations`` trajectories of the real BFCL task ``task_id``, cut
    to ``turns`` user turns, through the real SEAL step (``SealStep`` with a ``TransformersGenerator``) called by
    TRL's ``rollout_func`` inside the real trainer (``build_trainer``); one ``trainer.train()`` step follows. The
    completions thus hold model tokens and environment tokens (the next user turn, chat-template glue, tool
    results when the model called a tool). Which is which is taken from the generator itself (every sequence it
    produced, found again in the completions), independently of the ``env_mask`` the loop computed. Checks:

    1. the loop's ``env_mask`` marks exactly the generated tokens;
    2. the loss is zero on environment tokens: TRL's loss mask (``completion_mask * tool_mask`` in the output of
       ``_generate_and_score_completions``) is 1 on generated tokens and 0 on environment tokens and padding;
    3. gradients flow only from model tokens: a hook keeps the gradient of the logits in the trainer's loss
       computation (``compute_loss``, then backward). Logits at position t predict token t+1, so the rows that
       predict environment tokens, prompt tokens or padding must get exactly zero gradient, and every row that
       predicts a model token a non-zero one.

    This tests masking, not rewards: a small model usually earns reward 0 on every trajectory, so A = 0 and no
    gradient at all would flow. The advantages the loop computed are therefore replaced by +1/-1 within each
    group before TRL sees them. The step trains in ``dtype`` (auto: the dtype a run would train in) with
    ``backend`` (peft, or peft-4bit: the same step on NF4 ``Linear4bit`` layers, also on a CPU; not unsloth, whose
    fused loss never materialises the logits the probe reads), and with beta = 0: at the first update the KL term
    has zero gradient anyway, and this skips the reference model's forward pass. Besides masking it checks that
    the update moved the LoRA weights and that they are fp32. Store and trainer output go to a temporary
    directory, deleted afterwards. For smollm2-135m on 2 AVX2 cores (fp32): about 65 s with peft, 7-9 minutes
    with peft-4bit (bitsandbytes' CPU NF4 kernels dequantize every weight on every call).
    """
    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.policy import count_linear4bit, load_policy
    from seal_lite.engines.store import Store
    from seal_lite.engines.transformers_generate import TransformersGenerator
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.algorithm import SealStep
    from seal_lite.training.grpo import build_trainer

    if backend not in ("peft", "peft-4bit"):
        raise ValueError(f"the masking self-test runs on peft or peft-4bit, not {backend}")
    started = time.time()
    overrides = {
        "name": "doctor", "seed": seed, "data.task_ids": [task_id], "diagnoser.mode": "off",
        "grpo.tasks_per_step": 1, "grpo.steps": 1, "rollout.num_generations": num_generations,
        "rollout.max_turns": turns, "rollout.max_new_tokens": max_new_tokens,
        "rollout.max_model_calls": max_model_calls, "policy.dtype": dtype, "grpo.beta": 0.0,
        "policy.backend": backend,
        # the mask does not depend on how tools are shown; one-line signatures keep the prompt near 1k tokens
        "interface.tool_format": "signatures",
        # the probe reads the gradient of every logit row, which only TRL's pass per trajectory computes; the
        # shared-prefix pass computes logits at the loss tokens only, and tests/scripted/test_grpo_reference.py shows its
        # log-probs and gradients equal these
        "grpo.shared_prefix": False,
    }
    recipe = load_recipe(None, overrides)
    task = load_tasks([task_id])[0].truncated(turns)
    result = SelfTestResult(False, "", label or model_dir, task_id, backend=backend)
    with tempfile.TemporaryDirectory(prefix="seal-lite-doctor-") as tmp:
        store = Store(Path(tmp) / "seal.db")
        step = SealStep(recipe, store, {task.id: task}, None)
        probe = _Probe(step, num_generations)
        policy = load_policy(model_dir, recipe)
        trainer = build_trainer(policy, recipe, [task.id], probe, str(Path(tmp) / "trl"))
        step.generator = probe.recorder = _RecordingGenerator(
            TransformersGenerator(trainer.model, policy.tokenizer, policy.generation_mode))
        probe.attach(trainer)
        lora = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
        result.loss = float(trainer.train().training_loss)
        failures = probe.check(result)
        result.dtype = str(policy.dtype).removeprefix("torch.")
        result.linear4bit_layers = count_linear4bit(trainer.model)
        if backend == "peft-4bit" and result.linear4bit_layers == 0:
            failures.append("backend peft-4bit, yet the policy has no bitsandbytes Linear4bit layer")
        after = dict(trainer.model.named_parameters())
        result.trainable_dtypes = sorted({str(after[name].dtype).removeprefix("torch.") for name in lora})
        if result.trainable_dtypes != ["float32"]:
            failures.append(f"LoRA parameters in {result.trainable_dtypes}, not float32: small updates round away")
        result.lora_entries = sum(p.numel() for p in lora.values())
        result.lora_changed = sum(int((after[name].detach() != p).sum()) for name, p in lora.items())
        if result.lora_changed == 0:
            failures.append("the GRPO step left every LoRA weight unchanged")
        result.tool_results = sum(_tool_results_inside(store.trajectory(row["id"])["messages"])
                                  for row in store.trajectories())
    result.passed = not failures
    result.message = "; ".join(failures) or "ok"
    result.seconds = round(time.time() - started, 2)
    return result


def _tool_results_inside(messages: list[dict]) -> int:
    """Tool results that a later model message follows (the completion ends with the last model message). They
    come back as user messages of <tool_response> blocks, as on the official surface."""
    last = max((index for index, message in enumerate(messages) if message["role"] == "assistant"), default=-1)
    return sum(message["role"] == "user" and message["content"].startswith("<tool_response>")
               for message in messages[:last])


class _RecordingGenerator:
    """Wraps the real generator and keeps every (context ids, generated ids) pair: the ground truth of which
    completion tokens the policy wrote."""

    def __init__(self, generator):
        self.generator, self.tokenizer = generator, generator.tokenizer
        self.calls: list[tuple[list[int], list[int]]] = []

    def generate(self, batch, max_new_tokens, temperature):
        outputs = self.generator.generate(batch, max_new_tokens, temperature)
        self.calls += [(list(context), list(ids)) for context, ids in zip(batch, outputs, strict=True)]
        return outputs


class _Probe:
    """The SEAL step with +1/-1 advantages, plus captures of TRL's generation output, and of each batch
    ``compute_loss`` saw with the gradient of its logits (max |grad| over the vocabulary, per position)."""

    def __init__(self, step, group: int):
        self.step, self.group = step, group
        self.recorder: _RecordingGenerator | None = None
        self.batch = self.generation = None
        self.losses: list[list] = []  # per compute_loss call: [inputs, gradient or None]

    def __call__(self, task_ids: list[str]):
        batch = self.step(task_ids)
        signs = [1.0 if (index % self.group) % 2 == 0 else -1.0 for index in range(len(batch.advantages))]
        self.batch = dataclasses.replace(batch, advantages=signs)
        return self.batch

    def attach(self, trainer) -> None:
        """Wrap this trainer's generation and loss (instance attributes: the class stays untouched)."""
        generate_and_score, compute_loss = trainer._generate_and_score_completions, trainer.compute_loss
        # The LM head's output is the logits tensor the loss is computed from; Unsloth's fused loss never
        # materialises it, hence the self-test's peft backend.
        head = trainer.accelerator.unwrap_model(trainer.model).get_output_embeddings()

        def keep_generation(inputs):
            self.generation = generate_and_score(inputs)
            return self.generation

        def keep_gradient(module, args, logits):
            if logits.requires_grad:
                record = self.losses[-1]
                logits.register_hook(lambda grad: record.__setitem__(1, grad.detach().float().abs().amax(-1).cpu()))

        def loss_with_hook(model, inputs, *args, **kwargs):
            self.losses.append([inputs, None])
            handle = head.register_forward_hook(keep_gradient)
            try:
                return compute_loss(model, inputs, *args, **kwargs)
            finally:
                handle.remove()

        trainer._generate_and_score_completions = keep_generation
        trainer.compute_loss = loss_with_hook

    def check(self, result: SelfTestResult) -> list[str]:
        batch, output = self.batch, self.generation
        if batch is None or output is None or not self.losses:
            return ["the trainer never called the rollout function and the loss"]
        if any(grad is None for _, grad in self.losses):
            return ["no gradient reached the logits in compute_loss"]
        failures = []
        truth = [self._generated_mask(prompt, completion)
                 for prompt, completion in zip(batch.prompt_ids, batch.completion_ids, strict=True)]
        result.trajectories = len(truth)
        result.model_tokens = sum(sum(mask) for mask in truth)
        result.env_tokens = sum(len(mask) - sum(mask) for mask in truth)
        if result.model_tokens == 0 or result.env_tokens == 0:
            failures.append(f"the completions hold {result.model_tokens} model and {result.env_tokens} environment "
                            "tokens: both kinds are needed; use a task with more turns or more model calls")
        advantages = output["advantages"].tolist()
        if advantages != batch.advantages:
            failures.append(f"TRL trained with advantages {advantages}, not the step's {batch.advantages}")

        # 1. The loop's env_mask marks exactly the generated tokens.
        wrong = sum(sum(a != b for a, b in zip(mask, env)) + abs(len(mask) - len(env))
                    for mask, env in zip(truth, batch.env_mask, strict=True))
        if wrong:
            failures.append(f"the loop's env_mask disagrees with the generated tokens at {wrong} positions")

        # 2. TRL's loss mask, in its generation output (rows in rollout order), is the batch's env_mask, padded with 0.
        loss_mask = _loss_mask(output).tolist()
        wrong = sum(sum(a != b for a, b in zip(row, env + [0] * (len(row) - len(env))))
                    for row, env in zip(loss_mask, batch.env_mask, strict=True))
        if wrong:
            failures.append(f"TRL's loss mask (completion_mask * tool_mask) differs from the batch's env_mask at "
                            f"{wrong} positions: loss on environment tokens or padding, or none on model tokens")

        # 3. Gradients of the logits, per row of each batch compute_loss saw (TRL shuffles rows after generation).
        unused = list(range(len(truth)))
        env_grads, other_grads, model_grads = [], [], []
        for inputs, grads in self.losses:
            width = inputs["completion_ids"].shape[1]
            kept = grads.shape[1]  # logits kept for the last `kept` positions of prompt + completion
            for row in range(inputs["completion_ids"].shape[0]):
                prompt = inputs["prompt_ids"][row][inputs["prompt_mask"][row].bool()].tolist()
                length = int(inputs["completion_mask"][row].sum())
                completion = inputs["completion_ids"][row][:length].tolist()
                match = next((t for t in unused
                              if batch.prompt_ids[t] == prompt and batch.completion_ids[t] == completion), None)
                if match is None:
                    return failures + ["a row of the loss batch is none of the rolled-out trajectories"]
                unused.remove(match)
                for k in range(kept):
                    target = width - kept + k + 1  # logits at position t predict token t + 1: this completion index
                    value = float(grads[row, k])
                    if 0 <= target < length:
                        (model_grads if truth[match][target] else env_grads).append(value)
                    else:
                        other_grads.append(value)  # predicts a prompt token, padding, or nothing (the last position)
        result.max_env_grad = max(env_grads, default=0.0)
        if model_grads:
            result.min_model_grad = min(model_grads)
            result.mean_model_grad = sum(model_grads) / len(model_grads)
        if result.max_env_grad != 0.0:
            failures.append(f"non-zero gradient (max |grad| {result.max_env_grad:.3g}) on logits that predict "
                            "environment tokens")
        if max(other_grads, default=0.0) != 0.0:
            failures.append("non-zero gradient on logits that predict prompt tokens or padding")
        if model_grads and result.min_model_grad <= 0.0:
            zero = sum(value == 0.0 for value in model_grads)
            failures.append(f"{zero} of {len(model_grads)} model tokens got no gradient")
        return failures

    def _generated_mask(self, prompt: list[int], completion: list[int]) -> list[int]:
        """1 on the completion tokens the recorder saw generated for this trajectory, else 0."""
        sequence = prompt + completion
        mask = [0] * len(sequence)
        for context, ids in self.recorder.calls:
            end = len(context) + len(ids)
            if ids and end <= len(sequence) and sequence[:end] == context + ids:
                mask[len(context):end] = [1] * len(ids)
        return mask[len(prompt):]


def _loss_mask(output: dict):
    """The mask TRL's loss uses (GRPOTrainer._compute_loss): completion_mask, times tool_mask when present."""
    return output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
