"""A run's model card: the README.md beside its trained adapter, so that a shared adapter says how it was trained.

It is written in the form the Hugging Face hub reads: YAML metadata between ``---`` lines (``base_model`` names the
hub repository of the base model, ``library_name: peft`` marks a LoRA adapter), then Markdown. It replaces the
template peft writes there, whose ``base_model`` is a local cache path. Everything in it comes from the run's
seal.db: the recipe, the reward of every step, the validations during training, the held-out evaluations with 95%
Wilson intervals over tasks, and the training interface the run ended with (which evaluation never shows). A run that
validates during training has a second card, in RUN/best-adapter, saying that adapter is the best checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from seal_lite.core.interface import describe_version
from seal_lite.core.trend import reward_trend
from seal_lite.engines.store import Store
from seal_lite.runs.evaluate_bfcl import BEST_ADAPTER, best_step, results_from_rows, scores_by_step, summarize

# the hub repositories of the registry's GGUFs (seal_lite/engines/model_sources.py): what their weights are
HUB_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
}


def hub_id(model: str) -> str | None:
    """The hub repository a recipe's ``policy.model`` stands for: a registry name's, or the spec itself when it is
    a hub id (owner/name, not a local path); None for a local model."""
    if model in HUB_IDS:
        return HUB_IDS[model]
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~")) and not Path(model).exists()
    return model if looks_like_hub_id else None


def wilson_interval(passed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a pass rate: sensible at 0 and at n, unlike the normal one."""
    if total == 0:
        return 0.0, 1.0
    rate = passed / total
    centre = (rate + z * z / (2 * total)) / (1 + z * z / total)
    spread = z * math.sqrt(rate * (1 - rate) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - spread), min(1.0, centre + spread)


def model_card(store: Store, best: bool = False) -> str:
    """The card's text, from the run's store: for RUN/adapter (the final step), or with ``best`` for
    RUN/best-adapter (the best validation checkpoint)."""
    run = store.run()
    recipe = json.loads(run["recipe"])
    policy, grpo, rollout, interface = (recipe[key] for key in ("policy", "grpo", "rollout", "interface"))
    validation = recipe.get("validation") or {"every": None, "split": "eval", "metric": "accuracy"}  # older runs
    best_at = best_step(store, validation["metric"])
    rewards = [row["reward_mean"] for row in store.steps()]
    base = hub_id(policy["model"])
    metadata = {**({"base_model": base} if base else {}), "library_name": "peft", "pipeline_tag": "text-generation",
                "tags": ["seal-lite", "grpo", "lora", "tool-use", "bfcl"]}
    on = {"φ_schema (schema cues)": interface["schema_cues"], "φ_err (recovery feedback)": interface["recovery_feedback"],
          "φ_cap (capability guidelines)": interface["capability_hints"],
          "diagnosis weighting": grpo["diagnosis_weighting"], "closed-loop ρ": grpo["closed_loop"]}
    lines = [
        "---", yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True).strip(), "---", "",
        f"# {run['name']}: a LoRA adapter trained with SEAL by seal-lite", "",
        f"A rank-{policy['lora_r']} LoRA (alpha {policy['lora_alpha']}) on {base or policy['model']}, trained with "
        f"GRPO on BFCL multi-turn tasks for {len(rewards)} steps of {grpo['tasks_per_step']} tasks × "
        f"{rollout['num_generations']} trajectories, learning rate {grpo['learning_rate']:g}; each failed turn was "
        "diagnosed into a failure label that weighted the advantages and shaped the training interface "
        "(seal-lite's docs/method.md). Run status: " + run["status"] + ".", "",
        _which_checkpoint(best, len(rewards), best_at), "",
        "| SEAL part | in this run |", "|---|---|",
        *(f"| {part} | {'on' if value else 'off'} |" for part, value in on.items()), "",
        "## Training reward", "",
        "The official BFCL verdict per step, averaged over the groups the step drew: "
        + (" ".join(f"{reward:.2f}" for reward in rewards) or "no step yet") + ".",
    ]
    if trend := reward_trend(rewards):
        lines += ["", f"Trend with the steps as units: {trend.describe()}."]
    lines += ["", "## Validation during training", "", *_validations(scores_by_step(store), validation, best_at), "",
              "## Held-out evaluation", "", *_evaluations(store.evaluations()), "",
              "## The training interface it ended with", "",
              "Evaluation always shows the plain BFCL view; this is what training showed last.", "",
              "```", describe_version(store.interface_versions()[-1]), "```", "",
              "## Reproduce", "", "The run's whole recipe; `seal-lite run recipe.yaml` trains it again:", "",
              "```yaml", yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True).strip(), "```", ""]
    return "\n".join(lines)


def _which_checkpoint(best: bool, steps: int, best_at: tuple[int, float] | None) -> str:
    if best:
        return (f"**This adapter is the run's best validation checkpoint: step {best_at[0]}** (score {best_at[1]:.3f}); "
                "the final adapter is in `adapter/`. `seal-lite eval RUN --best` scores this one.")
    kept = (f" The best validation checkpoint (step {best_at[0]}) is in `best-adapter/`; `seal-lite eval RUN "
            "--best` scores it.") if best_at else ""
    return f"**This adapter is the final one: step {steps}.**{kept}"


def _validations(scores: dict[int, dict[str, float]], validation: dict, best_at: tuple[int, float] | None) -> list[str]:
    """One row per validation: the held-out slice's accuracy and turn pass rate, the best marked."""
    if not scores:
        return ["None: the recipe's `validation.every` was not set."]
    table = [f"Greedy, the official verdict, every {validation['every']} steps on the {validation['split']} slice "
             f"(step 0: the base model); the best by {validation['metric']} is kept:", "",
             "| step | tasks | accuracy | turn pass rate |", "|---|---|---|---|"]
    for step, score in scores.items():
        mark = " (best)" if step == best_at[0] else ""
        table.append(f"| {step}{mark} | {score['tasks']:.0f} | {100 * score['accuracy']:.1f}% | "
                     f"{100 * score['turn_pass_rate']:.1f}% |")
    return table


def _evaluations(rows: list[dict]) -> list[str]:
    """One table row per evaluated model and category (BFCL), with the strict verdict's 95% interval."""
    results = results_from_rows(rows)
    if not results:
        return ["Not evaluated yet: `seal-lite eval RUN --base` scores it and the base model on held-out tasks."]
    table = ["Greedy, the official verdict on held-out tasks (95% Wilson interval over tasks):", "",
             "| model | category | tasks | strict accuracy |", "|---|---|---|---|"]
    for model, found in sorted(results.items()):
        for category, row in summarize(found).items():
            if category == "mean":
                continue
            low, high = wilson_interval(round(row["accuracy"] * row["tasks"]), row["tasks"])
            table.append(f"| {model} | {category} | {row['tasks']} | {100 * row['accuracy']:.1f}% "
                         f"[{100 * low:.1f}, {100 * high:.1f}] |")
    return table


def write_model_card(run_dir: Path) -> Path | None:
    """Write RUN/adapter/README.md, and RUN/best-adapter/README.md when the run keeps a best validation checkpoint
    (None when the run has no adapter yet)."""
    store = Store.open_readonly(Path(run_dir) / "seal.db")
    if (Path(run_dir) / BEST_ADAPTER).is_dir():
        (Path(run_dir) / BEST_ADAPTER / "README.md").write_text(model_card(store, best=True))
    adapter = Path(run_dir) / "adapter"
    if not adapter.is_dir():
        return None
    path = adapter / "README.md"
    path.write_text(model_card(store))
    return path
