"""What a run shows on the terminal: the resolved recipe, a progress bar per step, the closing summary."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from seal_lite.core import metrics as m
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.core.trend import reward_trend

console = Console()
progress_console = Console(stderr=True)  # evaluation progress: stdout keeps only the results table


def print_recipe(recipe, out_dir) -> None:
    r = recipe
    console.print(
        f"[bold]seal-lite run[/] {r.name}: model={r.policy.model}, {r.grpo.steps} steps x "
        f"{r.grpo.tasks_per_step} tasks x G={r.rollout.num_generations}, categories={','.join(r.data.categories)}, "
        f"schema_cues={r.interface.schema_cues}, weighting={r.grpo.diagnosis_weighting}"
        + (f", validation every {r.validation.every} steps" if r.validation.every else "") + f" -> {out_dir}"
    )


class RichProgress:
    """One bar per SEAL step: it fills as task groups are rolled out, then shows the step's reward."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.bars = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"), console=console,
            disable=not console.is_terminal,  # logs and notebooks get the one-line-per-step text instead
        )
        self.bar = self.screen_bar = None
        self.step, self.tasks, self.done = 0, 0, 0

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc)

    def screen_started(self, step: int, num_tasks: int) -> None:
        """A re-screen (data.rescreen_every) before ``step``: a bar of its own."""
        self.screen_bar = self.bars.add_task(f"step {step}/{self.total_steps} re-screen", total=num_tasks, status="")
        self.screened = self.kept = 0

    def task_screened(self, task_id: str, passes: int, samples: int) -> None:
        if self.screen_bar is None:
            self.screen_bar = self.bars.add_task("screen (frontier tasks)", total=None, status="")
            self.screened = self.kept = 0
        self.screened += 1
        self.kept += 0 < passes < samples
        status = f"{self.kept} of {self.screened} kept; {task_id}: {passes}/{samples} passed"
        self.bars.update(self.screen_bar, advance=1, status=status)
        if not console.is_terminal:
            console.print(f"screen: {status}", highlight=False)

    def tasks_excluded(self, task_ids: list[str], reason: str) -> None:
        console.print(f"screen: {len(task_ids)} tasks left out, {reason}: {', '.join(task_ids)}", highlight=False)

    def run_started(self, resumed_after: int, setup: str) -> None:
        if resumed_after:
            console.print(f"Resuming after step {resumed_after} (its checkpoint); {setup}")
        else:
            console.print(setup[0].upper() + setup[1:])

    def step_started(self, step: int, num_tasks: int) -> None:
        self.bar = self.bars.add_task(f"step {step}/{self.total_steps} rollouts", total=num_tasks, status="")
        self.step, self.tasks, self.done = step, num_tasks, 0

    def task_done(self, task_id: str, rewards: list[float]) -> None:
        self.done += 1
        # past the step's tasks, dynamic sampling is rolling out groups that replace those without a signal
        where = (f"task {self.done}/{self.tasks}" if self.done <= self.tasks
                 else f"extra group {self.done - self.tasks} (dynamic sampling)")
        self.bars.update(self.bar, total=max(self.tasks, self.done), completed=self.done,
                         status=f"{task_id}: rewards {rewards}")
        if not console.is_terminal:  # a step can take many minutes on a GPU: show each task group as it finishes
            console.print(f"step {self.step}/{self.total_steps}: {where} {task_id}, "
                          f"rewards {[round(reward) for reward in rewards]}", soft_wrap=True)  # one line per group

    def step_finished(self, step: int, metrics: dict[str, float]) -> None:
        failures = {label: rate for label, rate in m.LABEL_RATE.values_in(metrics).items() if label not in SUCCESS_LABELS}
        top = max(failures, key=failures.get) if failures else "none"
        diagnoser_s, rescreen_s = m.DIAGNOSER_COUNTS["seconds"].name, m.PHASE_SECONDS.key("rescreen")
        rollouts = metrics[m.ROLLOUT_SECONDS.name] - metrics.get(diagnoser_s, 0) - metrics.get(rescreen_s, 0)
        drawn, taken = metrics[m.REWARD_MEAN.name], metrics.get(m.REWARD_UPDATE_MEAN.name, metrics[m.REWARD_MEAN.name])
        reward = f"reward {drawn:.2f}" + (f" (update batch {taken:.2f})" if taken != drawn else "")  # groups replaced
        status = (f"{reward}  weights {metrics[m.WEIGHT_MIN.name]:.2f}-{metrics[m.WEIGHT_MAX.name]:.2f}  top failure "
                  f"{top}  interface v{metrics[m.INTERFACE_VERSION.name]:.0f}  rollouts {rollouts:.0f} s")
        if m.RESCREENED_TASKS.name in metrics:
            status += (f"  re-screen {metrics[rescreen_s]:.0f} s ({metrics[m.RESCREEN_KEPT.name]:.0f} of "
                       f"{metrics[m.RESCREENED_TASKS.name]:.0f} on the frontier; drawing from "
                       f"{metrics[m.FRONTIER_TASKS.name]:.0f})")
        if diagnoser_s in metrics:
            status += f"  diagnoser {metrics[diagnoser_s]:.0f} s ({metrics[m.DIAGNOSER_COUNTS['asked'].name]:.0f} asked)"
        self.bars.update(self.bar, description=f"step {step}/{self.total_steps} done    ", status=status)
        if not console.is_terminal:  # logs and notebooks get one line per step instead of a live bar
            no_signal = metrics.get(m.ADVANTAGE_ABS_MEAN.name) == 0
            update = "no learning signal (each group's rewards are equal)" if no_signal else "policy update follows"
            console.print(f"step {step}/{self.total_steps}: {status}; {update}", soft_wrap=True)  # one line a step

    def validation_started(self, step: int, num_tasks: int) -> None:
        name = "before step 1" if step == 0 else f"after step {step}/{self.total_steps}"
        self.validation_bar = self.bars.add_task(f"validation {name}", total=num_tasks, status="")
        self.validation_name, self.validation_passed = name, 0

    def task_validated(self, result) -> None:
        self.validation_passed += result.valid
        self.bars.update(self.validation_bar, advance=1, status=f"{self.validation_passed} passed; "
                         f"{EvalProgress.describe(result)}")

    def validated(self, step: int, score: dict[str, float], best: tuple[int, float]) -> None:
        kept = "a new best, kept as best-adapter" if best[0] == step else f"best so far: step {best[0]}"
        status = (f"accuracy {100 * score['accuracy']:.1f}%  turn pass rate {100 * score['turn_pass_rate']:.1f}%  "
                  f"({score['tasks']:.0f} tasks)  {kept}")
        self.bars.update(self.validation_bar, status=status)
        if not console.is_terminal:
            console.print(f"validation {self.validation_name}: {status}", soft_wrap=True)


