"""Issue 68's mechanism test, pre-registered in docs/results/mechanism-test.md: does the SEAL-weighted update move
held-out behaviour beyond the vanilla update, given the same rollout batches?

Parts, each recorded under --records (docs/results/mechanism-test/, committed) as soon as it is done:

0. ``screen-probe``, ``screen-pool``: the two screens, ``seal-lite screen``'s own code with the page's settings;
   each task's passes are recorded as it is screened, so a screen resumes from the records on any machine.
1. ``sets``: the probe set P, the abstention turns and the training pool, chosen from the two screens and written
   to data/mechanism/ with their counts.
2. ``states``: the vanilla GRPO run on the pool whose checkpoints after steps 6, 12 and 18 are states 1-3.
3. ``measure``: per state (0, the base model, to 3), the held-out objectives' gradients, then 10 batches, each
   played by the state's policy, updated three ways (vanilla; SEAL at the fixed-point and at the base ρ) through
   the state's Adam step, and read to first order; on the first 2, the real change of J1 too. A recorded batch is
   not played again, so the part resumes where it stopped.
4. ``schema``: M2, φ_schema off and on for the base model on the pool, the same seed per task in both, under the
   signatures view and on 20 tasks under BFCL's own.

What they are built from is tested in tests/unit/test_mechanism_test.py and tests/scripted/test_mechanism_*.py:
the held-out objectives and their gradients (``probe_objectives``), the three arms' advantages
(``arm_advantages``), GRPO's gradient of a batch (``surrogate_gradient``; ``surrogate_gradients`` for all arms at
once), a checkpoint's Adam moments
(``adam_state``) and the arithmetic the result is read with (``adam_change``, ``first_order_change``,
``relative_gain``, ``clustered_interval``, ``sign_flip_p``).

    nice -n 10 .venv/bin/python scripts/mechanism_test.py screen-probe   # then screen-pool
    .venv/bin/python scripts/mechanism_test.py sets            # after both screens
    .venv/bin/python scripts/mechanism_test.py states          # then each part in turn
    .venv/bin/python scripts/mechanism_test.py measure
    .venv/bin/python scripts/mechanism_test.py schema
    .venv/bin/python scripts/mechanism_test.py --summary-only  # every figure, from the committed records
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from cpu_experiment import machine as cpu_machine  # noqa: E402

RECORDS = ROOT / "docs" / "results" / "mechanism-test"
SETS = ROOT / "data" / "mechanism"
IN_RANGE = (1 / 6, 5 / 6)  # pass rates kept, over the screen's 6 samples
PER_PATTERN = 3  # at most this many tasks per identical first-turn ground truth
RESAMPLES = 10_000  # the bootstrap's, pre-registered
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


SCREEN_SPLITS = {"probe": "eval", "pool": "train"}
SCREENED_BY = ("# Screened by: scripts/mechanism_test.py screen-{split} (seal-lite screen's own code: recipes/cpu-learn.yaml,\n"
               "# qwen2.5-coder-0.5b, first turns, 6 samples at T = 1, seed 0; docs/results/mechanism-test.md), then\n"
               "# scripts/mechanism_test.py sets, which reads the screens' records (docs/results/mechanism-test/).\n")
SET_HEADERS = {
    "probe": "# Probe set P of issue 68's mechanism test: {probe} of {screened} screened eval-split first turns whose pass\n"
             "# rate was in [1/6, 5/6], at most 3 per identical first-turn ground truth, none that any call passes.\n"
             + SCREENED_BY.replace("{split}", "probe"),
    "abstain": "# Abstention turns of issue 68's mechanism test: the first {abstain} eval-split miss_param tasks whose first\n"
               "# turn must be declined (empty ground truth), in the split's order.\n"
               + SCREENED_BY.replace("{split}", "probe"),
    "pool": "# Training pool of issue 68's mechanism test: {pool} of {screened} screened train-split first turns whose pass\n"
            "# rate was in [1/6, 5/6], at most 3 per identical first-turn ground truth, none that any call passes;\n"
            "# {twins} share a probe's first-turn ground truth.\n" + SCREENED_BY.replace("{split}", "pool"),
}
SCREEN_SAMPLES = 6


def screen(design: Design, name: str) -> dict[str, float]:
    """The pre-registered screen of ``name`` (probe: the eval split, pool: the train split): ``seal-lite screen``'s
    own code with the page's settings, the store under runs/mechanism/<name>-screen. Each task's passes are also
    recorded (``screen-<name>.json``) as soon as it is screened, and a store that lacks them is filled from that
    record first, so a screen goes on where it stopped on a machine that kept nothing of runs/."""
    from seal_lite import api
    from seal_lite.core.types import NoProgress
    from seal_lite.engines.store import Store

    out, record = design.work / f"{name}-screen", design.records / f"screen-{name}.json"
    out.mkdir(parents=True, exist_ok=True)
    store = Store(out / "seal.db")
    rows = json.loads(record.read_text())["tasks"] if record.exists() else {}
    stored = store.screen()
    for task_id, row in rows.items():
        if task_id not in stored:
            store.save_screen({"task_id": task_id, **row})
    rows = {task_id: {key: row[key] for key in ("samples", "passes", "seconds")}
            for task_id, row in store.screen().items()}

    def save() -> None:
        write_record(design, record.name, {"split": SCREEN_SPLITS[name], "samples": SCREEN_SAMPLES, "tasks": rows,
                                           "machine": cpu_machine()})

    class Recording(NoProgress):
        def task_screened(self, task_id, passes, samples):
            rows[task_id] = {key: store.screen()[task_id][key] for key in ("samples", "passes", "seconds")}
            save()

        def tasks_excluded(self, task_ids, reason):
            write_record(design, f"screen-{name}-excluded.json", {"tasks": task_ids, "reason": reason})

    if rows:
        save()  # what the store already holds, before any more is played
    recipe = design.recipe_for(**{"data.task_ids": None, "data.task_file": None, "data.split": SCREEN_SPLITS[name],
                                  "data.num_tasks": design.screen_tasks, "data.categories": ["base", "miss_func", "miss_param",
                                                                             "long_context"]})
    return api.screen(recipe, out, samples=SCREEN_SAMPLES, progress=Recording(),
                      command=f"scripts/mechanism_test.py screen-{name}")


def choose_sets(design: Design) -> dict:
    """P, the abstention turns and the pool from the screens' records; written to data/mechanism/ and recorded."""
    from seal_lite.envs.bfcl import load_tasks, split_ids

    chosen = {}
    for name, split in SCREEN_SPLITS.items():
        order = split_ids(split)
        ground_truth = {task.id: task.ground_truth[0] for task in load_tasks(order)}
        rows = json.loads((design.records / f"screen-{name}.json").read_text())["tasks"]
        rates = {task_id: row["passes"] / row["samples"] for task_id, row in rows.items()}
        chosen[name] = {"split": split, "screened": len(rates), "tasks": in_range_tasks(rates, ground_truth, order)}
        if name == "probe":
            chosen["abstain"] = {"split": split, "tasks": abstention_turns(ground_truth, order)}
    probe_truths = {tuple(task.ground_truth[0]) for task in load_tasks(chosen["probe"]["tasks"])}
    chosen["pool"]["twins"] = [task.id for task in load_tasks(chosen["pool"]["tasks"])
                               if tuple(task.ground_truth[0]) in probe_truths]
    design.sets.mkdir(parents=True, exist_ok=True)
    counts = {name: len(chosen[name]["tasks"]) for name in ("probe", "abstain", "pool")}
    for name in ("probe", "abstain", "pool"):
        screened = chosen["pool" if name == "pool" else "probe"]["screened"]
        header = SET_HEADERS[name].format(**counts, screened=screened, twins=len(chosen["pool"]["twins"]))
        (design.sets / f"{name}.txt").write_text(header + "\n".join(chosen[name]["tasks"]) + "\n")
    write_record(design, "sets.json", chosen)
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
    """R: the mean over batches of SEAL's change minus vanilla's, over the mean of vanilla's (nan when vanilla's
    is 0: the batches gave no update to compare with)."""
    return (sum(seal) - sum(vanilla)) / sum(vanilla) if sum(vanilla) else float("nan")


