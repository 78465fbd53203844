"""``seal-lite rehearse RECIPE``: a GPU recipe's own configuration, at toy size, on this CPU, before a card is rented.

What a recipe's first run meets depends on its configuration more than on its size: the policy backend and its
4-bit layers, the dtype its card computes in (fp16 with loss scaling on a T4), the rollout engine and the
attention that engine plays with, the update's shared prefix with kept suffix graphs, validation, checkpoints and a
resume after a crash. A rehearsal runs those for two steps with a random-weight model of the recipe's
architecture shrunk to two layers, a narrow width and the local tokenizer's vocabulary (``toy_model.shrunk``): the
real ``seal-lite run`` in a child process, killed with SIGKILL once step 1's checkpoint is committed, then run
again, which must resume and finish. It then says what ran, what stood in for what, and what only a GPU shows.

Stand-ins, each in the report:

* the weights are random, so no episode would pass a task and no update would happen: the first half of each
  group's episodes answer their first message with the task's ground truth (the same rows on a resumed step), its
  log-probs scored by the policy itself, so the engine comparison still compares engines;
* each step plays ``TOY_TASKS_PER_STEP`` task(s) of the recipe's slice, ``TOY_GROUP`` episodes each, of one turn
  and short messages; validation runs after every step on one held-out task; the diagnoser is the recipe's, at
  most one diagnosis a step;
* fp16's loss scaling: accelerate makes no GradScaler on a CPU, so the rehearsal hands it the one it makes on a
  GPU (``scale_fp16_losses``);
* what this CPU cannot run is replaced by the nearest that it can, named: Unsloth (no GPU) by bitsandbytes NF4 and
  peft, vLLM by the paged engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from seal_lite.core.errors import ConfigError
from seal_lite.core.recipe import Recipe
from seal_lite.engines.model_sources import model_shape
from seal_lite.runs.toy_model import random_model_dir, shrunk

STEPS = 2
TOY_GROUP = 4  # episodes a task: two micro-batches of two share each group's prompt
TOY_TASKS_PER_STEP = 1
FACTS = "facts.jsonl"  # what each child process saw, a JSON line each


@dataclass
class Setting:
    """One aspect of the run: what the recipe runs on its card, and what ran here."""

    name: str
    on_card: str
    rehearsed: str
    note: str = ""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Rehearsal:
    """The plan of a rehearsal and, once it ran, what it showed."""

    recipe: Recipe
    card: object  # seal_lite.core.plan.Card
    settings: list[Setting]
    overrides: dict  # on top of the recipe: the toy run
    checks: list[Check] = field(default_factory=list)
    out_dir: Path | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)


GPU_ONLY = [
    "speed and memory at the real sizes (`seal-lite recipe RECIPE --card CARD` estimates them)",
    "CUDA kernels: bitsandbytes' CUDA NF4, SDPA's memory-efficient/flash kernels, fp16 overflow at the real widths",
    "the allocator: the rollouts' memory handed back to the card before the update, fragmentation",
    "Unsloth's kernels and trainer, vLLM, CUDA graphs (where the recipe names them)",
]


def default_card(recipe: Recipe):
    """The card a recipe is written for: the smallest class on which the memory model says its rollouts (the widest
    generate call, or the paged engine's KV pool) and its update fit."""
    from seal_lite.core.plan import CARDS, card_plan

    shape = model_shape(recipe.policy.model)
    for card in sorted(CARDS, key=lambda card: card.memory_gb):
        planned = card_plan(recipe, shape, card)
        rollouts_fit = planned["pool_fits"] if planned["rollouts"] == "paged" else planned["call_fits"]
        if rollouts_fit and planned["update_fits"]:
            return card
    return max(CARDS, key=lambda card: card.memory_gb)


def plan(recipe: Recipe, card, model_dir: str, task_ids: list[str], held_out: list[str]) -> Rehearsal:
    """The rehearsal of ``recipe`` for ``card``: each setting on the card and here, and the toy run's overrides."""
    from seal_lite.engines.policy import choose_backend
    from seal_lite.engines.rollout_engine import rollout_choice

    policy, rollout = recipe.policy, recipe.rollout
    settings = []
    backend, why = choose_backend(policy.backend, True, {"unsloth", "bitsandbytes"})  # the card, with '.[gpu]'
    ran = "peft-4bit" if backend == "unsloth" else backend
    settings.append(Setting("policy backend", f"{backend} ({why})", ran,
                            "Unsloth needs a GPU: the same NF4 layers through bitsandbytes and peft" if ran != backend
                            else ""))
    dtype = policy.dtype if policy.dtype != "auto" else ("bfloat16" if card.bf16 else "float16")
    quantized = ran == "peft-4bit"  # bitsandbytes 0.50.2 computes NF4 layers in fp16 and bf16 on a CPU too
    note = ("fp16 with loss scaling: the GradScaler accelerate makes on a GPU (it makes none on a CPU)"
            if dtype == "float16" else "")
    settings.append(Setting("dtype", dtype + (" (the card has no bf16)" if dtype == "float16" and policy.dtype == "auto"
                                              else ""), dtype, note))
    settings.append(Setting("4-bit layers", "NF4 (bitsandbytes)" if backend in ("unsloth", "peft-4bit") else "none",
                            "NF4 (bitsandbytes' CPU kernels)" if quantized else "none"))
    engine, _ = rollout_choice(recipe, gpu=True)
    engine_ran = {"vllm": "paged", "llamacpp": "llamacpp"}.get(engine, engine)
    settings.append(Setting("rollout engine", engine + (" (auto, on a GPU)" if rollout.backend == "auto" else ""),
                            engine_ran,
                            "vLLM needs a GPU: transformers' continuous batching, the nearest" if engine == "vllm"
                            else ""))
    attention = {"paged": "paged|sdpa", "transformers": "sdpa"}.get(engine_ran, "llama.cpp's")
    settings.append(Setting("attention", attention, attention + " (checked as it plays)"))
    checkpointing = policy.gradient_checkpointing is not False
    shared = recipe.grpo.shared_prefix and backend != "unsloth"  # Unsloth's trainer reads each trajectory whole
    settings.append(Setting("update", _update_text(shared, checkpointing), _update_text(shared, checkpointing),
                            "suffix graphs kept within half the free memory, RAM here" if shared and checkpointing
                            else ""))
    before = ", and before training" if recipe.validation.before_training else ""
    settings.append(Setting("validation", f"every {recipe.validation.every} steps{before}" if recipe.validation.every
                            else "none", f"after every step{before}, one held-out task"))
    settings.append(Setting("model", f"{policy.model} ({_shape_text(model_shape(policy.model))})",
                            f"random weights ({_shape_text(shrunk(model_shape(policy.model)))})"))
    mini_batches = 2  # two micro-batches of TOY_GROUP / 2 episodes: the old log-probs are TRL's pass, as off-policy
    overrides = {
        "name": f"{recipe.name}-rehearsal",
        "policy.model": model_dir, "policy.device": "auto", "policy.backend": ran, "policy.dtype": dtype,
        "policy.gradient_checkpointing": checkpointing,
        "rollout.backend": engine_ran, "rollout.num_generations": TOY_GROUP, "rollout.max_turns": 1,
        "rollout.max_model_calls": 2, "rollout.max_new_tokens": 16, "rollout.cache_tokens": None,
        "data.task_ids": task_ids, "data.task_file": None, "data.screen": None,
        "grpo.tasks_per_step": TOY_TASKS_PER_STEP, "grpo.steps": STEPS, "grpo.mini_batches": mini_batches,
        "grpo.micro_batch_size": None, "grpo.keep_checkpoints": 1, "grpo.shared_prefix": shared,
        "validation.every": 1, "validation.task_ids": held_out,
        "validation.before_training": recipe.validation.before_training,
        "diagnoser.max_per_step": 1,
    }
    if rollout.generation_token_budget is not None:  # rows of the whole context: one call plays a group
        overrides["rollout.generation_token_budget"] = TOY_GROUP * rollout.max_context_tokens
    return Rehearsal(recipe, card, settings, overrides)


def _update_text(shared: bool, checkpointing: bool) -> str:
    parts = ["each group's prompt computed once" if shared else "one pass per trajectory"]
    if checkpointing:
        parts.append("gradient checkpointing" + (", suffix graphs kept" if shared else ""))
    return "; ".join(parts)


def _shape_text(shape) -> str:
    return (f"{shape.layers} layers, width {shape.hidden}, {shape.heads}/{shape.kv_heads} heads, "
            f"vocabulary {shape.vocab}")


def rehearse(recipe: Recipe, out_dir: Path, card=None, echo=lambda line: None) -> Rehearsal:
    """Rehearse ``recipe`` (loaded, not checked: its card is elsewhere) in ``out_dir`` for ``card`` (None: the card
    it is written for, ``default_card``): the toy run, killed after step 1's checkpoint and resumed, then checked."""
    from seal_lite.engines.policy import GPU_LIBRARY, installed_backends
    from seal_lite.envs.registry import find_environment
    from seal_lite.runs.tasks import select_task_ids, slice_tasks
    from seal_lite.runs.validation import validation_task_ids

    if "bitsandbytes" not in installed_backends() and recipe.policy.backend in GPU_LIBRARY:
        raise ConfigError("rehearse: bitsandbytes is not installed, and this recipe's layers are 4-bit: pip install "
                          "-e '.[test]' (or bash scripts/setup.sh)")
    card = card or default_card(recipe)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = out_dir / "toy-model"  # built afresh (about a second): the recipe's model may have changed
    family = "llama" if "llama" in recipe.policy.model.lower() else "qwen2"
    random_model_dir(shrunk(model_shape(recipe.policy.model)), str(model_dir), family=family)
    environment = find_environment(recipe.data.environment)
    tasks = slice_tasks(recipe, select_task_ids(recipe))
    playable = [task_id for task_id, task in tasks.items() if task.ground_truth and task.ground_truth[0]]
    if len(playable) < STEPS * TOY_TASKS_PER_STEP:
        raise ConfigError(f"rehearse: the recipe's slice has {len(playable)} tasks whose first turn makes a call; "
                          f"a rehearsal plays {STEPS * TOY_TASKS_PER_STEP}")
    held_out = validation_task_ids(recipe.validation.model_copy(update={"task_ids": None, "tasks_per_category": 1}),
                                   environment)[:1]
    rehearsal = plan(recipe, card, str(model_dir), playable[: STEPS * TOY_TASKS_PER_STEP], held_out)
    rehearsal.out_dir = out_dir
    toy_recipe = _toy_recipe(recipe, rehearsal.overrides)
    recipe_file = out_dir / "rehearsal.yaml"
    recipe_file.write_text(yaml.safe_dump(toy_recipe.model_dump(mode="json"), sort_keys=False))
    run_dir, facts = out_dir / "run", out_dir / FACTS
    started = time.perf_counter()
    echo(f"Rehearsing {recipe.name} for the {card.name} in {out_dir}: {STEPS} steps, killed after step 1's "
         "checkpoint and resumed")
    command = [sys.executable, "-m", "seal_lite", "rehearsal-child", str(facts), "run", str(recipe_file), "--out",
               str(run_dir)]
    with open(out_dir / "first-run.out", "w") as output:  # a file: a full pipe would stall the run
        first = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        killed = kill_after_checkpoint(first, run_dir / "seal.db")
    echo(f"  killed after step {killed}" if killed else "  the first run ended before a checkpoint: "
         + (out_dir / "first-run.out").read_text(errors="replace")[-2000:])
    second = subprocess.run(command, capture_output=True, text=True)
    (out_dir / "second-run.out").write_text(second.stdout + second.stderr)
    rehearsal.seconds = time.perf_counter() - started
    rehearsal.checks = check_run(rehearsal, run_dir, facts, killed, second)
    return rehearsal


def _toy_recipe(recipe: Recipe, overrides: dict) -> Recipe:
    """``recipe`` with the rehearsal's overrides, validated as a recipe."""
    values = recipe.model_dump(mode="json")
    for dotted, value in overrides.items():
        *sections, name = dotted.split(".")
        target = values
        for section in sections:
            target = target.setdefault(section, {})
        target[name] = value
    return Recipe.model_validate(values)


def kill_after_checkpoint(process: subprocess.Popen, db_path: Path) -> int | None:
    """SIGKILL ``process`` as soon as its store has a committed checkpoint; the last committed step then, or None
    if the process ended first."""
    while process.poll() is None:
        with contextlib.suppress(sqlite3.Error):
            with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)) as db:
                step = db.execute("SELECT MAX(step) FROM checkpoints").fetchone()[0]
            if step is not None:
                process.kill()  # SIGKILL, as kill -9: the process cannot react
                process.wait()
                return step
        time.sleep(0.1)
    return None


