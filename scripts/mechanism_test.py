"""Issue 68's mechanism test, pre-registered in docs/results/mechanism-test.md: does the SEAL-weighted update move
held-out behaviour beyond the vanilla update, given the same rollout batches?

Parts, each recorded under --records (docs/results/mechanism-test/, committed) as soon as it is done:

1. ``sets``: the probe set P, the abstention turns and the training pool, chosen from the two screens' stores
   (the page gives the screen commands; run them first) and written to data/mechanism/ with their counts.

The later parts (the vanilla run's states, the 40 batches with the first-order check, M2) follow in the order the
page gives. This file holds what they are built from, tested in tests/unit/test_mechanism_test.py: the held-out
objectives and their gradients (``probe_objectives``), the three arms' advantages (``arm_advantages``), GRPO's
gradient of a batch (``surrogate_gradient``), and the arithmetic the result is read with (``adam_change``,
``first_order_change``, ``relative_gain``, ``clustered_interval``, ``sign_flip_p``).

    .venv/bin/python scripts/mechanism_test.py sets          # after both screens
    .venv/bin/python scripts/mechanism_test.py --summary-only  # every figure, from the committed records
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECORDS = ROOT / "docs" / "results" / "mechanism-test"
SETS = ROOT / "data" / "mechanism"
SCREENS = {"probe": ROOT / "runs" / "mechanism" / "probe-screen", "pool": ROOT / "runs" / "mechanism" / "pool-screen"}
IN_RANGE = (1 / 6, 5 / 6)  # pass rates kept, over the screen's 6 samples
PER_PATTERN = 3  # at most this many tasks per identical first-turn ground truth
ABSTENTIONS = 24  # the eval split's miss_param first turns that must be declined, at most


# ---- the sets ----------------------------------------------------------------------------------------------------

def in_range_tasks(pass_rates: dict[str, float], ground_truth: dict[str, list[str]], order: Sequence[str]) -> list[str]:
    """The screened action turns (a ground-truth call is due) with a pass rate in ``IN_RANGE``, in ``order`` (the
    split file's), at most ``PER_PATTERN`` per identical first-turn ground truth (the first ones in that order)."""
    kept, per_pattern = [], {}
    for task_id in order:
        rate = pass_rates.get(task_id)
        if rate is None or not IN_RANGE[0] <= rate <= IN_RANGE[1] or not ground_truth[task_id]:
            continue
        pattern = tuple(ground_truth[task_id])
        if per_pattern.get(pattern, 0) < PER_PATTERN:
            per_pattern[pattern] = per_pattern.get(pattern, 0) + 1
            kept.append(task_id)
    return kept


def abstention_turns(ground_truth: dict[str, list[str]], order: Sequence[str]) -> list[str]:
    """The miss_param tasks of ``order`` whose first turn must be declined (no ground-truth call), at most
    ``ABSTENTIONS``."""
    return [task_id for task_id in order if "miss_param" in task_id and not ground_truth[task_id]][:ABSTENTIONS]


def choose_sets() -> dict:
    """P, the abstention turns and the pool from the screens' stores; written to data/mechanism/ and recorded."""
    from seal_lite.engines.store import Store
    from seal_lite.envs.bfcl import load_tasks, split_ids
    from seal_lite.step.screen import pass_rates

    chosen = {}
    for name, split in (("probe", "eval"), ("pool", "train")):
        order = split_ids(split)
        ground_truth = {task.id: task.ground_truth[0] for task in load_tasks(order)}
        rates = pass_rates(Store.open_readonly(SCREENS[name] / "seal.db").screen())
        chosen[name] = {"split": split, "screened": len(rates), "tasks": in_range_tasks(rates, ground_truth, order)}
        if name == "probe":
            chosen["abstain"] = {"split": split, "tasks": abstention_turns(ground_truth, order)}
    probe_truths = {tuple(task.ground_truth[0]) for task in load_tasks(chosen["probe"]["tasks"])}
    chosen["pool"]["twins"] = [task.id for task in load_tasks(chosen["pool"]["tasks"])
                               if tuple(task.ground_truth[0]) in probe_truths]
    SETS.mkdir(parents=True, exist_ok=True)
    for name in ("probe", "abstain", "pool"):
        (SETS / f"{name}.txt").write_text(f"# {name}: written by scripts/mechanism_test.py sets from the screens of "
                                          "docs/results/mechanism-test.md\n" + "\n".join(chosen[name]["tasks"]) + "\n")
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / "sets.json").write_text(json.dumps(chosen, indent=1) + "\n")
    return chosen


# ---- the arithmetic the result is read with ----------------------------------------------------------------------

def clip_to_norm(grads: dict, max_norm: float) -> dict:
    """The gradients scaled so their joint norm is at most ``max_norm``, as torch's clip_grad_norm_ does."""
    total = sum(float((g.float() ** 2).sum()) for g in grads.values()) ** 0.5
    scale = min(1.0, max_norm / (total + 1e-6))
    return {name: g * scale for name, g in grads.items()}