class EvalProgress:
    """A bar over the held-out tasks with the running pass count; outside a terminal, one line per task."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.passed = label, total, 0, 0
        self.bars = Progress(TextColumn(f"eval {label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             TextColumn("{task.fields[status]}"), console=progress_console,
                             disable=not progress_console.is_terminal)
        self.bar = self.bars.add_task("", total=total, status="")

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc)

    def __call__(self, result) -> None:
        self.done += 1
        self.passed += self.solved(result)
        status = f"{self.passed} passed; {self.describe(result)}"
        self.bars.update(self.bar, advance=1, status=status)
        if not progress_console.is_terminal:
            progress_console.print(f"  {self.done}/{self.total} {status}", highlight=False)

    @staticmethod
    def solved(result) -> bool:
        return result.valid

    @staticmethod
    def describe(result) -> str:
        return f"{result.task_id}: {'pass' if result.valid else 'fail'} ({result.turns_passed}/{result.turns} turns)"


class Tau2Progress(EvalProgress):
    """EvalProgress for τ² tasks: each task's reward, how the conversation ended, and its time."""

    @staticmethod
    def solved(result) -> bool:
        return result.reward == 1.0

    @staticmethod
    def describe(result) -> str:
        return (f"{result.domain} {result.task_id}: reward {result.reward:g} ({result.termination}, "
                f"{result.messages} messages, {result.seconds:.0f} s)")


