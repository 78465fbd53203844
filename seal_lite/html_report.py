"""``seal-lite report RUN``: one self-contained HTML page (plus the PNGs) of what a run did.

Everything comes from the run's store: reward and turn pass rate over steps, the failure-label distribution
over steps, the closed-loop utilities rho over steps, the diagnosis weights, the interface version timeline
with its diffs, the evaluation table (``seal-lite eval``), and sample trajectories turn by turn with their
labels and the local diagnoser's explanations. Figures are matplotlib PNGs written beside the page and embedded
in it as data URIs, so the page can be mailed or opened anywhere.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from pathlib import Path

from seal_lite.core.advantages import share_with_signal
from seal_lite.core.interface import describe_version, diff_versions
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.core.trend import reward_trend
from seal_lite.engines.store import Store
from seal_lite.runs.evaluate_bfcl import best_step, scores_by_step

FIGURES = ("reward", "labels", "rho", "weights")


def write_report(run_dir: Path, out_dir: Path | None = None, samples: int = 4) -> Path:
    """Write ``report.html`` and the figures into ``out_dir`` (default RUN/report); return the page's path."""
    store = Store.open_readonly(Path(run_dir) / "seal.db")  # a report never writes to the run
    out_dir = Path(out_dir or Path(run_dir) / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [row["step"] for row in store.steps()]
    if not steps:
        raise LookupError(f"{run_dir} has no finished step to report on yet")
    pngs = {name: out_dir / f"{name}.png" for name in FIGURES}
    _plot_reward(store, steps, pngs["reward"])
    _plot_labels(store, steps, pngs["labels"])
    _plot_rho(store, pngs["rho"])
    _plot_weights(store, steps, pngs["weights"])
    run = store.run()
    sections = [
        f"<h1>seal-lite run {html.escape(run['name'])}</h1>",
        f"<p>model {html.escape(run['model'])}, status {html.escape(run['status'])}, {len(steps)} steps</p>",
        _figure(pngs["reward"], "Reward (official verdict), its moving average, turn pass rate, and the share of "
                                "groups with unequal rewards (the only ones GRPO learns from) per step; with "
                                "validation during training, the held-out accuracy and the best checkpoint"
                                + _trend(store)),
        _figure(pngs["labels"], "Turn labels per step (share of countable labels)"),
        _figure(pngs["rho"], "Label utilities rho per step (closed-loop update)"),
        _figure(pngs["weights"], "Diagnosis weights of the trajectories"),
        _interface_timeline(store),
        _evaluation_table(store),
        _sample_trajectories(store, samples),
    ]
    page = out_dir / "report.html"
    page.write_text("<!doctype html><html><head><meta charset='utf-8'><title>seal-lite report</title>"
                    f"<style>{_CSS}</style></head><body>{''.join(sections)}<script>{_COUNT_FIGURES}</script>"
                    "</body></html>")
    return page


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    for axes in figure.axes:
        if axes.get_xlabel() == "step":
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    _pyplot().close(figure)


def _plot_reward(store: Store, steps: list[int], path: Path) -> None:
    plt = _pyplot()
    reward = dict(store.metrics("reward/mean"))
    labels = store.labels_by_step()
    passed = {step: sum(label in SUCCESS_LABELS for label in found) for step, found in labels.items()}
    shares = signal_shares(store)
    figure, axes = plt.subplots(figsize=(7, 3))
    axes.bar(steps, [shares.get(step, 0.0) for step in steps], color="0.88", label="groups with a learning signal (share)")
    rewards = [reward.get(step, 0.0) for step in steps]
    axes.plot(steps, rewards, marker="o", label="reward (task success on the step's drawn tasks)")
    window = max(1, min(5, len(steps) // 4))
    if window > 1:  # long runs: the trend is easier to see than the noisy per-step reward
        axes.plot(steps, moving_average(rewards, window), linewidth=2.5, label=f"reward, mean of the last {window} steps")
    axes.plot(steps, [passed[s] / len(labels[s]) if labels.get(s) else 0.0 for s in steps], marker="s",
              label="turn pass rate (the update's trajectories)")
    if validation := scores_by_step(store):  # step 0: the base model, before the first step
        metric = json.loads(store.run()["recipe"])["validation"]["metric"]
        axes.plot(list(validation), [score["accuracy"] for score in validation.values()], marker="D", color="black",
                  label="validation accuracy (held-out slice, greedy)")
        best, score = best_step(store, metric)
        axes.plot([best], [validation[best]["accuracy"]], marker="*", markersize=14, color="gold", linestyle="none",
                  label=f"best checkpoint (step {best}, {metric} {score:.2f})")
    axes.set(xlabel="step", ylim=(-0.05, 1.05))
    axes.legend(fontsize=7)
    _save(figure, path)


def _trend(store: Store) -> str:
    """The reward's trend test (steps as units) for the caption, from 4 steps on."""
    trend = reward_trend([value for _, value in store.metrics("reward/mean")])
    return f". Reward trend: {trend.describe()}" if trend else ""


def signal_shares(store: Store) -> dict[int, float]:
    """Per step, the share of task groups whose rewards are not all equal: the only groups GRPO learns from. The
    groups the step drew, before dynamic sampling replaced any (stored groups for runs older than that metric)."""
    drawn = dict(store.metrics("sampling/drawn_groups_with_signal"))
    stored = defaultdict(list)
    for (step, _), rewards in store.rewards_by_group().items():
        if step not in drawn:
            stored[step].append(rewards)
    return {step: share_with_signal(groups) for step, groups in stored.items()} | drawn


def moving_average(values: list[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))]


def _plot_labels(store: Store, steps: list[int], path: Path) -> None:
    plt = _pyplot()
    rates = {label: dict(points) for label, points in store.metric_series("labels/", "_rate").items()}
    figure, axes = plt.subplots(figsize=(7, 3))
    bottom = [0.0] * len(steps)
    for label in sorted(rates):
        heights = [rates[label].get(step, 0.0) for step in steps]
        axes.bar(steps, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.set(xlabel="step", ylabel="share of turns")
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    _save(figure, path)


def _plot_rho(store: Store, path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 3))
    for label, points in sorted(store.metric_series("rho/").items()):
        axes.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
    axes.set(xlabel="step", ylabel="rho", ylim=(0.45, 2.05))
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    _save(figure, path)


def _plot_weights(store: Store, steps: list[int], path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 3))
    weights = [[row["weight"] for row in store.trajectories(step)] for step in steps]
    axes.hist(weights, bins=15, range=(0.5, 2.0), stacked=True, label=[f"step {step}" for step in steps])
    axes.set(xlabel="diagnosis weight w", ylabel="trajectories")
    axes.legend(fontsize=7)
    _save(figure, path)


def _figure(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)} ({path.name})</figcaption></figure>")


