"""The recipe's sections, one typed model per concern: policy, data, rollout, interface, diagnoser, GRPO,
validation, logging.

``seal_lite/core/recipe.py`` puts them together into ``Recipe`` and loads files. Each field carries its help
once, in ``description`` (``seal-lite recipe --fields`` prints it). A validator that finds a problem reports it as a
``Problem`` (field, value, what to do), which ``Recipe``'s loader turns into one line of its error.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from seal_lite.core.advantages import WEIGHT_MAX, WEIGHT_MIN
from seal_lite.core.labels import BASE_UTILITY


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Problem = tuple[str, object, str]  # (dotted field, value, what is wrong and the fix)
BFCL_CATEGORIES = ("base", "miss_func", "miss_param", "long_context")  # BFCL multi-turn's (envs/bfcl.py CATEGORIES)


def refuse(problems: list[Problem]) -> None:
    if problems:
        raise FieldProblems([FieldProblem(*problem) for problem in problems])


class PolicyConfig(Section):
    model: str = Field(
        "qwen2.5-coder-0.5b",
        description="Policy model: a registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
        "shipped as GGUF in pip packages), a local model directory, a local .gguf file, or a hub id.",
    )
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = Field(
        "auto", description="Training dtype. auto: bfloat16 on a GPU with native bf16 (float16 before Ampere, "
        "e.g. a T4); on a CPU bfloat16 only with AVX512_BF16 or AMX (1.7x faster than float32 there), else float32 "
        "(emulated bf16 is 5-20x slower). float16 (GPU only): what auto picks on a T4, named to train with a T4's "
        "numerics on a newer card. `seal-lite doctor` shows the choice and why."
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling numerator (scale = alpha / r).")
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


def category_problems(field: str, categories: list[str]) -> list[Problem]:
    """BFCL categories that are not BFCL's, one problem each, named like the schema names a list item."""
    return [(f"{field}.{index}", category, f"not a BFCL multi-turn category; use one of {', '.join(BFCL_CATEGORIES)}")
            for index, category in enumerate(categories) if category not in BFCL_CATEGORIES]