def print_tau2(summaries: dict[str, dict[str, dict[str, float]]], user_label: str) -> None:
    """Domains as rows, one column per evaluated model: pass^1 in %."""
    table = Table(title=f"τ²-bench pass^1 % (user simulator: {user_label})")
    table.add_column("domain")
    for label in summaries:
        table.add_column(label, justify="right")
    from seal_lite.runs.evaluate_tau2 import DOMAINS

    for domain in (*DOMAINS, "mean"):
        if any(domain in summary for summary in summaries.values()):
            table.add_row(domain, *(f"{100 * s[domain]['pass^1']:.1f}  n={s[domain]['tasks']}" if domain in s else "-"
                                    for s in summaries.values()))
    console.print(table)


def print_screen(pass_rates: dict[str, float], samples: int) -> None:
    """The screen's result: each task's passes, frontier tasks marked, and how many a run would keep."""
    table = Table(title=f"frontier screen ({samples} samples per task)")
    for column in ("task", "passed", "frontier"):
        table.add_column(column)
    for task_id, rate in sorted(pass_rates.items(), key=lambda item: -item[1]):
        table.add_row(task_id, f"{round(rate * samples)}/{samples}", "yes" if 0 < rate < 1 else "")
    console.print(table)
    kept = sum(0 < rate < 1 for rate in pass_rates.values())
    console.print(f"{kept} of {len(pass_rates)} tasks on the frontier (passed sometimes, not always)")


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """One character per value in [0, 1], from ▁ (0) to █ (1): a reward curve that fits on a terminal line."""
    return "".join(SPARKS[round(min(max(value, 0.0), 1.0) * (len(SPARKS) - 1))] for value in values)


def reward_curve(rewards: list[float]) -> str:
    """The run's rewards as a sparkline, with the means of the first and last quarter of the steps once there are
    enough steps for a quarter to differ from the whole."""
    line = sparkline(rewards)
    if len(rewards) >= 4:
        quarter = len(rewards) // 4
        first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
        line += f"  first quarter {first:.2f}, last quarter {last:.2f}"
    return line


# what a newcomer runs after the quickstart to see learning, and what it costs
# (docs/results/rise-within-30-minutes.md: bf16 on an Intel Xeon, fp32 on an AVX2-only CPU)
WATCH_A_RISE = "seal-lite run recipes/cpu-learn.yaml   # the reward rises: 22 minutes on 2 cores with bf16"


def print_summary(summary) -> None:
    """The run's closing table: what the steps did (reward, signal, loss, how far the LoRA moved, the
    diagnosis) and what to run next."""
    def per_step(values, fmt: str) -> str:
        return ", ".join(format(value, fmt) if value is not None else "-" for value in values) or "-"

    table = Table(title="seal-lite run summary", show_header=False, min_width=60)
    table.add_row("steps", str(summary.steps))
    table.add_row("reward per step (official verdict)", f"{per_step(summary.rewards, '.2f')}  "
                  f"{reward_curve(summary.rewards)}  mean {summary.reward_mean:.3f}")
    if (trend := reward_trend(summary.rewards)) is not None:
        table.add_row("reward trend", trend.describe())
    table.add_row("groups with a signal", f"{per_step(summary.signal, '.0%')} of the groups each step drew "
                  "(rewards differ: GRPO learns only from those)")
    table.add_row("loss per step", per_step(summary.loss, ".4g"))
    table.add_row("LoRA moved per step", per_step(summary.lora_change, ".3g") + "  (norm of the update; 0: no update)")
    labels = ", ".join(f"{label} {n}" for label, n in summary.label_counts.items()) or "-"
    table.add_row("turn labels", labels)
    table.add_row("diagnosis weight range", f"{summary.weight_min:.2f} - {summary.weight_max:.2f}")
    changes = summary.interface_changes
    table.add_row("training interface", "\n".join([f"v1 -> v{len(changes) + 1}", *changes]) if changes
                  else "unchanged (v1): no failure label was frequent enough for a guideline")
    table.add_row("diagnoser", f"explained {summary.explanations} failed turns")
    if summary.validation:
        table.add_row("validation, accuracy % (turn pass %)", ", ".join(
            f"step {step}: {100 * score['accuracy']:.1f} ({100 * score['turn_pass_rate']:.1f})"
            for step, score in summary.validation.items()))
        table.add_row("best checkpoint", f"step {summary.best[0]} ({summary.best[1]:.3f}): "
                      f"{(summary.run_dir or summary.db_path.parent) / 'best-adapter'}")
    table.add_row("wall time", f"{summary.wall_time_s:.0f} s ({summary.wall_time_s / 60:.1f} min)")
    table.add_row("database", str(summary.db_path))
    console.print(table)
    run = summary.run_dir or summary.db_path.parent
    console.print(f"Next:\n  seal-lite report {run}      # plots of every step, as a page\n"
                  f"  seal-lite diagnose {run}    # the failed turns, their labels and explanations")
    if changes:
        console.print(f"  seal-lite interface diff {run} 1 {len(changes) + 1}   # how the training interface evolved")
    if summary.best:
        console.print(f"  seal-lite eval {run} --best   # the best validation checkpoint on the held-out tasks")
    if summary.name == "quickstart":
        console.print(f"  {WATCH_A_RISE}")