def _interface_timeline(store: Store) -> str:
    parts = ["<h2>Training interface, version by version</h2>"]
    previous = None
    for row in store.interface_versions():
        title = f"v{row['version']} (after step {row['step']}): {row['reason']}"
        body = describe_version(row) if previous is None else diff_versions(previous, row)
        parts.append(f"<h3>{html.escape(title)}</h3><pre>{html.escape(body)}</pre>")
        previous = row
    return "".join(parts)


def _evaluation_table(store: Store) -> str:
    from seal_lite.runs.evaluate_bfcl import results_from_rows, summarize, table_rows

    rows = store.evaluations()
    results = results_from_rows(rows)  # τ²-bench has its own table
    if not results:
        return ("<h2>Evaluation</h2><p>No BFCL evaluation yet: run <code>seal-lite eval RUN --base</code>.</p>"
                + _tau2_table(rows))
    summaries = {model: summarize(found) for model, found in results.items()}
    table = _models_table("category", table_rows(summaries), summaries, lambda row: f"{100 * row['accuracy']:.1f} "
                          f"({100 * row['turn_pass_rate']:.1f}), n={row['tasks']}")
    return ("<h2>Evaluation</h2><p>Official verdict accuracy % (turn pass rate %), greedy, plain interface.</p>"
            f"<table class='evaluation'>{table}</table>" + _tau2_table(rows))


