"""The local diagnoser: speed, agreement with the rule labels, sample explanations, share of a step.

1. A labelled corpus of real failed turns: rollouts of the pip models (SmolLM2-135M and Qwen2.5-Coder-0.5B,
   played with llama.cpp) on training tasks, labelled by the rule diagnoser. Written once to
   benchmarks/results/failed_turns.jsonl and reused, so later runs compare diagnosers on the same turns.
2. Every diagnoser model answers every corpus turn in-process on --threads threads: diagnoses/s, valid-answer
   rate, agreement of its label with the rule label, hint redactions.
3. 20 sample explanations go to docs/diagnoser_samples.md.
4. With --run RUN_DIR: the diagnoser's share of each step of that run (its seconds over the step's wall time).
With --blind the prompt withholds the rule label: agreement then measures what the model infers on its own.

    .venv/bin/python benchmarks/diagnoser.py [--tasks 12] [--limit 40] [--run runs/quickstart] [--blind]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

from seal_lite.core.calls import call_format
from seal_lite.core.explainer import FailedTurn
from seal_lite.core.interface import TrainingInterface
from seal_lite.core.recipe import DiagnoserConfig, load_recipe
from seal_lite.engines.model_sources import resolve_gguf
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.diagnoser import Diagnoser, failed_turns
from seal_lite.step.rollout import rollout_group
from seal_lite.step.verifier import diagnose_episode

ROOT = Path(__file__).parent.parent
CORPUS = ROOT / "benchmarks" / "results" / "failed_turns.jsonl"
SAMPLES = ROOT / "docs" / "diagnoser_samples.md"
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b")


def collect_corpus(num_tasks: int, threads: int) -> list[dict]:
    from transformers import AutoTokenizer

    from seal_lite.engines.llamacpp import LlamaCppGenerator
    from seal_lite.engines.model_sources import resolve_model

    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")  # SmolLM2's budgets, as measured
    rollout = recipe.rollout.model_copy(update={"num_generations": 2, "max_new_tokens": 96})
    ids = (ROOT / "data" / "train_ids.txt").read_text().split()
    random.Random(0).shuffle(ids)
    tasks = [task.truncated(2) for task in load_tasks(ids[:num_tasks])]
    config = recipe.interface  # the interface the first step shows (no guideline yet)
    interface = TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format,
                                  call_format(rollout.parser))
    corpus, seen = [], set()
    for model in MODELS:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
        generator = LlamaCppGenerator(resolve_gguf(model, "model"), tokenizer, n_threads=threads)
        for task in tasks:
            for trajectory in rollout_group(task, rollout.num_generations, generator, rollout, interface):
                diagnosis = diagnose_episode(task, trajectory.turns)
                for index, turn in failed_turns(task, trajectory.turns, diagnosis).items():
                    if turn.key("") not in seen:
                        seen.add(turn.key(""))
                        corpus.append({"policy": model, "task_id": task.id, "turn_index": index} | asdict(turn))
            print(f"  {model} {task.id}: {len(corpus)} distinct failed turns so far", flush=True)
        generator.close()
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    CORPUS.write_text("".join(json.dumps(item) + "\n" for item in corpus))
    return corpus


def as_turn(item: dict) -> FailedTurn:
    fields = {key: item[key] for key in FailedTurn.__dataclass_fields__}
    fields["calls"] = tuple(tuple(call) for call in fields["calls"])
    return FailedTurn(**fields | {"evidence": tuple(fields["evidence"]), "hidden_values": tuple(fields["hidden_values"])})


def measure(model: str, items: list[dict], threads: int, blind: bool) -> tuple[dict, list]:
    config = DiagnoserConfig(mode="in_process", model=model, n_threads=threads, max_per_step=len(items))
    turns = [as_turn(item) for item in items]
    if blind:  # the prompt normally names the rule label, which a model can copy; here it has only the evidence
        turns = [replace(turn, rule_label="(withheld)", rule_cause=None) for turn in turns]
    with Diagnoser(config, resolve_gguf(model, "model")) as diagnoser:
        started = time.monotonic()
        answers, report = diagnoser.explain(turns)
        seconds = time.monotonic() - started
    valid = [(item, answer) for item, answer in zip(items, answers) if answer is not None and answer.status == "ok"]
    agree = sum(answer.label == item["rule_label"] for item, answer in valid)
    figures = {"model": model, "turns": len(turns), "seconds": seconds, "per_s": len(turns) / seconds,
               "valid": len(valid), "agree": agree, "redactions": report.redactions, "failed": report.failed}
    return figures, valid


def step_shares(run_dir: Path) -> list[tuple[int, float, float]]:
    import sqlite_utils

    db = sqlite_utils.Database(run_dir / "seal.db")
    shares = []
    for step in db["steps"].rows_where(order_by="step"):
        row = db.execute("select value from metrics where step = ? and name = 'diagnoser/seconds'",
                         [step["step"]]).fetchone()
        if row and step["finished_at"]:
            wall = step["finished_at"] - step["started_at"]
            shares.append((step["step"], row[0], wall))
    return shares


def write_samples(samples: list[tuple[str, dict, object]]) -> None:
    intro = ("Written by `benchmarks/diagnoser.py` from real failed turns (rollouts of the pip models); "
             "the rule label comes from executable evidence, the rest from the diagnoser model.")
    lines = ["# Sample explanations of the local diagnoser", "", intro, ""]
    for number, (model, item, answer) in enumerate(samples, start=1):
        calls = "; ".join(call for call, _, _ in item["calls"]) or "(no call)"
        title = f"## {number}. {item['task_id']} turn {item['turn_index']} (policy {item['policy']}, diagnoser {model})"
        lines += [title, "",
                  f"- request: {item['user_text'][:200]}", f"- calls: {calls[:300]}",
                  f"- rule: `{item['rule_label']}` / `{item['rule_cause']}`",
                  f"- model: `{answer.label}` / `{answer.cause}`, culprit call {answer.culprit_call_index}",
                  f"- explanation: {answer.explanation}", f"- recovery hint: {answer.recovery_hint}", ""]
    SAMPLES.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12, help="training tasks to roll out for the corpus")
    parser.add_argument("--limit", type=int, default=40, help="corpus turns each diagnoser answers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--run", type=Path, help="a run directory whose steps to measure the diagnoser's share of")
    parser.add_argument("--blind", action="store_true", help="withhold the rule label from the prompt, so agreement "
                        "measures what the model infers from the evidence alone (no samples are written)")
    args = parser.parse_args()

    if CORPUS.exists():
        corpus = [json.loads(line) for line in CORPUS.read_text().splitlines()]
        print(f"corpus: {len(corpus)} failed turns from {CORPUS.relative_to(ROOT)}")
    else:
        print(f"collecting the corpus: rollouts of {', '.join(MODELS)} on {args.tasks} training tasks")
        corpus = collect_corpus(args.tasks, args.threads)
    labels = {}
    for item in corpus:
        labels[item["rule_label"]] = labels.get(item["rule_label"], 0) + 1
    print("rule labels:", ", ".join(f"{label} {n}" for label, n in sorted(labels.items(), key=lambda x: -x[1])))
    items = random.Random(1).sample(corpus, min(args.limit, len(corpus)))

    samples = []
    print(f"\n{'diagnoser':20s} {'turns':>5s} {'diag/s':>7s} {'valid':>6s} {'agrees':>7s} {'redacted':>8s}")
    for model in MODELS:
        figures, valid = measure(model, items, args.threads, args.blind)
        print(f"{model:20s} {figures['turns']:5d} {figures['per_s']:7.2f} {figures['valid']:6d} "
              f"{figures['agree'] / max(1, figures['valid']):7.0%} {figures['redactions']:8d}")
        samples += [(model, item, answer) for item, answer in valid[:10]]
    if not args.blind:
        write_samples(samples[:20])
        print(f"\n{len(samples[:20])} sample explanations written to {SAMPLES.relative_to(ROOT)}")

    if args.run:
        print(f"\ndiagnoser share of each step of {args.run}:")
        for step, seconds, wall in step_shares(args.run):
            print(f"  step {step}: {seconds:.1f} s of {wall:.1f} s = {seconds / wall:.1%}")


if __name__ == "__main__":
    main()