def print_evaluation(summaries: dict[str, dict[str, dict[str, float]]]) -> None:
    """Categories as rows, one column per evaluated model: strict accuracy and turn pass rate, in %."""
    table = Table(title="official verdict accuracy % (turn pass rate %)")
    table.add_column("category")
    for label in summaries:
        table.add_column(label, justify="right")
    from seal_lite.runs.evaluate_bfcl import table_rows

    categories = table_rows(summaries)
    for category in categories:
        cells = []
        for summary in summaries.values():
            row = summary.get(category)
            cells.append(f"{100 * row['accuracy']:.1f} ({100 * row['turn_pass_rate']:.1f})  n={row['tasks']}"
                         if row else "-")
        table.add_row(category, *cells)
    console.print(table)


def print_trajectories(rows: list[dict], labels: dict[str, list[str]]) -> None:
    table = Table(title=f"{len(rows)} trajectories")
    for column in ("id", "reward", "weight", "calls", "stop", "turn labels"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["id"], f"{row['reward']:.0f}", f"{row['weight']:.2f}", str(row["num_model_calls"]),
                      row["stop_reason"], " ".join(_label_text(label) for label in labels.get(row["id"], [])))
    console.print(table)


def print_turns(trajectory: dict, turns: list[dict]) -> None:
    console.print(
        f"[bold]{trajectory['id']}[/]  task {trajectory['task_id']}  reward {trajectory['reward']:.0f}  "
        f"weight {trajectory['weight']:.2f}  advantage {trajectory['advantage']:+.3f} -> "
        f"{trajectory['weighted_advantage']:+.3f}  stop {trajectory['stop_reason']}"
    )
    table = Table(show_lines=True)
    columns = ["turn", "user", "model calls -> results", "expected calls", "label", "cause", "evidence"]
    explained = any(turn.get("diagnosis") for turn in turns)
    for column in columns + (["diagnoser: explanation / hint"] if explained else []):
        table.add_column(column, overflow="fold")
    for turn in turns:
        evidence = turn["evidence"]
        calls = "\n".join(
            f"{call} [{status}] -> {_short(result)}"
            for call, result, status in zip(turn["model_calls"], turn["results"], evidence.get("statuses", []))
        ) or "(no call)"
        details = evidence.get("differences", []) + [
            f"{name}: {evidence[name]}" for name in ("gt_error", "checker_error") if evidence.get(name)
        ]
        cells = [str(turn["turn_index"]), _short(turn["user_text"], 160), calls,
                 "\n".join(turn["gt_calls"]) or "(abstain)", _label_text(turn["label"]), turn["cause"] or "",
                 "\n".join(details)]
        if explained:
            cells.append(_explanation_text(turn.get("diagnosis")))
        table.add_row(*cells)
    console.print(table)


def _explanation_text(diagnosis: dict | None) -> str:
    if not diagnosis:
        return ""
    if diagnosis["status"] != "ok":
        return f"({diagnosis['status']}: {diagnosis['error']})"
    label = f"[{diagnosis['label']}] " if diagnosis["label"] else ""
    return f"{label}{diagnosis['explanation']}\nhint: {diagnosis['recovery_hint']}"


def _label_text(label: str) -> str:
    return f"[green]{label}[/]" if label in SUCCESS_LABELS else f"[red]{label}[/]"


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- seal-lite doctor -------------------------------------------------------------------------------------