def check_run(rehearsal: Rehearsal, run_dir: Path, facts_file: Path, killed: int | None,
              second: subprocess.CompletedProcess) -> list[Check]:
    """What the toy run must have shown, from its store, its directory and the facts its processes recorded."""
    from seal_lite.engines.store import Store

    checks = [Check("killed after a checkpoint", killed is not None and 1 <= killed < STEPS,
                    f"SIGKILL after step {killed}" if killed else "the first run ended before its first checkpoint")]
    if not (run_dir / "seal.db").exists():
        return [*checks, Check("run", False, _tail(second.stdout + second.stderr))]
    store = Store.open_readonly(run_dir / "seal.db")
    steps = {row["step"]: store.step_metrics(row["step"]) for row in store.steps()}
    finished = second.returncode == 0 and sorted(steps) == list(range(1, STEPS + 1))
    said = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", second.stdout)  # without a terminal's colours (a notebook's)
    checks.append(Check("resumed and finished", finished and f"Resuming after step {killed}" in said,
                        f"steps {sorted(steps)}, exit code {second.returncode}"
                        + ("" if finished else f": {_tail(second.stdout + second.stderr)}")))
    signal = [step for step, metrics in steps.items() if metrics.get("grpo/update_skipped") == 0]
    moved = [step for step in signal if steps[step].get("grpo/lora_change", 0) > 0]
    checks.append(Check("updates applied", bool(signal) and moved == signal,
                        f"steps with a learning signal {signal}, the LoRA moved on {moved}"))
    facts = [json.loads(line) for line in facts_file.read_text().splitlines()] if facts_file.exists() else []
    settings = {setting.name: setting for setting in rehearsal.settings}
    dtypes = {fact["dtype"] for fact in facts if "dtype" in fact}
    wanted = "torch." + settings["dtype"].rehearsed
    checks.append(Check("dtype", dtypes == {wanted}, f"the policy computed in {', '.join(sorted(dtypes)) or '?'}"))
    if wanted == "torch.float16":
        scaled = [fact for fact in facts if "loss_scale" in fact]
        skipped = sum(fact["skipped_steps"] for fact in scaled)
        checks.append(Check("fp16 loss scaling", bool(scaled) and skipped == 0,
                            f"GradScaler at scale {scaled[-1]['loss_scale']:g}, {skipped} optimizer steps skipped"
                            if scaled else "no GradScaler ran"))
    layers = {fact["linear4bit"] for fact in facts if "linear4bit" in fact}
    quantized = settings["4-bit layers"].rehearsed != "none"
    checks.append(Check("4-bit layers", (min(layers, default=0) > 0) == quantized and bool(layers),
                        f"{max(layers, default=0)} bitsandbytes Linear4bit layers"))
    attention = {value for fact in facts for value in fact.get("attention", [])}
    expected = settings["attention"].on_card
    checks.append(Check("attention", attention == {expected} or settings["rollout engine"].rehearsed == "llamacpp",
                        f"played with {', '.join(sorted(attention)) or 'nothing recorded'}"))
    updates = [fact for fact in facts if "shared_prefix" in fact]
    shared = settings["update"].on_card.startswith("each group's")
    kept = any(fact["hold_bytes"] > 0 for fact in updates)
    want_kept = "suffix graphs kept" in settings["update"].on_card
    checks.append(Check("update path", bool(updates) and all(fact["shared_prefix"] == shared for fact in updates)
                        and kept == want_kept,
                        f"shared prefix {updates[-1]['shared_prefix'] if updates else '?'}, suffix graphs kept: "
                        + (f"up to {max(f['hold_bytes'] for f in updates) / 2**30:.1f} GiB" if kept else "none")))
    gaps = [metrics["grpo/engine/logprob_gap_mean"] for metrics in steps.values()
            if "grpo/engine/logprob_gap_mean" in metrics]
    if settings["rollout engine"].rehearsed in ("paged", "llamacpp"):
        checks.append(Check("engine log-probs", bool(gaps) and max(gaps) < 0.1,
                            f"mean gap to the trainer's {max(gaps):.4f} nats" if gaps else "no gap logged"))
    validations = sorted({row["step"] for row in store.validations()})
    first = 0 if rehearsal.recipe.validation.before_training else 1
    checks.append(Check("validation", validations == list(range(first, STEPS + 1)),
                        f"validated {'before training and ' if first == 0 else ''}after steps "
                        f"{[step for step in validations if step]}"))
    kept_dirs = sorted(path.name for path in (run_dir / "checkpoints").glob("checkpoint-*"))
    checks.append(Check("checkpoints", len(kept_dirs) == 1 and (run_dir / "adapter").is_dir(),
                        f"{', '.join(kept_dirs)} kept (grpo.keep_checkpoints 1), adapter saved"))
    return checks


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --- the child process: `seal-lite run` with the stand-ins, recording what ran ------------------------------------