class DataConfig(Section):
    environment: str = Field(
        "bfcl", min_length=1, description="Where tasks come from and how they are checked: bfcl (BFCL multi-turn, "
        "the paper's), library (the worked example of docs/your-tools.md), or your own as module:attribute or "
        "path/to/file.py:attribute, the attribute a seal_lite ToolEnvironment.",
    )
    split: Literal["train", "eval"] = Field("train", description="Which split to draw tasks from (BFCL: SEAL's, "
                                            "data/*_ids.txt; another environment: its tasks' split).")
    num_tasks: int = Field(
        4, ge=1, le=400, description="Size of the task slice: the first N ids of the split after a seeded shuffle."
    )
    categories: list[str] = Field(
        ["base"], min_length=1, description="Task categories to draw from (BFCL: base, miss_func, miss_param, "
        "long_context)."
    )
    task_ids: list[str] | None = Field(
        None, description="Explicit BFCL ids (e.g. multi_turn_base_10); overrides task_file and split/num_tasks/"
        "categories.",
    )
    task_file: str | None = Field(
        "data/frontier/qwen2.5-coder-0.5b.txt", description="A file of BFCL ids, one per line (# starts a comment), "
        "as `seal-lite screen --write-frontier FILE` writes it; overrides split/num_tasks/categories. A relative path "
        "is read from the current directory, else from where seal-lite's data/ folder is. The default, the frontier "
        "Qwen2.5-Coder-0.5B's screen found, applies only to a BFCL recipe that sets none of task_ids, split, "
        "num_tasks and categories.",
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
        # the default task file is the quickstart's: a recipe that selects tasks in another way draws from those
        chose = self.model_fields_set & {"task_ids", "split", "num_tasks", "categories"} or self.environment != "bfcl"
        if "task_file" not in self.model_fields_set and chose:
            self.task_file = None
        if self.environment == "bfcl":
            refuse(category_problems("data.categories", self.categories))
        if self.task_ids == []:
            refuse([("data.task_ids", [], "an empty list selects no task; name BFCL ids such as multi_turn_base_0, "
                      "or remove the field to draw from data.split")])
        if self.rescreen_every and not self.screen:
            refuse([("data.rescreen_every", self.rescreen_every, "a re-screen plays data.screen samples of each task; "
                      "set data.screen too (e.g. 4), or remove data.rescreen_every")])
        return self


class RolloutConfig(Section):
    num_generations: int = Field(4, description="G: trajectories per task (the paper uses 8).")
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of training rollouts.")
    max_new_tokens: int = Field(96, ge=8, description="Token budget of one model call.")
    max_model_calls: int = Field(4, ge=1, description="Model messages per episode, over all turns (paper: 20).")
    max_calls_per_turn: int | None = Field(
        2, ge=1, description="Training only: model messages per user turn before the turn is closed (None: no cap, "
        "as in the paper). Evaluation never caps a turn: it ends when the model answers without a tool call.",
    )
    max_response_tokens: int | None = Field(
        None, ge=8, description="The response budget, in tokens (paper: 4096; None: none). With budget "
        "model_tokens, what the model may generate per episode over all its messages, checked after each message; "
        "with budget release, what the update trains on: the first this many tokens after the prompt.",
    )
    budget: Literal["model_tokens", "release"] = Field(
        "model_tokens", description="What max_response_tokens bounds. model_tokens: the episode, which ends once "
        "the model has written that many tokens; the update trains on all of them. release: the update, as the "
        "SEAL release does: the episode runs until max_model_calls or until its context is within max_new_tokens "
        "of max_context_tokens, and the update trains on the first max_response_tokens tokens after the prompt, "
        "model and environment tokens alike (environment tokens still carry no loss).",
    )
    parser: Literal["strict", "lenient", "toolace", "llama3.1"] = Field(
        "strict",
        description="The call format, and how model messages become calls. strict: the official surface "
        "(docs/method.md §8): <tool_call>{\"name\", \"arguments\"}</tool_call> blocks only, one malformed block or "
        "hidden tool rejects the whole message. lenient: also BFCL's python-call form and unclosed blocks, rejecting "
        "only the bad calls. toolace and llama3.1: the SEAL release's formats for Llama-family models, each with its "
        "own prompt and tool results (docs/surface.md), strict like strict: ToolACE-2's python call list "
        "[f(a=1), g()], or Meta's raw JSON {\"name\", \"parameters\"}. Evaluation uses strict, or the recipe's "
        "toolace or llama3.1.",
    )
    max_turns: int | None = Field(
        1, ge=1, description="Play at most this many user turns per task (None: all). Keeps CPU runs short."
    )
    max_context_tokens: int = Field(
        4096, ge=256, description="Stop the episode before the context exceeds this (paper: 16384; the official tool "
        "block alone is 3-5k tokens).",
    )
    backend: Literal["auto", "transformers", "paged", "llamacpp", "vllm"] = Field(
        "auto",
        description="Who generates rollouts: transformers (the trained model itself, generate in rounds), paged "
        "(the trained model itself through transformers' continuous batching: each group's opening read once, "
        "every episode on its own; peft and peft-4bit policies, not unsloth), llamacpp (the policy's GGUF plus "
        "its current LoRA, exported after every update; needs a registry model or .gguf) or vllm (vLLM in the "
        "training process, the LoRA handed over after every update; one process; pip install -e '.[vllm]'). "
        "auto: transformers on a GPU (paged and vLLM only when named, until a GPU has measured them); without "
        "one, llamacpp when the model is a GGUF, else paged (docs/rollouts.md has the measurements).",
    )
    vllm_memory: float = Field(
        0.3, gt=0.0, lt=1.0, description="vllm on a GPU: the share of the card's memory the engine takes when it "
        "starts (its copy of the weights, 4-bit when the policy is, and its KV cache); the trainer has the rest, and "
        "the engine sleeps during each update.",
    )
    generation_batch_size: int | None = Field(
        None, ge=1, description="Most sequences in one generate call (None: a whole step's tasks x G; evaluation "
        "and screening batch as many); llamacpp and vllm keep that many episodes live, starting the next when one "
        "ends. Caps the KV cache of GPU rollouts, which grows with sequences x context length.",
    )
    generation_token_budget: int | None = Field(
        None, description="Most padded tokens in one generate call: sequences x (the longest + max_new_tokens), "
        "longest sequences together (None: no budget, generation_batch_size alone). The GPU recipes set it from "
        "the memory model (seal_lite/core/memory.py, docs/gpu.md), so a call fits the card; at least max_context_tokens.",
    )
    cache_tokens: int | None = Field(
        None, ge=1024, description="llamacpp, paged and vllm: tokens of the KV cache, allocated up front (memory is "
        "this x the model's KV bytes per token). llamacpp: a stream of max_context_tokens per sequence, "
        "cache_tokens // max_context_tokens of them (None: generation_batch_size + 2). paged and vllm: all "
        "sequences share it, each prefix held once (None: 4 x max_context_tokens; on a GPU paged fills what the "
        "memory model leaves free, vLLM its vllm_memory share). Sequences that do not fit wait for room.",
    )
    max_logprob_gap: float = Field(
        1.0, gt=0.0, description="llamacpp, paged and vllm: a generated token whose log-probability under the rollout "
        "engine and under the trained model differ by more than this carries no loss (the two engines disagree on "
        "it).",
    )

    def episode_token_cap(self) -> int | None:
        """The most tokens the model may write in one episode (``budget`` model_tokens), or None."""
        return self.max_response_tokens if self.budget == "model_tokens" else None

    def trained_tokens(self) -> int | None:
        """The most tokens after the prompt the update trains on, environment tokens counted (``budget``
        release), or None: all of them."""
        return self.max_response_tokens if self.budget == "release" else None

    @model_validator(mode="after")
    def _budget_holds_a_sequence(self) -> RolloutConfig:
        budget = self.generation_token_budget
        if budget is not None and budget < self.max_context_tokens:
            refuse([("rollout.generation_token_budget", budget, "one generate call must hold a sequence as long as "
                      f"rollout.max_context_tokens ({self.max_context_tokens}); raise the budget or lower the "
                      "context (docs/gpu.md has the budgets that fit each card)")])
        return self


class InterfaceConfig(Section):
    schema_cues: bool = Field(True, description="phi_schema: mark required parameters and enums; one rule line.")
    recovery_feedback: bool = Field(True, description="phi_err: after a failed call, one hint chosen from the error.")
    capability_hints: bool = Field(
        True, description="phi_cap: a Guidelines block for frequent, costly failure labels (at most 3 lines)."
    )
    hints: Literal["template", "llm"] = Field(
        "template", description="Where guideline texts come from: fixed templates, or the local diagnoser's hints."
    )
    guideline_min_count: int = Field(
        3, ge=1,
        description="phi_cap: how often a failure label must occur in the epoch's statistics before it gets a line. "
        "The paper's release uses 8 (its min_tag_count; every shipped recipe but the quickstart states it); 3 lets "
        "a two-step CPU run answer its first step's most common failure.",
    )
    tool_format: Literal["official", "signatures"] = Field(
        "signatures",
        description="How tools appear in the training system prompt. official: BFCL's JSON docs in the tool block "
        "of docs/method.md §8 (what evaluation shows). signatures: one line per tool, about 6x fewer tokens but "
        "without descriptions or enums, for small CPU budgets; a training-time departure from the paper.",
    )


class DiagnoserConfig(Section):
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
        refuse(problems)
        return self


class GRPOConfig(Section):
    steps: int = Field(2, ge=1, description="Number of SEAL steps (policy updates).")
    tasks_per_step: int = Field(2, ge=1, description="Tasks sampled per step (paper: 32).")
    learning_rate: float = Field(
        1e-4, gt=0.0, description="AdamW learning rate (paper: 1e-6 full fine-tuning; LoRA needs more)."
    )
    beta: float = Field(0.0, ge=0.0, description="KL coefficient to the reference policy (paper: 0.001).")
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
    shuffle_rewards: bool = Field(
        False, description="A placebo control for experiments (not in the paper): each group's rewards are permuted "
        "among its trajectories before the advantages, so the update gets the same advantages, unlinked from what "
        "passed. The store, the reward curve and the failure statistics keep the real verdicts.",
    )
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
        4, ge=1, description="DAPO's dynamic sampling (not in the paper): a group whose rewards are all equal "
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


OFFICIAL_CONTEXT_TOKENS = 16384  # the paper's model context: the official tool block alone is 3-6k tokens
SPLIT_CATEGORY_TASKS = 100  # data/train_ids.txt and data/eval_ids.txt hold 100 tasks of each category


class ValidationConfig(Section):
    every: int | None = Field(
        None, ge=1, description="Validate every this many steps, and after the last (the SEAL release: 10, its "
        "test_freq): the current adapter plays the held-out slice once, greedily, under BFCL's own view, scored "
        "by the official verdict, and the best-scoring adapter is kept as RUN/best-adapter beside the final "
        "RUN/adapter (docs/training.md). Validation changes nothing the training sees. None: no validation.",
    )
    before_training: bool = Field(
        False, description="Also validate the base policy before the first step (the release: true); its score is "
        "the one the first best must beat.",
    )
    split: Literal["eval", "train"] = Field(
        "eval", description="Which SEAL split the slice comes from. The release validates on the 400 held-out tasks "
        "its paper reports, so its best checkpoint is chosen on the test set (docs/deviations.md).",
    )
    categories: list[str] | None = Field(
        None, min_length=1,
        description="Task categories of the slice; None: every category of the environment (BFCL's four).",
    )
    tasks_per_category: int | None = Field(
        None, ge=1, description="Only the first N tasks of each category, in the split's order (None: all of them; "
        "the release: all 400). Each task is played once, greedily, as in the release (val_kwargs n 1, temperature 0).",
    )
    task_ids: list[str] | None = Field(
        None, min_length=1, description="Explicit BFCL ids; overrides split, categories and tasks_per_category.",
    )
    metric: Literal["accuracy", "turn_pass_rate"] = Field(
        "accuracy", description="The score that picks the best adapter, averaged over the slice's categories: "
        "accuracy (the official verdict, the paper's metric and the release's choice) or turn_pass_rate (the share "
        "of ground-truth turns passed, which moves long before a small model solves whole tasks). Ties keep the "
        "earlier step.",
    )

    def after(self, step: int, last_step: int) -> bool:
        """Whether a validation follows ``step`` (0: before the first step): every ``every`` steps and after the
        last, as the release's ``test_freq``."""
        if not self.every:
            return False
        if step == 0:
            return self.before_training
        return step % self.every == 0 or step == last_step

    def count(self, steps: int) -> int:
        """How many validations a run of ``steps`` steps plays."""
        return sum(self.after(step, steps) for step in range(steps + 1))

    def slice_size(self) -> int:
        """How many tasks one validation plays."""
        if self.task_ids:
            return len(self.task_ids)
        categories = len(self.categories or BFCL_CATEGORIES)  # BFCL's sizes: the plan is for BFCL runs
        return categories * min(self.tasks_per_category or SPLIT_CATEGORY_TASKS, SPLIT_CATEGORY_TASKS)


TRACKERS = ("none", "trackio", "tensorboard", "wandb")


class LoggingConfig(Section):
    report_to: Literal["none", "trackio", "tensorboard", "wandb"] = Field(
        "none", description="Where else each step's metrics go, besides the run's store: none (the store only: "
        "local and account-free), trackio (Trackio's local database; `trackio show --project seal-lite`), tensorboard "
        "(RUN/tensorboard; `tensorboard --logdir RUN/tensorboard`) or wandb (Weights & Biases, logged in or "
        "WANDB_MODE=offline). TRL's trainer reports its own figures there too. A tracker that is not installed or "
        "cannot start never stops the run: one warning, then the store alone.",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker(cls, value):
        if value is False or value is None:  # YAML reads a bare `off` or `no` as false, and `null` as None
            return "none"
        if isinstance(value, str) and value.strip().lower() in TRACKERS:
            return value.strip().lower()
        trackers = ", ".join(TRACKERS)
        if isinstance(value, (list, tuple)):
            refuse([("logging.report_to", value, f"a run reports to one tracker; choose one of {trackers}")])
        refuse([("logging.report_to", value, f"seal-lite reports to {trackers}; use one of them, e.g. "
                 "logging.report_to: tensorboard (pip install tensorboard)")])


class FieldProblem(ValueError):
    def __init__(self, field: str, value, message: str):
        super().__init__(message)
        self.field, self.value, self.message = field, value, message


class FieldProblems(ValueError):
    """Several problems found by one validator, reported one line each."""

    def __init__(self, errors: list[FieldProblem]):
        super().__init__("; ".join(error.message for error in errors))
        self.errors = errors


def url_problem(url: str) -> str | None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return "not an http(s) URL; write the server's base URL, e.g. http://127.0.0.1:8000"
    return None