def _models_table(first: str, keys, summaries: dict[str, dict], cell) -> str:
    """The rows of a table with one column per model: a row per key any model's summary holds, ``cell`` of it
    (or "-" where a model lacks it)."""
    lines = ["<tr><th>" + first + "</th>" + "".join(f"<th>{html.escape(model)}</th>" for model in summaries)
             + "</tr>"]
    for key in keys:
        if any(key in summary for summary in summaries.values()):
            cells = "".join(f"<td>{cell(s[key])}</td>" if key in s else "<td>-</td>" for s in summaries.values())
            lines.append(f"<tr><th>{key}</th>{cells}</tr>")
    return "".join(lines)


def _tau2_table(rows: list[dict]) -> str:
    """τ²-bench pass^1 per domain and their mean, one column per evaluated model (``seal-lite eval --benchmark
    tau2``); nothing when the run has no τ² rows."""
    from seal_lite.runs.evaluate_tau2 import DOMAINS, results_from_rows, summarize

    results = results_from_rows(rows)
    if not results:
        return ""
    summaries = {model: summarize(found) for model, found in results.items()}
    users = sorted({json.loads(row["detail"] or "{}").get("user_model", "?") for row in rows
                    if row.get("benchmark") == "tau2"})
    table = _models_table("domain", (*DOMAINS, "mean"), summaries,
                          lambda row: f"{100 * row['pass^1']:.1f}, n={row['tasks']}")
    return (f"<h3>τ²-bench (out of distribution)</h3><p>pass^1 % per domain, one greedy trial per task, user "
            f"simulator: {html.escape(', '.join(users))}. See docs/tau2.md for what the numbers mean.</p>"
            f"<table class='evaluation tau2'>{table}</table>")


def _sample_trajectories(store: Store, samples: int) -> str:
    """The last step's trajectories, passed ones first, turn by turn."""
    last = store.steps()[-1]["step"]
    chosen = sorted(store.trajectories(last), key=lambda row: -row["reward"])[:samples]
    parts = [f"<h2>Sample trajectories (step {last})</h2>"]
    for row in chosen:
        parts.append(f"<h3>{html.escape(row['id'])}: reward {row['reward']:.0f}, weight {row['weight']:.2f}</h3>"
                     "<table class='turns'><tr><th>turn</th><th>user</th><th>model calls</th><th>expected</th>"
                     "<th>label</th><th>cause</th><th>diagnoser</th></tr>")
        for turn in store.turns(row["id"]):
            explained = turn["diagnosis"] or {}
            diagnoser = " ".join(filter(None, [explained.get("explanation"), explained.get("recovery_hint")]))
            cells = [turn["turn_index"], turn["user_text"], "; ".join(turn["model_calls"]) or "(none)",
                     "; ".join(turn["gt_calls"]) or "(none)", turn["label"], turn["cause"] or "", diagnoser]
            parts.append("<tr class='turn'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    return "".join(parts)


# After load, the body records how many figures the browser decoded (data-figures-shown): a check for tests.
_COUNT_FIGURES = """window.addEventListener('load', () => { document.body.dataset.figuresShown =
  [...document.images].filter(image => image.complete && image.naturalWidth > 0).length; });"""

_CSS = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
figure { margin: 1em 0; } img { max-width: 100%; } figcaption { color: #555; font-size: 90%; }
table { border-collapse: collapse; font-size: 85%; } td, th { border: 1px solid #ccc; padding: 3px 6px;
vertical-align: top; text-align: left; } pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
"""