def doctor_text(report: dict, *, ascii: bool = False) -> str:
    """A readable plain-text rendering of ``report``: sections, one line per item, the fix where one is needed."""
    yes, no, dash, arrow = ("OK ", "!! ", "-- ", "->") if ascii else ("✓", "✗", "–", "→")
    lines = []

    def item(mark: str, label: str, text: str, fix: str | None = None) -> None:
        lines.append(f"  {mark} {label:<20} {text}" + (f"  {arrow} {fix}" if fix else ""))

    hw = report["hardware"]
    lines.append("Hardware")
    item(yes, "CPU", f"{hw['cpu_cores']} cores ({hw['cpu_cores_usable']} usable), {hw['platform']}, "
                     f"Python {hw['python']}")
    ram = f"{hw['ram_total_gb']} GiB total" if hw["ram_total_gb"] is not None else "unknown"
    if hw["ram_available_gb"] is not None:
        ram += f", {hw['ram_available_gb']} GiB available"
    item(yes if hw["ram_total_gb"] else dash, "RAM", ram)
    if hw["torch"]:
        item(yes, "torch", f"{hw['torch']} ({hw['torch_build']} build)")
    else:
        item(no, "torch", "MISSING", "bash scripts/setup.sh")
    if hw["cuda_available"]:
        item(yes, "CUDA", f"available, {len(hw['gpus'])} GPU(s), NVIDIA driver {hw['nvidia_driver']}")
        for gpu in hw["gpus"]:
            item(yes, f"GPU {gpu['index']}", f"{gpu['name']}, {gpu['memory_gb']} GiB, compute "
                                             f"{gpu['compute_capability']}, bf16 {'yes' if gpu['bf16'] else 'no'}")
    else:
        item(dash, "CUDA", "not available: training and rollouts run on the CPU")
    for note in hw["notes"]:
        item(no, "note", note)

    lines += ["", "Backends"]
    for row in report["backends"]["packages"]:
        pin = f"  (pin {row['pin']})" if row["pin"] and row["ok"] else ""
        if row["installed"]:
            text = f"{row['version']}{pin}" + (f"  {row['note']}" if row["note"] else "")
            item(yes if row["ok"] else no, row["name"], text, row["fix"])
        else:
            item(no if row["role"] == "required" else dash, row["name"],
                 ("MISSING" if row["role"] == "required" else "not installed") + f": {row['note']}", row["fix"])
    chosen = report["backends"].get("training_backend")
    if chosen:
        item(yes, "training backend", f"{chosen['backend']} ({chosen['reason']})")
        item(yes, "training dtype", f"{chosen['dtype']} ({chosen['dtype_reason']})")
    if rollouts := report["backends"].get("rollout_backend"):
        item(yes, "rollout engine", f"{rollouts['backend']} ({rollouts['reason']})")

    lines += ["", "Models (pip-shipped GGUF)"]
    for row in report["models"]:
        if row["installed"]:
            converted = f"converted: {row['converted_dir']}" if row["converted_dir"] else "not converted yet (first use)"
            item(yes, row["name"], f"installed, {row['size_mb']} MB; {converted}")
        else:
            count = f"{len(row['missing'])} of {len(row['packages'])} packages" if len(row["packages"]) > 1 else "package"
            item(no, row["name"], f"MISSING ({count})", row["install"])

    lines += ["", "Masking self-test (loss and gradient on model tokens only)"]
    test = report["self_test"]
    if test is None:
        item(dash, "skipped", "")
    else:
        where = (f"{test['model']} ({test['backend']}, {test['dtype']}), {test['task_id']}, "
                 f"{test['trajectories']} trajectories")
        if test["passed"]:
            item(yes, "passed", f"{where}, {test['seconds']} s")
        else:
            item(no, "FAILED", f"{where}, {test['seconds']} s: {test['message']}")
        if test["trajectories"]:
            item(dash, "tokens", f"{test['model_tokens']} model, {test['env_tokens']} environment inside the "
                                 f"completions ({test['tool_results']} tool results)")
            model_grad = ("none" if test["min_model_grad"] is None
                          else f"min {test['min_model_grad']:.3g}, mean {test['mean_model_grad']:.3g}")
            item(dash, "|grad| of logits", f"environment positions max {test['max_env_grad']:.3g}; "
                                           f"model positions {model_grad}")
            item(dash, "GRPO step", f"moved {test['lora_changed']} of {test['lora_entries']} LoRA weights "
                                    f"({', '.join(test['trainable_dtypes'])}); {test['linear4bit_layers']} "
                                    "Linear4bit layers")
    lines += ["", _doctor_verdict(report, yes, no)]
    return "\n".join(lines)


