"""The recipe: one typed configuration for a run, nested by concern.

The field defaults *are* the CPU quickstart (``recipes/quickstart.yaml`` restates them), so ``seal-lite run``
with no recipe runs it. Every field carries its help once, in ``description``. Loading a file turns every
validation problem into one ``RecipeError`` line naming the field, the reason and a fix, all problems at once.
This module is the schema only: whether the models, task ids and backends a recipe names exist on this machine
is checked afterwards by seal_lite/run/preflight.py (``seal-lite run`` and ``seal-lite recipe`` do both).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from seal_lite.core.advantages import WEIGHT_MAX, WEIGHT_MIN
from seal_lite.core.errors import ConfigError
from seal_lite.core.labels import BASE_UTILITY


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Problem = tuple[str, object, str]  # (dotted field, value, what is wrong and the fix)


def _refuse(problems: list[Problem]) -> None:
    if problems:
        raise _FieldErrors([_FieldError(*problem) for problem in problems])


class PolicyConfig(_Section):
    model: str = Field(
        "smollm2-135m",
        description="Policy model: a registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
        "shipped as GGUF in pip packages), a local model directory, a local .gguf file, or a hub id.",
    )
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = Field(
        "auto", description="Training dtype. auto: bfloat16 on a GPU with native bf16 (float16 before Ampere, "
        "e.g. a T4); on a CPU bfloat16 only with AVX512_BF16 or AMX (1.7x faster than float32 there), else float32 "
        "(emulated bf16 is 5-20x slower). float16 (GPU only): what auto picks on a T4, named to train with a T4's "
        "numerics on a newer card. `seal-lite doctor` shows the choice and why."
    )
    lora_r: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(16, ge=1, description="LoRA scaling numerator (scale = alpha / r).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    backend: Literal["auto", "unsloth", "peft-4bit", "peft"] = Field(
        "auto",
        description="How the policy is loaded: unsloth (Unsloth 4-bit QLoRA, NVIDIA GPU), peft-4bit (transformers + "
        "bitsandbytes NF4 + peft LoRA; NVIDIA GPU, or a CPU when named explicitly), peft (LoRA on a bf16/fp32 model, "
        "any device). auto picks the first that works here, in that order (on a CPU: peft); `seal-lite doctor` "
        "shows which.",
    )
    gradient_checkpointing: bool | None = Field(
        None, description="Recompute activations in the backward pass to fit long trajectories (None: on with a GPU)."
    )
    device: Literal["auto", "gpu"] = Field(
        "auto", description="gpu: refuse to start without an NVIDIA GPU that torch can use (the GPU recipes: a 3B "
        "or 7B policy on a CPU would be killed for memory, or run for weeks). auto: a GPU when torch sees one, "
        "else the CPU.",
    )


class DataConfig(_Section):
    split: Literal["train", "eval"] = Field("train", description="Which SEAL split (data/*_ids.txt) to draw tasks from.")
    num_tasks: int = Field(
        4, ge=1, le=400, description="Size of the task slice: the first N ids of the split after a seeded shuffle."
    )
    categories: list[Literal["base", "miss_func", "miss_param", "long_context"]] = Field(
        ["base"], min_length=1, description="BFCL multi-turn categories to draw from."
    )
    task_ids: list[str] | None = Field(
        None, description="Explicit BFCL ids (e.g. multi_turn_base_10); overrides split/num_tasks/categories."
    )
    screen: int | None = Field(
        None, ge=2, description="Frontier screen (not in the paper): before training, play this many samples of every "
        "task of the slice with the base policy, and train only on the tasks it solves sometimes but not always "
        "(pass rate strictly between 0 and 1). Stored in the run's screen table, so a resumed run does not repeat it. "
        "None: train on the whole slice.",
    )
    rescreen_every: int | None = Field(
        None, ge=1, description="Re-screen (not in the paper; needs data.screen): every this many steps, play "
        "data.screen samples of every task of the slice with the current policy, under the current training "
        "interface, and draw the next steps' tasks from the new frontier: tasks the policy has mastered leave it, "
        "tasks it has started to solve join it. Costs a screen of the slice each time. Stored in the run's rescreens "
        "table. None: the frontier of the first screen is kept for the whole run.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        if self.task_ids == []:
            _refuse([("data.task_ids", [], "an empty list selects no task; name BFCL ids such as multi_turn_base_0, "
                      "or remove the field to draw from data.split")])
        if self.rescreen_every and not self.screen:
            _refuse([("data.rescreen_every", self.rescreen_every, "a re-screen plays data.screen samples of each task; "
                      "set data.screen too (e.g. 4), or remove data.rescreen_every")])
        return self


class RolloutConfig(_Section):
    num_generations: int = Field(4, description="G: trajectories per task (the paper uses 8).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of training rollouts.")
    max_new_tokens: int = Field(48, ge=8, description="Token budget of one model call.")
    max_model_calls: int = Field(6, ge=1, description="Model messages per episode, over all turns (paper: 20).")
    max_calls_per_turn: int | None = Field(
        2, ge=1, description="Training only: model messages per user turn before the turn is closed (None: no cap, "
        "as in the paper). Evaluation never caps a turn: it ends when the model answers without a tool call.",
    )
    max_response_tokens: int | None = Field(
        None, ge=8, description="Tokens the model may generate per episode, over all its messages (paper: 4096; "
        "None: no budget beyond max_model_calls x max_new_tokens). Checked after each message.",
    )
    parser: Literal["strict", "lenient"] = Field(
        "strict",
        description="How model messages become calls. strict: the official surface (docs/method.md §8): "
        "<tool_call>{\"name\", \"arguments\"}</tool_call> blocks only, one malformed block or hidden tool rejects "
        "the whole message. lenient: also BFCL's python-call form and unclosed blocks, rejecting only the bad "
        "calls. Evaluation always uses strict.",
    )
    max_turns: int | None = Field(
        2, ge=1, description="Play at most this many user turns per task (None: all). Keeps CPU runs short."
    )
    max_context_tokens: int = Field(
        8192, ge=256, description="Stop the episode before the context exceeds this (paper: 16384; the official tool "
        "block alone is 3-5k tokens).",
    )
    backend: Literal["auto", "transformers", "llamacpp"] = Field(
        "auto",
        description="Who generates rollouts: transformers (the trained model itself) or llamacpp (the policy's "
        "GGUF plus its current LoRA, exported after every update; faster on a CPU, needs a registry model or "
        ".gguf). auto: llamacpp without a GPU when the model is a GGUF, else transformers.",
    )
    generation_batch_size: int | None = Field(
        None, ge=1, description="Most sequences in one generate call (None: a whole step's tasks x G on "
        "transformers, one task's G on llamacpp; evaluation batches as many). Caps the KV cache of GPU rollouts, "
        "which grows with sequences x context length.",
    )
    generation_token_budget: int | None = Field(
        None, description="Most padded tokens in one generate call: sequences x (the longest + max_new_tokens), "
        "longest sequences together (None: no budget, generation_batch_size alone). The GPU recipes set it from "
        "the memory model (seal_lite/core/memory.py, docs/gpu.md), so a call fits the card; at least max_context_tokens.",
    )
    max_logprob_gap: float = Field(
        1.0, gt=0.0, description="llamacpp only: a generated token whose log-probability under llama.cpp and under "
        "the trained model differ by more than this carries no loss (the two engines disagree on it).",
    )

    @model_validator(mode="after")
    def _budget_holds_a_sequence(self) -> RolloutConfig:
        budget = self.generation_token_budget
        if budget is not None and budget < self.max_context_tokens:
            _refuse([("rollout.generation_token_budget", budget, "one generate call must hold a sequence as long as "
                      f"rollout.max_context_tokens ({self.max_context_tokens}); raise the budget or lower the "
                      "context (docs/gpu.md has the budgets that fit each card)")])
        return self


class InterfaceConfig(_Section):
    schema_cues: bool = Field(True, description="phi_schema: mark required parameters and enums; one rule line.")
    recovery_feedback: bool = Field(True, description="phi_err: after a failed call, one hint chosen from the error.")
    capability_hints: bool = Field(
        True, description="phi_cap: a Guidelines block for frequent, costly failure labels (at most 3 lines)."
    )
    hints: Literal["template", "llm"] = Field(
        "template", description="Where guideline texts come from: fixed templates, or the local diagnoser's hints."
    )
    tool_format: Literal["official", "signatures"] = Field(
        "official",
        description="How tools appear in the training system prompt. official: BFCL's JSON docs in the tool block "
        "of docs/method.md §8 (what evaluation shows). signatures: one line per tool, about 6x fewer tokens but "
        "without descriptions or enums, for small CPU budgets; a training-time departure from the paper.",
    )


class DiagnoserConfig(_Section):
    mode: Literal["off", "in_process", "server", "url"] = Field(
        "in_process",
        description="The local diagnoser model that explains failed turns: off; in_process (llama_cpp.Llama in "
        "this process); server (seal-lite starts llama-cpp-python's server on 127.0.0.1 and stops it at the end); "
        "url (an OpenAI-compatible server you run, see diagnoser.url).",
    )
    model: str = Field(
        "qwen2.5-coder-0.5b",  # SmolLM2-135M's explanations often ramble (docs/diagnoser_samples.md)
        description="GGUF of the diagnoser: a registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
        "shipped in pip packages) or a path to a .gguf file.",
    )
    url: str | None = Field(None, description="Base URL of the server for mode url, e.g. http://127.0.0.1:8000.")
    label_authority: Literal["rule", "llm"] = Field(
        "rule",
        description="Which label weights the advantages: the rule label from executable evidence, or the "
        "model's refinement where it gave a valid one.",
    )
    max_per_step: int = Field(
        4, ge=0, description="New failures the model is asked about per step (cached ones are free); bounds its cost."
    )
    timeout_s: float = Field(30.0, gt=0.0, description="Seconds one diagnosis may take before the rule label stands alone.")
    max_tokens: int = Field(256, ge=32, description="Token budget of one diagnosis (two 200-character texts fit).")
    n_ctx: int = Field(4096, ge=512, description="Context size of the diagnoser model.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads for llama.cpp (default: the cores this process may run on).")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value):
        return "off" if value is False else value  # YAML reads a bare `off` as false

    @model_validator(mode="after")
    def _consistent(self) -> DiagnoserConfig:
        problems = []
        if self.mode == "url" and self.url and (problem := url_problem(self.url)):
            problems.append(("diagnoser.url", self.url, problem))
        if self.max_tokens >= self.n_ctx:
            problems.append(("diagnoser.max_tokens", self.max_tokens, f"the answer must fit the context "
                             f"(diagnoser.n_ctx = {self.n_ctx}) beside the prompt; use 256"))
        _refuse(problems)
        return self


class GRPOConfig(_Section):
    steps: int = Field(2, ge=1, description="Number of SEAL steps (policy updates).")
    tasks_per_step: int = Field(2, ge=1, description="Tasks sampled per step (paper: 32).")
    learning_rate: float = Field(
        2e-5, gt=0.0, description="AdamW learning rate (paper: 1e-6 full fine-tuning; LoRA needs more)."
    )
    beta: float = Field(0.001, ge=0.0, description="KL coefficient to the reference policy (paper: 0.001).")
    epsilon: float = Field(0.2, gt=0.0, description="PPO clip range (paper: 0.2).")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field(
        "grpo", description="TRL loss aggregation. grpo: token-mean inside each trajectory, then the mean over "
        "trajectories (the paper's micro-batch-1 token-mean); dapo: one token-mean over the whole batch.",
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="Dual-clip c on negative advantages: the ratio's pessimistic term is capped at c "
        "(verl's clip_ratio_c, trl's delta; paper: 10; None: off). Must exceed 1 + epsilon.",
    )
    diagnosis_weighting: bool = Field(True, description="Multiply advantages by the diagnosis weight w_j.")
    apply_to: Literal["all", "positive", "negative"] = Field(
        "all", description="Which advantages the diagnosis weight scales."
    )
    closed_loop: bool = Field(True, description="Update label utilities rho each step (docs/method.md §5).")
    utilities: dict[str, float] = Field(
        {}, description="Base utility b_z per label, e.g. {state_mismatch: 1.2} (default: docs/method.md §3's table): "
        "rho starts there, the closed-loop target scales it, and pass keeps it; with closed_loop false rho stays at it.",
    )
    mini_batches: int = Field(
        1, ge=1, description="Optimizer steps per SEAL step: the step's trajectories are split into this many "
        "mini-batches (paper: 4). tasks_per_step x num_generations must be divisible by it.",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Trajectories per forward/backward pass; the gradients of a mini-batch's "
        "micro-batches accumulate into one optimizer step, with the same result. None: one group (G, or the "
        "mini-batch if smaller) with shared_prefix, else 1; for loss_type bnpo, whose token mean is per "
        "micro-batch, the whole mini-batch.",
    )
    shared_prefix: bool = Field(
        True, description="Score each group's trajectories with their common prefix (the prompt) computed once: "
        "the same loss and gradients as one pass per trajectory, about G times less prompt compute; memory holds "
        "one prefix and one suffix at a time. Not on the unsloth backend, which keeps its own log-prob path.",
    )
    num_iterations: int = Field(1, ge=1, description="PPO epochs over each step's trajectories (paper: 1).")
    dynamic_sampling: int | None = Field(
        None, ge=1, description="DAPO's dynamic sampling (not in the paper): a group whose rewards are all equal "
        "(no learning signal) is replaced by the group of another task of the pool, until every group has a signal "
        "or this many extra groups were rolled out in the step. None: off.",
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradient clipping norm.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    keep_checkpoints: int = Field(
        2, ge=1, description="Checkpoints kept in RUN/checkpoints (one is written every step; a killed run resumes "
        "from the newest complete one).",
    )

    @field_validator("utilities")
    @classmethod
    def _known_labels(cls, value: dict[str, float]) -> dict[str, float]:
        known = [label for label, base in BASE_UTILITY.items() if base is not None]
        for label, utility in value.items():
            if label not in known:
                raise ValueError(f"unknown failure label {label!r}; use one of {', '.join(known)}")
            if not WEIGHT_MIN <= utility <= WEIGHT_MAX:
                raise ValueError(f"rho({label}) = {utility} is outside [{WEIGHT_MIN}, {WEIGHT_MAX}], the range of the "
                                 "weights")
        return value


class Recipe(_Section):
    name: str = Field("quickstart", description="Run name; the default output directory is runs/<name>.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for task sampling, generation and training.")
    output_dir: str | None = Field(None, description="Where the run's store lives; default runs/<name>.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    interface: InterfaceConfig = Field(default_factory=InterfaceConfig)
    diagnoser: DiagnoserConfig = Field(default_factory=DiagnoserConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)

    @field_validator("name")
    @classmethod
    def _one_directory(cls, value: str) -> str:
        if not value.strip() or value in (".", "..") or any(sep in value for sep in "/\\"):
            raise ValueError("a run name is one directory name (the run goes to runs/<name>); use letters, digits, "
                             "'-' or '_', and --out or output_dir to choose where it goes")
        return value

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        problems = []
        if self.rollout.num_generations < 2:
            problems.append(("rollout.num_generations", self.rollout.num_generations,
                             "GRPO needs at least 2 samples per task to compare them; set it to 4"))
        if self.data.task_ids is None and self.grpo.tasks_per_step > self.data.num_tasks:
            problems.append(("grpo.tasks_per_step", self.grpo.tasks_per_step,
                             f"a step cannot sample more tasks than data.num_tasks ({self.data.num_tasks}); "
                             f"lower it or raise data.num_tasks"))
        if self.data.task_ids and self.grpo.tasks_per_step > len(self.data.task_ids):
            problems.append(("grpo.tasks_per_step", self.grpo.tasks_per_step,
                             f"a step cannot sample more tasks than data.task_ids names ({len(self.data.task_ids)}); "
                             f"lower it or name more ids"))
        generation_batch = self.grpo.tasks_per_step * self.rollout.num_generations
        mini_batch, micro = generation_batch // self.grpo.mini_batches, self.grpo.micro_batch_size
        if generation_batch % self.grpo.mini_batches:
            problems.append(("grpo.mini_batches", self.grpo.mini_batches,
                             f"it must divide tasks_per_step x num_generations ({generation_batch}); "
                             f"use a divisor such as {max(d for d in (1, 2, 4) if generation_batch % d == 0)}"))
        elif micro is not None and mini_batch % micro:
            problems.append(("grpo.micro_batch_size", micro, f"it must divide the mini-batch ({mini_batch} "
                             "trajectories: tasks_per_step x num_generations / mini_batches); use 1"))
        elif micro is not None and self.grpo.loss_type == "bnpo" and micro != mini_batch:
            problems.append(("grpo.micro_batch_size", micro, f"bnpo's token mean is taken per micro-batch, so it "
                             f"must be the whole mini-batch ({mini_batch}); leave it unset or use loss_type dapo"))
        if self.grpo.dual_clip is not None and self.grpo.dual_clip <= 1 + self.grpo.epsilon:
            problems.append(("grpo.dual_clip", self.grpo.dual_clip, f"it must exceed 1 + grpo.epsilon "
                             f"({1 + self.grpo.epsilon}) to cap only what PPO's clip leaves; the paper uses 10"))
        if self.interface.hints == "llm" and self.diagnoser.mode == "off":
            problems.append(("interface.hints", "llm", "hints from the diagnoser need it on; set diagnoser.mode "
                             "to in_process (or server/url), or use interface.hints template"))
        if self.diagnoser.mode == "url" and not self.diagnoser.url:
            problems.append(("diagnoser.url", None, "diagnoser.mode url needs the server's base URL; set "
                             "diagnoser.url (e.g. http://127.0.0.1:8000) or use mode server to let seal-lite start one"))
        _refuse(problems)
        return self

    def micro_batch(self, shared_prefix: bool | None = None, processes: int = 1) -> int:
        """Trajectories per forward/backward pass in each process (``grpo.micro_batch_size`` resolved).
        ``shared_prefix``: whether the update shares prefixes (default ``grpo.shared_prefix``; the trainer says False
        where it cannot); ``processes``: how many processes share each mini-batch (docs/distributed.md)."""
        if self.grpo.micro_batch_size is not None:
            return self.grpo.micro_batch_size
        if self.grpo.loss_type == "bnpo":
            return self.mini_batch()
        shared = self.grpo.shared_prefix if shared_prefix is None else shared_prefix
        # one group per micro-batch: its rows share their prompt (a divisor of the mini-batch, which may hold part
        # of a group or groups plus parts)
        return math.gcd(self.rollout.num_generations, self.mini_batch() // processes) if shared else 1

    def process_problems(self, processes: int) -> list[str]:
        """Why this recipe cannot run across ``processes`` processes (one line each, with the fix), or []."""
        if processes == 1:
            return []
        tasks, mini = self.grpo.tasks_per_step, self.mini_batch()
        fits = [n for n in range(processes, 0, -1) if tasks % n == 0]
        if tasks % processes:
            return [f"grpo.tasks_per_step = {tasks}: each of the {processes} processes rolls out whole tasks, so it "
                    f"must be a multiple of {processes}; set it to {tasks + processes - tasks % processes}, or run "
                    f"{fits[0]} processes"]
        if self.policy.backend == "unsloth":
            return ["policy.backend = 'unsloth': Unsloth trains on one GPU; with several processes use peft-4bit "
                    "(the same 4-bit QLoRA through bitsandbytes and peft)"]
        if self.grpo.loss_type == "bnpo":
            return [f"grpo.loss_type = 'bnpo': its token mean is taken in each process's micro-batch, so {processes} "
                    "processes would change the loss; use loss_type grpo (the default) or dapo"]
        if mini % processes:
            return [f"grpo.mini_batches = {self.grpo.mini_batches}: each mini-batch ({mini} trajectories) is shared "
                    f"by the {processes} processes, so it must be a multiple of {processes}; lower grpo.mini_batches"]
        micro = self.micro_batch(False, processes)  # several processes score without the shared prefix
        if (mini // processes) % micro:
            return [f"grpo.micro_batch_size = {micro}: each process's part of a mini-batch ({mini // processes} "
                    f"trajectories) must be a multiple of it; set it to 1, or leave it unset"]
        return []

    def generation_batch(self) -> int:
        """Sequences per generate call (``rollout.generation_batch_size`` resolved): by default, as many as one
        training step rolls out, so evaluation never batches more than training does."""
        return self.rollout.generation_batch_size or self.grpo.tasks_per_step * self.rollout.num_generations

    def mini_batch(self) -> int:
        """Trajectories per optimizer step."""
        return self.grpo.tasks_per_step * self.rollout.num_generations // self.grpo.mini_batches

    def out_dir(self) -> Path:
        return Path(self.output_dir or Path("runs") / self.name)


class RecipeError(ConfigError):
    """A recipe that cannot be used; the message names the field, the reason and a fix. ``data``: the recipe as
    read (file and overrides merged), when it was read, so a caller can still check its valid sections."""

    def __init__(self, message: str, data: dict | None = None):
        super().__init__(message)
        self.data = data


class _FieldError(ValueError):
    def __init__(self, field: str, value, message: str):
        super().__init__(message)
        self.field, self.value, self.message = field, value, message


class _FieldErrors(ValueError):
    """Several problems found by one validator, reported one line each."""

    def __init__(self, errors: list[_FieldError]):
        super().__init__("; ".join(error.message for error in errors))
        self.errors = errors


def load_recipe(path: str | Path | None = None, overrides: dict | None = None) -> Recipe:
    """Defaults < recipe file < ``overrides`` (dotted keys, e.g. ``{"grpo.steps": 1}``). Nothing is loaded or
    written; ``seal_lite.run.preflight.check`` then checks what the recipe names against this machine."""
    source = str(path) if path else "default recipe"
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise RecipeError(f"{source}: no such file; pass a recipe path such as recipes/quickstart.yaml") from None
        except yaml.YAMLError as error:
            raise RecipeError(f"{source}: not valid YAML ({error}); fix the syntax at the position shown") from None
        if not isinstance(data, dict):
            raise RecipeError(f"{source}: the top level must be a mapping of sections (policy:, grpo:, ...)")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return Recipe.model_validate(data)
    except ValidationError as error:
        raise RecipeError(_explain(source, error), data) from None


def _explain(source: str, error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        context = item.get("ctx", {}).get("error")
        if isinstance(context, (_FieldError, _FieldErrors)):
            errors = context.errors if isinstance(context, _FieldErrors) else [context]
            lines.append(problem_lines(source, [(error.field, error.value, error.message) for error in errors]))
            continue
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {field}: {message}{_fix_for(item)}")
    return "\n".join(lines)


def problem_lines(source: str, problems: list[Problem]) -> str:
    """One line per problem, as every recipe error reads: ``<source>: <field> = <value>: <what to do>``."""
    return "\n".join(f"{source}: {field} = {value!r}: {message}" for field, value, message in problems)


def url_problem(url: str) -> str | None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return "not an http(s) URL; write the server's base URL, e.g. http://127.0.0.1:8000"
    return None


def _fix_for(item: dict) -> str:
    kind = item["type"]
    if kind == "extra_forbidden":
        return "; remove it or check its spelling (seal-lite recipe --fields lists them)"
    if kind == "literal_error":
        return f"; use one of the allowed values (got {item.get('input')!r})"
    if kind in ("greater_than_equal", "greater_than", "less_than", "less_than_equal"):
        return f"; got {item.get('input')!r}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"; got {item.get('input')!r}, write a value of that type"
    return ""


def describe_fields(model: type[BaseModel] = Recipe, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, description) for every leaf field: used by ``seal-lite recipe`` help."""
    rows = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(describe_fields(annotation, f"{prefix}{name}."))
        else:
            rows.append((f"{prefix}{name}", repr(info.get_default(call_default_factory=True)), info.description or ""))
    return rows