def instrument(facts_file: str) -> None:
    """Set this process up as a rehearsal's child (``seal-lite rehearsal-child``, which then runs ``seal-lite run``):
    the ground-truth stand-in, fp16's loss scaling and fp16 allowed on a CPU, and each fact the checks need
    appended to ``facts_file``."""
    from seal_lite.engines import paged_rollouts, policy, transformers_generate
    from seal_lite.runs import preflight
    from seal_lite.training import grpo

    def record(**fact) -> None:
        with open(facts_file, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), **fact}) + "\n")

    load_policy, build_trainer = policy.load_policy, grpo.build_trainer
    continuous_batching = paged_rollouts._continuous_batching

    def recording_load_policy(model_dir, recipe):
        loaded = load_policy(model_dir, recipe)
        record(dtype=str(loaded.dtype), linear4bit=policy.count_linear4bit(loaded.model), backend=loaded.backend)
        return loaded

    def recording_build_trainer(*args, **kwargs):
        trainer = build_trainer(*args, **kwargs)
        scale_fp16_losses(trainer)
        trainer.add_callback(_FactsCallback(trainer, record))
        return trainer

    seen_attention: set[str] = set()

    def record_attention(model) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if base.config._attn_implementation not in seen_attention:
            seen_attention.add(base.config._attn_implementation)
            record(attention=[base.config._attn_implementation])

    @contextlib.contextmanager
    def recording_continuous_batching(model, *args, **kwargs):
        with continuous_batching(model, *args, **kwargs) as pair:
            record_attention(model)  # what the call plays with
            yield pair

    def recording_generate(self, *args, **kwargs):
        record_attention(self.model)
        return generate(self, *args, **kwargs)

    def cpu_fp16_allowed(section):  # a user's fp16 on a CPU is refused: it is slow and unscaled there
        return [problem for problem in policy_problems(section) if problem[:2] != ("policy.dtype", "float16")]

    policy_problems = preflight.policy_problems
    preflight.policy_problems = cpu_fp16_allowed
    policy.load_policy, grpo.build_trainer = recording_load_policy, recording_build_trainer
    paged_rollouts._continuous_batching = recording_continuous_batching
    _stand_in_ground_truth()
    generate = transformers_generate.TransformersGenerator.generate
    transformers_generate.TransformersGenerator.generate = recording_generate