def _doctor_verdict(report: dict, yes: str, no: str) -> str:
    broken = [row["name"] for row in report["backends"]["packages"] if row["role"] == "required" and not row["ok"]]
    test = report["self_test"]
    problems = ([f"fix the backends {', '.join(broken)}"] if broken else []) + (
        ["the masking self-test failed"] if test is not None and not test["passed"] else [])
    if problems:
        return f"{no} not ready to train: {'; '.join(problems)}"
    checked = "masking verified" if test is not None else "masking self-test skipped"
    return f"{yes} ready to train: required backends present, {checked}"


def print_card_plan(recipe, plan: dict) -> None:
    """``seal-lite recipe RECIPE --card NAME``: what the recipe needs on that card, each figure marked as the memory
    model's, an estimate or an assumption."""
    card, fits = plan["card"], {True: "[green]fits[/]", False: "[red]does not fit[/]"}
    console.print(f"[bold]{recipe.name} on {card.name}[/] ({card.memory_gb} GB, {card.tflops:g} TFLOP/s 16-bit, "
                  f"{card.bandwidth:g} TB/s), policy.backend {recipe.policy.backend}, {plan['rollouts']} rollouts:")
    if plan["rollouts"] == "paged":  # no generate call: a KV pool sized for the card, whatever the token budget
        console.print(f"  rollouts  paged: a KV pool of {plan['pool_tokens']:,} tokens fits beside the weights, "
                      f"{plan['live_rows']} episodes of the full context at once; one context and a forward pass: "
                      f"{fits[plan['pool_fits']]} (the memory model, on SDPA without flash attention)")
        if not plan["pool_fits"]:
            console.print("            to fit: a smaller rollout.max_context_tokens or a larger card")
    else:
        print_widest_call(recipe, plan, fits)
    how = ("each group's opening once, then each trajectory's rest against it (grpo.shared_prefix)"
           if plan["shared_prefix"] else "one trajectory a pass")
    console.print(f"  update    {how}; its peak, trajectories of up to {recipe.rollout.max_context_tokens:,} tokens: "
                  f"about {plan['update_gb']:.1f} GB: {fits[plan['update_fits']]} (an estimate; no GPU has measured it)")
    if not plan["update_fits"]:
        console.print("            to fit: a smaller rollout.max_context_tokens or a larger card")
    for case, hours in plan["hours"].items():
        validations = (f" and {hours['validations']} validations ({hours['validation']:,.0f} h)"
                       if hours["validations"] else "")
        kept = ""
        if plan["shared_prefix"]:
            kept = f", its suffixes {'kept for' if hours['suffixes_kept'] else 'recomputed in'} the backward pass"
        console.print(f"  hours     episodes {case}: {hours['step']:.2f} h a step, {hours['run']:,.0f} h for the "
                      f"{recipe.grpo.steps} steps{validations} ({hours['update_share']:.0%} of it the update{kept})")
    console.print("            estimated: the speeds are assumptions until a GPU measures them "
                  "(seal_lite/core/plan.py, Speed; docs/gpu.md)")


def print_widest_call(recipe, plan: dict, fits: dict) -> None:
    """The card plan's generate rollouts: the widest call's peak, and the budget that fits when it does not."""
    console.print(f"  rollouts  the widest generate call, {plan['rows']} rows of {recipe.rollout.max_context_tokens:,} "
                  f"tokens (budget {plan['budget']:,}), needs {plan['call_gb']:.1f} GB with the weights: "
                  f"{fits[plan['call_fits']]} in 90% of the card (the memory model, checked against measured peaks)")
    if not plan["call_fits"] or plan["fitting_budget"] < plan["budget"]:
        fix = (f"--set rollout.generation_token_budget={plan['fitting_budget']}" if plan["fitting_budget"]
               else "a smaller rollout.max_context_tokens (not one row of the context fits)")
        console.print(f"            to fit: {fix}")
