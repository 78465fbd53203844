"""The recipe: one typed configuration for a run, nested by concern.

The field defaults *are* the CPU quickstart (``recipes/quickstart.yaml`` restates them), so ``seal-lite run``
with no recipe runs it. Every field carries its help once, in ``description``. Loading a file turns every
validation problem into one ``RecipeError`` line naming the field, the reason and a fix, all problems at once.
This module is the schema only: whether the models, task ids and backends a recipe names exist on this machine
is checked afterwards by seal_lite/runs/preflight.py (``seal-lite run`` and ``seal-lite recipe`` do both).
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from seal_lite.core.errors import ConfigError
from seal_lite.core.recipe_sections import (
    OFFICIAL_CONTEXT_TOKENS,
    DataConfig,
    DiagnoserConfig,
    FieldProblem,
    FieldProblems,
    GRPOConfig,
    InterfaceConfig,
    LoggingConfig,
    PolicyConfig,
    Problem,
    RolloutConfig,
    Section,
    ValidationConfig,
    category_problems,
    refuse,
)


class Recipe(Section):
    name: str = Field("quickstart", description="Run name; the default output directory is runs/<name>.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed for task sampling, generation and training.")
    output_dir: str | None = Field(None, description="Where the run's store lives; default runs/<name>.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    interface: InterfaceConfig = Field(default_factory=InterfaceConfig)
    diagnoser: DiagnoserConfig = Field(default_factory=DiagnoserConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

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
        if self.data.task_ids is None and self.data.task_file is None and self.grpo.tasks_per_step > self.data.num_tasks:
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
        if (self.validation.every and self.data.environment == "bfcl"
                and self.rollout.max_context_tokens < OFFICIAL_CONTEXT_TOKENS):
            problems.append(("validation.every", self.validation.every, "validation plays BFCL's own view, as "
                             f"`seal-lite eval` does, in a context of at least {OFFICIAL_CONTEXT_TOKENS} tokens (its "
                             "tool block alone is 3-6k); raise rollout.max_context_tokens to "
                             f"{OFFICIAL_CONTEXT_TOKENS}, or set validation.every null"))
        if self.data.environment == "bfcl":
            problems += category_problems("validation.categories", self.validation.categories or [])
        if self.diagnoser.mode == "url" and not self.diagnoser.url:
            problems.append(("diagnoser.url", None, "diagnoser.mode url needs the server's base URL; set "
                             "diagnoser.url (e.g. http://127.0.0.1:8000) or use mode server to let seal-lite start one"))
        if self.rollout.parser in ("toolace", "llama3.1") and self.interface.tool_format != "official":
            problems.append(("interface.tool_format", self.interface.tool_format, "the one-line signatures are a form "
                             f"of Qwen's tool block, and rollout.parser {self.rollout.parser} shows the tools in its "
                             "own prompt; set interface.tool_format official"))
        refuse(problems)
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
        if self.validation.every:
            return [f"validation.every = {self.validation.every}: validation plays the held-out slice in one process; "
                    f"set validation.every null for {processes} processes and score the checkpoints afterwards with "
                    "`seal-lite eval RUN --step N`"]
        tasks, mini = self.grpo.tasks_per_step, self.mini_batch()
        fits = [n for n in range(processes, 0, -1) if tasks % n == 0]
        if tasks % processes:
            return [f"grpo.tasks_per_step = {tasks}: each of the {processes} processes rolls out whole tasks, so it "
                    f"must be a multiple of {processes}; set it to {tasks + processes - tasks % processes}, or run "
                    f"{fits[0]} processes"]
        if self.policy.backend == "unsloth":
            return ["policy.backend = 'unsloth': Unsloth trains on one GPU; with several processes use peft-4bit "
                    "(the same 4-bit QLoRA through bitsandbytes and peft)"]
        if self.rollout.backend == "vllm":
            # each process's engine would take the launcher's process group as its own (vLLM's
            # init_distributed_environment adopts it): refused until that has been tested
            return [f"rollout.backend = 'vllm': vLLM rollouts are untested in {processes} processes (each engine "
                    "would join the launcher's process group); use rollout.backend transformers (or auto), or "
                    "run one process"]
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


def load_recipe(path: str | Path | None = None, overrides: dict | None = None) -> Recipe:
    """Defaults < recipe file < ``overrides`` (dotted keys, e.g. ``{"grpo.steps": 1}``). Nothing is loaded or
    written; ``seal_lite.runs.preflight.load_checked_recipe`` also checks what the recipe names on this machine."""
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
        if isinstance(context, (FieldProblem, FieldProblems)):
            errors = context.errors if isinstance(context, FieldProblems) else [context]
            lines.append(problem_lines(source, [(error.field, error.value, error.message) for error in errors]))
            continue
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {field}: {message}{_fix_for(item)}")
    return "\n".join(lines)


def problem_lines(source: str, problems: list[Problem]) -> str:
    """One line per problem, as every recipe error reads: ``<source>: <field> = <value>: <what to do>``."""
    return "\n".join(f"{source}: {field} = {value!r}: {message}" for field, value, message in problems)


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