def scale_fp16_losses(trainer) -> None:
    """fp16 on a CPU: give accelerate the GradScaler it makes on a GPU, so the scaled backward, the unscale before
    the norm clip and the skip of a step with inf/NaN gradients run as on a T4 (accelerate 1.16 makes none on a
    CPU, ``Accelerator.__init__``: fp16 would train unscaled here). Its autocast comes with it (``native_amp``),
    wrapping the model's forward as on the GPU."""
    import torch

    accelerator = trainer.accelerator
    if trainer.args.fp16 and accelerator.device.type == "cpu" and accelerator.scaler is None:
        accelerator.scaler, accelerator.native_amp = torch.amp.GradScaler("cpu"), True


class _FactsCallback:
    """Records, after each optimizer step, the update's path and fp16's loss scale (a TrainerCallback by duck
    typing: transformers calls the methods a callback has)."""

    def __init__(self, trainer, record):
        self.trainer, self.record, self.skipped = trainer, record, 0

    def __getattr__(self, name):  # every event transformers sends that this callback does not handle
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):
        from seal_lite.training.shared_prefix import hold_budget

        trainer = self.trainer
        self.skipped += int(trainer.accelerator.optimizer_step_was_skipped)
        scaler = trainer.accelerator.scaler
        device = next(trainer.model.parameters()).device
        fact = {"shared_prefix": trainer.shared_prefix, "hold_bytes": hold_budget(device)
                if trainer.args.gradient_checkpointing else 0.0, "skipped_steps": self.skipped}
        if scaler is not None:
            fact["loss_scale"] = scaler.get_scale()
        self.record(**fact)