def adam_change(grads: dict, exp_avg: dict, exp_avg_sq: dict, step: int, lr: float,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> dict:
    """The parameter change Adam(W) makes with ``grads`` from moments ``exp_avg`` and ``exp_avg_sq`` after ``step``
    earlier steps (bias correction at step + 1); weight decay 0, as the recipe's."""
    t = step + 1
    change = {}
    for name, g in grads.items():
        m = betas[0] * exp_avg[name] + (1 - betas[0]) * g
        v = betas[1] * exp_avg_sq[name] + (1 - betas[1]) * g * g
        change[name] = -lr * (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
    return change


def first_order_change(objective_grads: dict, change: dict) -> float:
    """ΔJ ≈ ∇J · Δθ, summed over the parameters both name."""
    return sum(float((objective_grads[name].float() * change[name].float()).sum()) for name in change)


def relative_gain(seal: Sequence[float], vanilla: Sequence[float]) -> float:
    """R: the mean over batches of SEAL's change minus vanilla's, over the mean of vanilla's."""
    return (sum(seal) - sum(vanilla)) / sum(vanilla)


def clustered_interval(by_state: Sequence[Sequence[tuple[float, float]]], resamples: int = 10_000, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of R, resampling states with replacement and then batches within each;
    ``by_state``: per state, its batches' (SEAL change, vanilla change)."""
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        pairs = [pair for state in rng.choices(by_state, k=len(by_state)) for pair in rng.choices(state, k=len(state))]
        values.append(relative_gain([s for s, _ in pairs], [v for _, v in pairs]))
    values.sort()
    tail = (1 - level) / 2
    return values[int(tail * resamples)], values[int((1 - tail) * resamples) - 1]


def sign_flip_p(differences: Sequence[float], flips: int = 100_000, seed: int = 0) -> float:
    """Two-sided sign-flip test of the differences' mean: (1 + flips at least as extreme) / (1 + flips)."""
    rng = random.Random(seed)
    observed = abs(sum(differences))
    extreme = sum(abs(sum(d if rng.random() < 0.5 else -d for d in differences)) >= observed - 1e-12
                  for _ in range(flips))
    return (1 + extreme) / (1 + flips)


# ---- the model side: objectives on P and the update of a batch ------------------------------------------------

# ρ at its paper-scale fixed point (the review's simulation of update_utilities at 256 trajectories a step): the
# primary SEAL arm's; every other label keeps its base utility
FIXED_POINT_RHO = {"empty_turn_model_response": 1.93, "state_mismatch": 1.14, "correct_abstention": 1.89,
                   "response_mismatch": 0.97}
TOOL_CALL_OPEN = "<tool_call>"


def trainable(model) -> dict:
    """The parameters an update moves (the LoRA's), by name."""
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def gradient_of(value, parameters: dict) -> dict:
    """d value / d parameters, zeros where the value does not depend on a parameter."""
    import torch

    grads = torch.autograd.grad(value, list(parameters.values()), allow_unused=True, retain_graph=True)
    return {name: (g if g is not None else torch.zeros_like(p)).detach()
            for (name, p), g in zip(parameters.items(), grads)}


def add_into(total: dict | None, part: dict, scale: float) -> dict:
    return {name: value * scale + (total[name] if total else 0) for name, value in part.items()}


def strict_answer(calls: list[str]) -> str:
    """A turn's ground-truth calls as the strict parser wants them written: one <tool_call> JSON block each."""
    from seal_lite.core.calls import parse_calls

    parsed = [call for text in calls for call in parse_calls(text).calls]
    return "\n".join(f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": call.name, "arguments": call.arguments})
                     + "\n</tool_call>" for call in parsed)


def completion_logprobs(model, prompt_ids: list[int], completion_ids: list[int]):
    """log p of each completion token after the prompt (temperature 1), and the log-softmax at the first
    completion position (what the answer's first token is drawn from)."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to fp32; fp64 stays
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(completion_ids, device=model.device)[:, None])[:, 0]
    return chosen, logprobs[0]


def opening_ids(tokenizer, task, interface) -> list[int]:
    """The token ids the policy reads before its first message, exactly as a rollout renders them."""
    from seal_lite.step.rollout import TokenConversation, opening_messages

    return TokenConversation(tokenizer, opening_messages(task, interface)).ids


def probe_objectives(model, tokenizer, actions: list, declines: list, interface) -> tuple[dict, dict]:
    """The held-out objectives at the model's weights and their gradients:
    J1 the mean log p of each action turn's ground truth written strictly (with the end of the message);
    J2 the mean log p that an action turn's answer opens a tool call; J3 the mean log p that a decline turn's does
    not. ({name: value}, {name: {parameter: gradient}})."""
    import torch

    parameters, opener = trainable(model), tokenizer(TOOL_CALL_OPEN, add_special_tokens=False)["input_ids"][0]
    values, grads = {"J1": 0.0, "J2": 0.0, "J3": 0.0}, {"J1": None, "J2": None, "J3": None}
    for task in actions:
        target = tokenizer(strict_answer(task.ground_truth[0]), add_special_tokens=False)["input_ids"]
        chosen, first = completion_logprobs(model, opening_ids(tokenizer, task, interface),
                                            target + [tokenizer.eos_token_id])
        for name, value in (("J1", chosen.sum()), ("J2", first[opener])):
            values[name] += float(value.detach()) / len(actions)
            grads[name] = add_into(grads[name], gradient_of(value, parameters), 1 / len(actions))
    for task in declines:
        _, first = completion_logprobs(model, opening_ids(tokenizer, task, interface), [tokenizer.eos_token_id])
        value = torch.log1p(-first[opener].exp())
        values["J3"] += float(value.detach()) / len(declines)
        grads["J3"] = add_into(grads["J3"], gradient_of(value, parameters), 1 / len(declines))
    return values, grads


def adam_state(model, checkpoint: Path) -> tuple[dict, dict, int]:
    """A checkpoint's Adam moments, by parameter name, and its step count: transformers saves the optimizer's state
    by index over its two groups (the parameters with weight decay, then those without, each in the model's order:
    ``Trainer.create_optimizer``); ``model`` holds the checkpoint's LoRA. A parameter the optimizer has not stepped
    has zero moments."""
    import torch
    from transformers import Trainer

    saved = torch.load(checkpoint / "optimizer.pt", map_location="cpu", weights_only=True)["state"]
    parameters = trainable(model)
    decay = set(Trainer.get_decay_parameter_names(None, model))
    order = [name for name in parameters if name in decay] + [name for name in parameters if name not in decay]
    exp_avg, exp_avg_sq, steps = {}, {}, set()
    for index, name in enumerate(order):
        state = saved.get(index)
        zeros = torch.zeros_like(parameters[name])
        exp_avg[name] = state["exp_avg"].to(zeros) if state else zeros
        exp_avg_sq[name] = state["exp_avg_sq"].to(zeros) if state else zeros
        if state:
            steps.add(int(state["step"]))
    if len(steps) > 1:
        raise ValueError(f"{checkpoint}: its parameters were stepped {sorted(steps)} times; expected one count")
    return exp_avg, exp_avg_sq, steps.pop() if steps else 0


def arm_advantages(groups: list[list[tuple[float, list[str]]]], utilities: dict | None) -> list[float]:
    """The advantages of a batch's trajectories, group by group: GRPO's, and with ``utilities`` (ρ) times each
    trajectory's diagnosis weight (``apply_to: all``)."""
    from seal_lite.core.advantages import diagnosis_weight, group_advantages, weighted_advantages

    advantages = []
    for group in groups:
        plain = group_advantages([reward for reward, _ in group])
        if utilities is not None:
            plain = weighted_advantages(plain, [diagnosis_weight(labels, utilities) for _, labels in group])
        advantages += plain
    return advantages


def surrogate_gradient(model, trajectories: list, advantages: list[float]) -> dict:
    """The gradient of GRPO's loss at the weights that sampled the batch (ratio 1, β 0): minus the mean over
    trajectories of the advantage times the mean log p of the trajectory's model tokens (loss_type grpo)."""
    import torch

    parameters, total = trainable(model), None
    for trajectory, advantage in zip(trajectories, advantages, strict=True):
        if advantage == 0:
            continue
        chosen, _ = completion_logprobs(model, trajectory.prompt_ids, trajectory.completion_ids)
        mask = torch.tensor(trajectory.env_mask, dtype=chosen.dtype, device=chosen.device)
        loss = -advantage * (chosen * mask).sum() / mask.sum()
        total = add_into(total, gradient_of(loss, parameters), 1 / len(trajectories))
    return total if total is not None else {name: torch.zeros_like(p) for name, p in parameters.items()}


# ---- the command -------------------------------------------------------------------------------------------------

def summary() -> None:
    """Every figure of the parts recorded so far."""
    sets = RECORDS / "sets.json"
    if not sets.exists():
        print("no part recorded yet: run the two screens of docs/results/mechanism-test.md, then `sets`")
        return
    chosen = json.loads(sets.read_text())
    print(f"probe set P: {len(chosen['probe']['tasks'])} of {chosen['probe']['screened']} screened eval tasks in "
          f"range; abstention turns: {len(chosen['abstain']['tasks'])}")
    print(f"training pool: {len(chosen['pool']['tasks'])} of {chosen['pool']['screened']} screened train tasks; "
          f"{len(chosen['pool']['twins'])} share a probe's first-turn ground truth")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=["sets"], help="the part to run")
    parser.add_argument("--summary-only", action="store_true", help="print the recorded figures, run nothing")
    args = parser.parse_args()
    if args.part == "sets" and not args.summary_only:
        choose_sets()
    summary()


if __name__ == "__main__":
    main()