def clustered_resamples(by_state: Sequence[Sequence[tuple[float, float]]], resamples: int = RESAMPLES, seed: int = 0):
    """R on each bootstrap resample, states drawn with replacement and then batches within each, with the indices of
    the states drawn; ``by_state``: per state, its batches' (SEAL change, vanilla change)."""
    rng = random.Random(seed)
    for _ in range(resamples):
        drawn = rng.choices(range(len(by_state)), k=len(by_state))
        pairs = [pair for state in drawn for pair in rng.choices(by_state[state], k=len(by_state[state]))]
        yield relative_gain([s for s, _ in pairs], [v for _, v in pairs]), drawn


def percentile_interval(estimates: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` share of a bootstrap's estimates."""
    ordered, tail = sorted(estimates), (1 - level) / 2
    return ordered[int(tail * len(ordered))], ordered[int((1 - tail) * len(ordered)) - 1]


def clustered_interval(by_state: Sequence[Sequence[tuple[float, float]]], resamples: int = RESAMPLES, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of R over ``clustered_resamples``."""
    return percentile_interval([r for r, _ in clustered_resamples(by_state, resamples, seed)], level)


def mean_interval(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the values' mean (M2: a paired difference per task)."""
    rng = random.Random(seed)
    return percentile_interval([sum(rng.choices(values, k=len(values))) / len(values) for _ in range(resamples)],
                               level)


def mean_reward(batches: Sequence[dict]) -> float:
    """The mean verdict over the batches' trajectories (0.0 where none is recorded)."""
    rewards = [r for b in batches for group in b.get("rewards", []) for r in group]
    return sum(rewards) / len(rewards) if rewards else 0.0


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


def gradient_of(value, parameters: dict, retain: bool = False) -> dict:
    """d value / d parameters, zeros where the value does not depend on a parameter; ``retain``: keep the graph for
    another value of the same forward pass (else it is freed at once: a 2k-token pass's graph is gigabytes)."""
    import torch

    grads = torch.autograd.grad(value, list(parameters.values()), allow_unused=True, retain_graph=retain)
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
    # logits only where a completion token is predicted: vocabulary-wide logits over the prompt would be most of
    # the memory (a 2k-token prompt: 0.6 GB in bf16, and as much again for their gradient)
    logits = model(input_ids=ids, logits_to_keep=len(completion_ids) + 1).logits[0, :-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to fp32; fp64 stays
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(completion_ids, device=model.device)[:, None])[:, 0]
    return chosen, logprobs[0]


def opening_ids(tokenizer, task, interface) -> list[int]:
    """The token ids the policy reads before its first message, exactly as a rollout renders them."""
    from seal_lite.step.rollout import TokenConversation, opening_messages

    return TokenConversation(tokenizer, opening_messages(task, interface)).ids


def probe_objectives(model, tokenizer, actions: list, declines: list, interface,
                     gradients: bool = True, twinned: Collection[str] = ()) -> tuple[dict, dict]:
    """The held-out objectives at the model's weights and (unless not ``gradients``) their gradients:
    J1 the mean log p of each action turn's ground truth written strictly (with the end of the message), and J1u
    the same over the action turns not in ``twinned`` (those whose ground truth a pool task shares);
    J2 the mean log p that an action turn's answer opens a tool call; J3 the mean log p that a decline turn's does
    not. ({name: value}, {name: {parameter: gradient}})."""
    import torch

    parameters, opener = trainable(model), tokenizer(TOOL_CALL_OPEN, add_special_tokens=False)["input_ids"][0]
    values, grads = dict.fromkeys(OBJECTIVES + ("J1u",), 0.0), dict.fromkeys(OBJECTIVES + ("J1u",))
    untwinned = sum(task.id not in twinned for task in actions)

    def add(shares: dict[str, int], value, retain: bool = False) -> None:
        """``value``'s share of each objective it is averaged into ({name: turns that objective averages})."""
        gradient = gradient_of(value, parameters, retain) if gradients else None
        for name, count in shares.items():
            values[name] += float(value.detach()) / count
            if gradients:
                grads[name] = add_into(grads[name], gradient, 1 / count)

    with torch.enable_grad() if gradients else torch.no_grad():
        for task in actions:
            target = tokenizer(strict_answer(task.ground_truth[0]), add_special_tokens=False)["input_ids"]
            chosen, first = completion_logprobs(model, opening_ids(tokenizer, task, interface),
                                                target + [tokenizer.eos_token_id])
            shares = {"J1": len(actions)} | ({"J1u": untwinned} if task.id not in twinned else {})
            add(shares, chosen.sum(), retain=True)  # J2 comes from the same forward pass
            add({"J2": len(actions)}, first[opener])
            del chosen, first  # before the next pass: one graph alive at a time
        for task in declines:
            _, first = completion_logprobs(model, opening_ids(tokenizer, task, interface), [tokenizer.eos_token_id])
            add({"J3": len(declines)}, torch.log1p(-first[opener].exp()))
            del first
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
    """The gradient of GRPO's loss at the weights that sampled the batch (ratio 1, beta 0): minus the mean over
    trajectories of the advantage times the mean log p of the trajectory's model tokens (loss_type grpo)."""
    return surrogate_gradients(model, trajectories, {"arm": advantages})["arm"]


def surrogate_gradients(model, trajectories: list, arms: dict[str, list[float]]) -> dict[str, dict]:
    """``surrogate_gradient`` for each arm's advantages, each trajectory's gradient taken once for all arms (the
    loss is linear in the advantages)."""
    import torch

    parameters, totals = trainable(model), dict.fromkeys(arms)
    for index, trajectory in enumerate(trajectories):
        if not any(advantages[index] for advantages in arms.values()):
            continue
        chosen, _ = completion_logprobs(model, trajectory.prompt_ids, trajectory.completion_ids)
        mask = torch.tensor(trajectory.env_mask, dtype=chosen.dtype, device=chosen.device)
        gradient = gradient_of(-(chosen * mask).sum() / mask.sum(), parameters)
        for arm, advantages in arms.items():
            if advantages[index]:
                totals[arm] = add_into(totals[arm], gradient, advantages[index] / len(trajectories))
    return {arm: total if total is not None else {name: torch.zeros_like(p) for name, p in parameters.items()}
            for arm, total in totals.items()}


# ---- the parts that run it ---------------------------------------------------------------------------------------

ARMS = {"vanilla": None, "seal": FIXED_POINT_RHO, "seal_base": {}}  # ρ on top of the base utilities (None: no weights)
OBJECTIVES = ("J1", "J2", "J3")


@dataclass
class Design:
    """The pre-registered values (docs/results/mechanism-test.md); tests shrink them."""

    recipe: Path = ROOT / "recipes" / "cpu-learn.yaml"
    overrides: dict = field(default_factory=dict)  # on top of the recipe, for every part
    work: Path = ROOT / "runs" / "mechanism"
    records: Path = RECORDS
    sets: Path = SETS
    screen_tasks: int = 400  # of each split, after the recipe's seeded shuffle: all of them
    state_steps: tuple[int, ...] = (6, 12, 18)  # the vanilla run's checkpoints that are states 1, 2, 3
    batches: int = 10
    batch_tasks: int = 4
    group: int = 8
    checked: int = 2  # batches of each state whose first-order reading is checked against a real update
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0

    def recipe_for(self, **overrides):
        from seal_lite.core.recipe import load_recipe

        return load_recipe(self.recipe, {"diagnoser.mode": "off", **self.overrides, **overrides})

    def read_set(self, name: str) -> list[str]:
        from seal_lite.runs.tasks import read_task_file

        return read_task_file(self.sets / f"{name}.txt")


def vanilla_states(design: Design) -> dict:
    """The vanilla GRPO run on the pool whose checkpoints are states 1-3; recorded with its training reward."""
    from seal_lite.engines.store import Store
    from seal_lite.runs.train import run

    out = design.work / "vanilla"
    recipe = design.recipe_for(**{
        "data.task_ids": design.read_set("pool"), "data.task_file": None, "grpo.steps": max(design.state_steps),
        "grpo.tasks_per_step": design.batch_tasks, "rollout.num_generations": 4, "seed": 0,
        "grpo.keep_checkpoints": max(design.state_steps), "interface.schema_cues": False,
        "interface.recovery_feedback": False, "interface.capability_hints": False,
        "grpo.diagnosis_weighting": False, "grpo.closed_loop": False})
    summary = run(recipe, out)
    checkpoints = {row["step"]: row["path"] for row in Store.open_readonly(out / "seal.db").checkpoints()}
    record = {"run": str(out), "rewards": summary.rewards, "minutes": summary.wall_time_s / 60,
              "states": {str(index + 1): checkpoints[step] for index, step in enumerate(design.state_steps)}}
    write_record(design, "states.json", record)
    return record


def twinned_probes(actions: list, pool: list) -> set[str]:
    """The action turns whose first-turn ground truth a pool task shares (its twin)."""
    truths = {tuple(task.ground_truth[0]) for task in pool}
    return {task.id for task in actions if tuple(task.ground_truth[0]) in truths}


def state_policy(design: Design, state: int):
    """(model, tokenizer, Adam's moments and step count) of a state: the base model with a fresh LoRA (state 0) or
    the vanilla run's checkpoint, its LoRA trainable."""
    import torch
    from peft import get_peft_model

    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy, with_adapter

    recipe = design.recipe_for()
    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    if state == 0:
        model = get_peft_model(policy.model, policy.peft_config)  # the LoRA TRL would give the run
    else:
        states = json.loads((design.records / "states.json").read_text())["states"]
        checkpoint = design.work / "vanilla" / states[str(state)]
        model = with_adapter(policy.model, checkpoint)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("lora_" in name)
    model.eval()  # no dropout: the gradients are the update's at these weights
    if state == 0:
        zeros = {name: torch.zeros_like(p) for name, p in trainable(model).items()}
        return model, policy.tokenizer, (zeros, dict(zeros), 0), recipe
    return model, policy.tokenizer, adam_state(model, checkpoint), recipe


def measure_state(design: Design, state: int) -> None:
    """State ``state``'s probe gradients, then its batches, each recorded as it ends (a recorded batch is skipped)."""
    import torch

    from seal_lite.core.advantages import initial_utilities
    from seal_lite.core.interface import TrainingInterface
    from seal_lite.engines.rollout_engine import rollout_engine
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.rollout import rollout_groups
    from seal_lite.step.verifier import diagnose_episode

    names = [f"batch-state{state}-{batch}.json" for batch in range(design.batches)]
    if all((design.records / name).exists() for name in names):
        return  # measured: its probe gradients would only be taken again
    model, tokenizer, (exp_avg, exp_avg_sq, step), recipe = state_policy(design, state)
    interface = TrainingInterface(tool_format=recipe.interface.tool_format)  # the plain view, φ's off
    actions, declines = load_tasks(design.read_set("probe")), load_tasks(design.read_set("abstain"))
    pool = [task.truncated(1) for task in load_tasks(design.read_set("pool"))]
    values, objective_grads = probe_objectives(model, tokenizer, actions, declines, interface,
                                               twinned=twinned_probes(actions, pool))
    write_record(design, f"probes-state{state}.json", {"state": state, "adam_step": step, "values": values,
                                                        **machine(model)})
    rollout = recipe.rollout.model_copy(update={"num_generations": design.group})
    with rollout_engine(recipe, model, tokenizer, design.work / f"engine-{state}", None) as (generator, sync):
        for batch, name in enumerate(names):
            if (design.records / name).exists():
                continue
            seed = 1000 * state + batch
            tasks = random.Random(seed).sample(pool, design.batch_tasks)
            torch.manual_seed(seed)
            sync(seed)  # llama.cpp and vLLM: the state's LoRA, and a sampling stream of this batch's own
            groups = rollout_groups([(task, TrainingInterface(tool_format=interface.tool_format)) for task in tasks],
                                    design.group, generator, rollout)
            diagnoses = [[diagnose_episode(task, t.turns) for t in group] for task, group in zip(tasks, groups)]
            scored = [[(float(d.valid), d.labels) for d in group] for group in diagnoses]
            trajectories = [t for group in groups for t in group]
            changes, record = {}, {"state": state, "batch": batch, "tasks": [task.id for task in tasks],
                                   "rewards": [[r for r, _ in g] for g in scored],
                                   "labels": [[labels for _, labels in g] for g in scored], "delta": {}}
            advantages = {arm: arm_advantages(scored, None if rho is None else initial_utilities(rho))
                          for arm, rho in ARMS.items()}
            for arm, grads in surrogate_gradients(model, trajectories, advantages).items():
                grads = clip_to_norm(grads, design.max_grad_norm)
                changes[arm] = adam_change(grads, exp_avg, exp_avg_sq, step, design.learning_rate)
                record["delta"][arm] = {k: first_order_change(grads, changes[arm])
                                        for k, grads in objective_grads.items() if grads is not None}
            record["cosine"] = {arm: cosine(changes["vanilla"], changes[arm]) for arm in ARMS if arm != "vanilla"}
            if batch < design.checked:
                record["check"] = {arm: real_change(model, changes[arm], lambda: probe_objectives(
                    model, tokenizer, actions, declines, interface, gradients=False)[0]["J1"], values["J1"])
                    for arm in ("vanilla", "seal")}
            write_record(design, name, record)
            release_freed_memory()


SCHEMA_CAUSES = ("invalid_tool_call", "argument_mismatch")  # the failures φ_schema's cues are meant to prevent


def reseed(generator, seed: int) -> None:
    """A sampling stream of ``seed``'s own: the engine's (llama.cpp, paged, vLLM), else torch's (generate)."""
    import torch

    if hasattr(generator, "reseed"):
        generator.reseed(seed)
    torch.manual_seed(seed)


def schema_check(design: Design, samples: int = 8, official_tasks: int = 20) -> dict:
    """M2: the base model plays each pool task ``samples`` times with φ_schema off and on, the same seed per task
    in both, under the recipe's view and then on the first ``official_tasks`` under BFCL's own; per view, each
    task's passes in both arms and the counts of the causes the cues target. Recorded as ``schema.json``."""
    from seal_lite.core.interface import TrainingInterface
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy
    from seal_lite.engines.rollout_engine import rollout_engine
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.rollout import rollout_groups
    from seal_lite.step.verifier import diagnose_episode

    recipe = design.recipe_for()
    policy = load_policy(resolve_model(recipe.policy.model), recipe)
    pool = [task.truncated(1) for task in load_tasks(design.read_set("pool"))]
    views = {recipe.interface.tool_format: pool, "official": pool[:official_tasks]}
    record = {"samples": samples, "views": {}}
    with rollout_engine(recipe.model_copy(update={"rollout": recipe.rollout.model_copy(update={
            "max_context_tokens": max(recipe.rollout.max_context_tokens, 16384)})}), policy.model, policy.tokenizer,
            design.work / "schema-engine", None) as (generator, _):
        for view, tasks in views.items():
            arms = {}
            for cues in (False, True):
                passes, causes = {}, dict.fromkeys(SCHEMA_CAUSES, 0)
                for index, task in enumerate(tasks):
                    reseed(generator, index)
                    [group] = rollout_groups([(task, TrainingInterface(schema_cues=cues, tool_format=view))],
                                             samples, generator, recipe.rollout)
                    diagnoses = [diagnose_episode(task, t.turns) for t in group]
                    passes[task.id] = sum(d.valid for d in diagnoses)
                    for d in diagnoses:
                        for cause in d.causes:
                            if cause in causes:
                                causes[cause] += 1
                arms["on" if cues else "off"] = {"passes": passes, "causes": causes}
            differences = [arms["on"]["passes"][t.id] - arms["off"]["passes"][t.id] for t in tasks]
            record["views"][view] = {**arms, "mean_difference": sum(differences) / len(differences) / samples,
                                     "sign_flip_p": sign_flip_p(differences)}
    write_record(design, "schema.json", {**record, **machine(policy.model)})
    return record


def real_change(model, change: dict, score, before: float) -> float:
    """J1 after applying ``change`` to the LoRA for real, minus ``before``; the weights are put back after."""
    import torch

    parameters = trainable(model)
    saved = {name: p.detach().clone() for name, p in parameters.items()}
    with torch.no_grad():
        for name, p in parameters.items():
            p.add_(change[name].to(p.dtype))
    try:
        return score() - before
    finally:
        with torch.no_grad():
            for name, p in parameters.items():
                p.copy_(saved[name])


def cosine(a: dict, b: dict) -> float:
    dot = sum(float((a[name].double() * b[name].double()).sum()) for name in a)
    norms = [sum(float((x[name].double() ** 2).sum()) for name in x) ** 0.5 for x in (a, b)]
    return dot / (norms[0] * norms[1]) if norms[0] and norms[1] else 0.0


def machine(model) -> dict:
    """The CPU (as every CPU experiment's records name it) and the dtype a record was measured in."""
    return {"machine": cpu_machine(), "dtype": str(model.dtype).removeprefix("torch.")}


def release_freed_memory() -> None:
    """After a batch, hand the heap's freed pages back to the system (glibc's malloc_trim): its passes' tensors
    differ in size from batch to batch, and freed ones otherwise stay resident in a fragmented heap."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)


def write_record(design: Design, name: str, record: dict) -> None:
    design.records.mkdir(parents=True, exist_ok=True)
    (design.records / name).write_text(json.dumps(record, indent=1) + "\n")


# ---- the result, from the records ---------------------------------------------------------------------------------

def result(records: Path) -> dict:
    """Every figure of the pre-registered analysis, from the batch records under ``records``."""
    batches = [json.loads(path.read_text()) for path in sorted(records.glob("batch-state*.json"))]
    if not batches:
        return {}
    by_state: dict[int, list[tuple[float, float]]] = {}
    for b in batches:
        by_state.setdefault(b["state"], []).append((b["delta"]["seal"]["J1"], b["delta"]["vanilla"]["J1"]))
    seal, vanilla = zip(*[pair for pairs in by_state.values() for pair in pairs])
    resamples = list(clustered_resamples(list(by_state.values())))  # seed 0's: the interval and its tail below
    figures = {"batches": len(batches), "states": sorted(by_state), "R": relative_gain(seal, vanilla),
               "R_interval": percentile_interval([r for r, _ in resamples]),
               "R_interval_batches": clustered_interval([[pair for pairs in by_state.values() for pair in pairs]]),
               "sign_flip_p": sign_flip_p([s - v for s, v in zip(seal, vanilla)])}
    figures["stop"] = figures["R_interval"][1] < 0.15  # the pre-registered decision rule
    # power: the spread between batches of each batch's relative effect, (SEAL - vanilla) / vanilla's mean
    scale = sum(vanilla) / len(vanilla)
    relative = [(s - v) / scale for s, v in zip(seal, vanilla)]
    mean = sum(relative) / len(relative)
    figures["batch_sd"] = (sum((r - mean) ** 2 for r in relative) / max(len(relative) - 1, 1)) ** 0.5
    figures["R_by_state"] = {state: relative_gain(*zip(*pairs)) for state, pairs in by_state.items()}
    figures["cosine"] = {arm: sum(b["cosine"][arm] for b in batches) / len(batches)
                         for arm in ARMS if arm != "vanilla" and all("cosine" in b for b in batches)}
    untwinned = [b for b in batches if "J1u" in b["delta"]["vanilla"]]  # from state 1's last batch on (an amendment)
    if untwinned:
        figures["R_untwinned"] = {"batches": len(untwinned), "R": relative_gain(
            [b["delta"]["seal"]["J1u"] for b in untwinned], [b["delta"]["vanilla"]["J1u"] for b in untwinned])}
    figures["secondary"] = {arm: {k: sum(b["delta"][arm][k] - b["delta"]["vanilla"][k] for b in batches)
                                  / len(batches) for k in OBJECTIVES} for arm in ARMS if arm != "vanilla"}
    figures["vanilla"] = {k: sum(b["delta"]["vanilla"][k] for b in batches) / len(batches) for k in OBJECTIVES}
    figures["labels"] = Counter(label for b in batches for group in b.get("labels", []) for labels in group
                                for label in labels).most_common()
    # not pre-registered, read beside the rule: the upper end under other bootstrap seeds, and each state alone on
    # vanilla's scale there (SEAL's extra change over |vanilla's mean change|; R's sign flips where that mean is < 0)
    figures["R_upper_by_seed"] = [figures["R_interval"][1]] + [
        clustered_interval(list(by_state.values()), seed=seed)[1] for seed in range(1, 10)]
    # where the interval's upper tail comes from: the resamples at +0.15 or above, and which states they drew
    high = [drawn for r, drawn in resamples if r >= 0.15]
    figures["R_high_resamples"] = {"share": len(high) / len(resamples),
                                   "without_first_state": sum(0 not in drawn for drawn in high)}
    figures["by_state"] = {state: {"vanilla": sum(v for _, v in pairs) / len(pairs),
                                   "extra": sum(s - v for s, v in pairs) / abs(sum(v for _, v in pairs)),
                                   "sign_flip_p": sign_flip_p([s - v for s, v in pairs], flips=10_000),
                                   "reward": mean_reward([b for b in batches if b["state"] == state])}
                           for state, pairs in by_state.items()}
    checks = [(arm, b["check"][arm], b["delta"][arm]["J1"]) for b in batches if "check" in b for arm in b["check"]]
    figures["check"] = {"pairs": len(checks),
                        "signs_agree": sum((real > 0) == (first > 0) for _, real, first in checks),
                        "ratios": [real / first for _, real, first in checks if first]}
    checked = [b for b in batches if "check" in b]
    # the pre-registered fallback: with fewer than 3 in 4 signs agreeing, R is read on the real changes instead
    figures["first_order_reliable"] = figures["check"]["signs_agree"] >= 0.75 * len(checks)
    if checked:
        figures["R_real"] = relative_gain([b["check"]["seal"] for b in checked], [b["check"]["vanilla"] for b in checked])
    return figures


# ---- the command -------------------------------------------------------------------------------------------------

def summary(design: Design) -> None:
    """Every figure of the parts recorded so far."""
    sets = design.records / "sets.json"
    if not sets.exists():
        print("no part recorded yet: run the two screens of docs/results/mechanism-test.md, then `sets`")
        return
    chosen = json.loads(sets.read_text())
    print(f"probe set P: {len(chosen['probe']['tasks'])} of {chosen['probe']['screened']} screened eval tasks in "
          f"range; abstention turns: {len(chosen['abstain']['tasks'])}")
    print(f"training pool: {len(chosen['pool']['tasks'])} of {chosen['pool']['screened']} screened train tasks; "
          f"{len(chosen['pool']['twins'])} share a probe's first-turn ground truth")
    print_schema(design)
    figures = result(design.records)
    if not figures:
        return
    low, high = figures["R_interval"]
    print(f"{figures['batches']} batches of states {figures['states']}: R = {figures['R']:+.3f}, 95% interval "
          f"[{low:+.3f}, {high:+.3f}] clustered by state ([{figures['R_interval_batches'][0]:+.3f}, "
          f"{figures['R_interval_batches'][1]:+.3f}] over batches), sign-flip p = {figures['sign_flip_p']:.3g}")
    planned = (len(design.state_steps) + 1) * design.batches
    if figures["batches"] < planned:  # the rule is pre-registered for all the batches, not for a part of them
        print(f"decision: none yet, {figures['batches']} of the {planned} batches are recorded")
    else:
        print("decision: " + ("stop, the interval lies below +0.15" if figures["stop"] else
                              "the interval reaches +0.15: pre-register the outcome test"))
    print(f"between batches, the SD of (SEAL - vanilla) / vanilla's mean: {figures['batch_sd']:.3f}; R by state: "
          + ", ".join(f"{state} {r:+.3f}" for state, r in figures["R_by_state"].items()))
    if "R_untwinned" in figures:
        print(f"R on the probes without a pool twin ({figures['R_untwinned']['batches']} batches): "
              f"{figures['R_untwinned']['R']:+.3f}")
    print("labels over the batches' trajectories: " + ", ".join(f"{label} {n}" for label, n in figures["labels"]))
    print("vanilla, mean per batch: " + ", ".join(f"{k} {v:+.3g}" for k, v in figures["vanilla"].items()))
    for arm, deltas in figures["secondary"].items():
        print(f"{arm} - vanilla, mean per batch: " + ", ".join(f"{k} {v:+.3g}" for k, v in deltas.items())
              + (f"; cosine of the updates {figures['cosine'][arm]:.3f}" if arm in figures["cosine"] else ""))
    check = figures["check"]
    print(f"first-order check: signs agree in {check['signs_agree']} of {check['pairs']}; real / first-order: "
          + ", ".join(f"{ratio:.2f}" for ratio in check["ratios"]))
    if not figures["first_order_reliable"]:
        print(f"the first-order reading is unreliable (pre-registered fallback): R on the real changes of the "
              f"checked batches = {figures['R_real']:+.3f}")
    elif "R_real" in figures:
        print(f"R on the real changes of the checked batches: {figures['R_real']:+.3f}")
    uppers = figures["R_upper_by_seed"]
    print(f"not pre-registered: the clustered interval's upper end under bootstrap seeds 0-9: {min(uppers):+.3f} to "
          f"{max(uppers):+.3f}, {sum(u >= 0.15 for u in uppers)} of 10 at +0.15 or above")
    high = figures["R_high_resamples"]
    print(f"not pre-registered: {high['share']:.2%} of seed 0's resamples give R at +0.15 or above, "
          f"{high['without_first_state']} of them without state {figures['states'][0]}")
    for state, row in figures["by_state"].items():
        print(f"not pre-registered: state {state}, mean reward {row['reward']:.2f}, vanilla's mean J1 change "
              f"{row['vanilla']:+.4f}, SEAL's extra / |that| {row['extra']:+.3f}, sign-flip p over its batches "
              f"{row['sign_flip_p']:.2f}")


def print_schema(design: Design) -> None:
    """M2's figures, once recorded."""
    path = design.records / "schema.json"
    if not path.exists():
        return
    record = json.loads(path.read_text())
    for view, arms in record["views"].items():
        rates = {arm: sum(arms[arm]["passes"].values()) / (len(arms[arm]["passes"]) * record["samples"])
                 for arm in ("off", "on")}
        low, high = mean_interval([(arms["on"]["passes"][task] - passes) / record["samples"]
                                   for task, passes in arms["off"]["passes"].items()])
        print(f"φ_schema, {view} view, {len(arms['off']['passes'])} tasks x {record['samples']}: pass rate off "
              f"{rates['off']:.3f}, on {rates['on']:.3f}; on - off per task {arms['mean_difference']:+.3f} "
              f"[{low:+.3f}, {high:+.3f}] over tasks, sign-flip p = {arms['sign_flip_p']:.3g}; targeted causes "
              f"off {arms['off']['causes']}, on {arms['on']['causes']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=["screen-probe", "screen-pool", "sets", "states", "measure", "schema"],
                        help="the part to run")
    parser.add_argument("--summary-only", action="store_true", help="print the recorded figures, run nothing")
    args = parser.parse_args()
    design = Design()
    if args.part and not args.summary_only:
        if args.part.startswith("screen-"):
            screen(design, args.part.removeprefix("screen-"))
        elif args.part == "sets":
            choose_sets(design)
        elif args.part == "states":
            vanilla_states(design)
        elif args.part == "schema":
            schema_check(design)
        else:
            for state in range(len(design.state_steps) + 1):
                measure_state(design, state)
    summary(design)


if __name__ == "__main__":
    main()