def _stand_in_ground_truth() -> None:
    """In each group of a training step's rollouts, the first half of the episodes answer their first message with
    the task's ground truth (a random model never passes a task: the groups would carry no learning signal). On
    the paged engine the answer's log-probs are the policy's own, scored before the call plays (the model's
    attention is paged while it plays), so the update's engine comparison still compares the engine with the
    trainer."""
    from seal_lite.engines.paged_rollouts import PagedGenerator
    from seal_lite.engines.transformers_generate import TransformersGenerator
    from seal_lite.step import algorithm

    training: dict = {}
    rollout_groups, play, generate = algorithm.rollout_groups, PagedGenerator._play, TransformersGenerator.generate

    def training_rollout_groups(pairs, group_size, generator, rollout, *args, **kwargs):  # a step's (not validation's)
        training["tasks"], training["parser"] = [task for task, _ in pairs], rollout.parser
        try:
            return rollout_groups(pairs, group_size, generator, rollout, *args, **kwargs)
        finally:
            training.clear()

    def answers(tokenizer, batch) -> dict[int, list[int]]:
        """{row: the ground truth's ids} for the first half of each task's rows among ``batch``'s openings."""
        rows: dict[str, list[int]] = {}
        for row, context in enumerate(batch):
            text = tokenizer.decode(context)
            task = next((task for task in training.get("tasks", []) if task.user_message(0) in text), None)
            if task is not None and text.count("<|im_start|>assistant") == 1:
                rows.setdefault(task.id, []).append(row)
        tasks = {task.id: task for task in training.get("tasks", [])}
        return {row: ground_truth_ids(tokenizer, tasks[task_id], training["parser"]) for task_id, group in rows.items()
                for row in group[: len(group) // 2]}

    def scripted_play(self, batch, budgets, temperature, on_message, max_live=None):
        right = answers(self.tokenizer, batch) if on_message is not None else {}
        scored = {row: own_logprobs(self.model, self.mode, batch[row], ids, temperature) for row, ids in right.items()}

        def scripted(row, ids, logprobs):
            if row in right:
                ids, logprobs = right.pop(row), scored[row]
            return on_message(row, ids, logprobs)

        return play(self, batch, budgets, temperature, scripted if on_message is not None else None, max_live)

    def scripted_generate(self, batch, max_new_tokens, temperature):
        messages = generate(self, batch, max_new_tokens, temperature)
        right = answers(self.tokenizer, batch)
        return [right.get(row, ids) for row, ids in enumerate(messages)]

    algorithm.rollout_groups = training_rollout_groups
    PagedGenerator._play, TransformersGenerator.generate = scripted_play, scripted_generate


def ground_truth_ids(tokenizer, task, parser: str) -> list[int]:
    """The task's first-turn ground truth as a model answers under ``parser``, with the end-of-sequence token:
    <tool_call> JSON blocks (strict, lenient), ToolACE's python call list, or Llama 3.1's JSON."""
    from seal_lite.core.calls import parse_calls

    calls = parse_calls("[" + ", ".join(task.ground_truth[0]) + "]").calls
    if parser == "toolace":
        text = "[" + ", ".join(task.ground_truth[0]) + "]"
    elif parser == "llama3.1":
        text = json.dumps([{"name": call.name, "parameters": call.arguments} for call in calls])
    else:
        text = "\n".join("<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"
                          for call in calls)
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def own_logprobs(model, mode, context: list[int], ids: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of ``ids`` after ``context`` under ``model``, in generation mode."""
    import torch

    with torch.no_grad(), mode(model):
        sequence = torch.tensor([context + ids], device=model.device)
        logits = model(input_ids=sequence).logits[0, len(context) - 1 : -1].float() / (temperature or 1.0)
        return logits.log_softmax(-1).gather(-1, sequence[0, len(context):, None])[:, 0].tolist()
