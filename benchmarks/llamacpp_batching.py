"""The llama.cpp engine (prefixes read once, live sequences decoded together, a KV stream each) against the
engine it replaced (a context per sequence, one task's group per call), same machine, same run.

The baseline is ``seal_lite/engines/llamacpp.py`` as it was at ``--baseline`` (git), played the way seal-lite
played it then: evaluation and screening one task at a time in the given order, a step one task's group at a
time. Three parts, Qwen2.5-Coder-0.5B by default:

* ``eval``: held-out tasks, BFCL's view, greedy (the default recipe's budgets). Wall seconds, verdicts, and for
  every sequence whose tokens differ, the two engines' choices at the first difference and the gap between their
  logits under a plain llama.cpp read of that context (a near-tie when small).
* ``step``: one cpu-learn step's rollouts (2 tasks x G = 4) per seed: seconds, rewards, and the gap between each
  engine's sampling log-probs and the trained model's (transformers, fp32), as the update measures it.
* ``screen``: ``--screen-tasks`` training tasks x 4 samples under cpu-learn's rollouts: seconds and pass counts.

``step`` and ``screen`` also play the shipped engine in rounds (``Rounds``: each message waits for the round's
longest, as before continuous batching), so the gain of continuous batching is measured in the same run.

Each finished part is written to ``--out`` (JSON) at once; a rerun skips the parts already there.

``--baseline-build DIR`` plays the baseline with another llama.cpp build (a llama_cpp installed with ``pip install
--target DIR``), in a child process: seal-lite as it was (its engine and the generic build) against seal-lite now
(this engine and the build scripts/setup.sh chose for this CPU, seal_lite/engines/llama_build.py).

    python benchmarks/llamacpp_batching.py --eval-tasks 48 --step-seeds 3 --screen-tasks 16
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from seal_lite.core import timing
from seal_lite.core.interface import TrainingInterface, evaluation_interface
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.llamacpp import LlamaCppGenerator, _prefix_length
from seal_lite.engines.model_sources import gguf_path, resolve_model
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks, split_ids
from seal_lite.runs.evaluate_bfcl import evaluation_rollout
from seal_lite.step.rollout import by_shared_prefix, rollout_group, rollout_groups, task_batches
from seal_lite.step.screen import screen_tasks
from seal_lite.step.verifier import diagnose_episode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # Rounds is test scaffolding: tests/support
from tests.support.rounds import Rounds

ROOT = Path(__file__).resolve().parent.parent


def baseline_engine(commit: str):
    """The LlamaCppGenerator class of ``commit``, loaded from git without checking it out."""
    source = subprocess.run(["git", "show", f"{commit}:seal_lite/engines/llamacpp.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_llamacpp.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"llamacpp_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up
    spec.loader.exec_module(module)
    return module.LlamaCppGenerator


def baseline_plays(part: str, args, tokenizer, Baseline):
    """The baseline's plays of ``part``: here, or, with ``--baseline-build``, in a child process whose llama_cpp is
    that build (llama.cpp is loaded once per process), handed back pickled."""
    play = {"eval": baseline_eval, "step": baseline_step, "screen": baseline_screen}[part]
    if not args.baseline_build:
        return play(args, tokenizer, Baseline)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "baseline.pickle"
        command = [sys.executable, __file__, *sys.argv[1:], "--parts", part, "--baseline-to", str(out)]
        subprocess.run(command, check=True, env=with_build(args.baseline_build))
        return pickle.loads(out.read_bytes())


def with_build(folder: Path) -> dict:
    """This process's environment with the llama_cpp in ``folder`` first on a child's path."""
    paths = filter(None, [str(folder), os.environ.get("PYTHONPATH")])
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths)}


def cpu_name() -> str:
    """The CPU's model name and family/model numbers (which CPU kind a figure was measured on)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()[:30] if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def timed(play, phases: dict | None = None):
    """(result, wall seconds); ``phases`` gets the engine's prefill and decode seconds."""
    timing.take()
    started = time.perf_counter()
    result = play()
    seconds = time.perf_counter() - started
    if phases is not None:
        phases.update({name: round(value, 1) for name, value in timing.take().items() if name in ("prefill", "decode")})
    return result, seconds


def logit_gap(model: str, context: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| after a plain llama.cpp read of ``context``."""
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(str(gguf_path(model)), n_ctx=len(context) + 8, n_threads=2, n_threads_batch=2, flash_attn=True,
                verbose=False)
    try:
        llm.eval(context)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return float(abs(logits[a] - logits[b]))
    finally:
        llm.close()


def eval_setup(args):
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"policy.model": args.model})  # its budgets, as measured
    rollout = evaluation_rollout(recipe.rollout.model_copy(update={"generation_batch_size": recipe.generation_batch()}))
    tasks = [task.truncated(recipe.rollout.max_turns) for task in load_tasks(split_ids("eval")[: args.eval_tasks])]
    return rollout, tasks, evaluation_interface("official")


def baseline_eval(args, tokenizer, Baseline):
    rollout, tasks, interface = eval_setup(args)
    old = Baseline(str(gguf_path(args.model)), tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2)
    phases = {}
    before, seconds = timed(lambda: [rollout_group(task, 1, old, rollout, interface)[0] for task in tasks], phases)
    old.close()
    return before, seconds, phases


def distinct_tokens(prompts: list[list[int]]) -> int:
    """The tokens of the prompts' trie: what reading every shared prefix once costs. In sorted order each prompt's
    longest shared prefix with an earlier one is with the one just before it."""
    ordered = sorted(prompts)
    return sum(len(prompt) - _prefix_length(prompt, before) for before, prompt in zip([[], *ordered], ordered))


def part_eval(args, tokenizer, Baseline) -> dict:
    rollout, tasks, interface = eval_setup(args)
    path = str(gguf_path(args.model))
    before, old_s, phases = baseline_plays("eval", args, tokenizer, Baseline)
    phases = {"baseline": phases, "batched": {}}
    new = LlamaCppGenerator(path, tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2)

    def batched():  # as seal_lite.runs.evaluate_bfcl.evaluate plays them
        played = {}
        for batch in task_batches(by_shared_prefix(tasks), 1, new, rollout):
            for task, [trajectory] in zip(batch, rollout_groups([(t, interface) for t in batch], 1, new, rollout)):
                played[task.id] = trajectory
        return [played[task.id] for task in tasks]

    after, new_s = timed(batched, phases["batched"])
    new.close()
    differences, verdicts = [], []
    for task, a, b in zip(tasks, before, after, strict=True):
        valid = (diagnose_episode(task, a.turns).valid, diagnose_episode(task, b.turns).valid)
        verdicts.append(valid)
        if a.completion_ids != b.completion_ids:
            split = _prefix_length(a.completion_ids, b.completion_ids)
            context = a.prompt_ids + a.completion_ids[:split]
            differences.append({"task": task.id, "token": split, "verdicts": valid,
                                "gap": logit_gap(args.model, context, a.completion_ids[split], b.completion_ids[split])})
    return {"tasks": len(tasks), "baseline_s": old_s, "batched_s": new_s, "speedup": old_s / new_s, "phases": phases,
            "prompt_tokens": sum(len(t.prompt_ids) for t in after), "read_tokens": new.read_tokens,
            "distinct_prompt_tokens": distinct_tokens([t.prompt_ids for t in after]),
            "solved": [sum(v[0] for v in verdicts), sum(v[1] for v in verdicts)],
            "verdicts_differ": sum(v[0] != v[1] for v in verdicts), "sequences_differ": len(differences),
            "differences": differences}


def engine_gaps(model_dir: str, trajectories, temperature: float) -> list[float]:
    """|llama.cpp's sampling log-prob - the trained model's| on every generated token, the update's check."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gaps = []
    with torch.no_grad():
        for t in trajectories:
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1].float() / temperature
            logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.completion_ids)[:, None])[:, 0]
            mask = torch.tensor(t.env_mask, dtype=torch.bool)
            gaps += (logps[mask] - torch.tensor(t.sampled_logprobs)[mask]).abs().tolist()
    return gaps


def step_setup():
    recipe = load_recipe(ROOT / "recipes" / "cpu-learn.yaml")
    tasks = [task.truncated(recipe.rollout.max_turns)
             for task in load_tasks(recipe.data.task_ids[: recipe.grpo.tasks_per_step])]
    config = recipe.interface
    return recipe, tasks, TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format)


def baseline_step(args, tokenizer, Baseline):
    """Per seed: (groups, seconds, phases) of the per-context engine, one task's group at a time."""
    recipe, tasks, interface = step_setup()
    rollout = recipe.rollout
    engine, played = Baseline(str(gguf_path(recipe.policy.model)), tokenizer, n_ctx=rollout.max_context_tokens,
                              n_threads=2), []
    for seed in range(args.step_seeds):
        engine.load_adapter(None)  # a new step: caches of the last one dropped
        engine.reseed(seed, 1)
        phases = {}
        groups, seconds = timed(lambda: [rollout_group(t, rollout.num_generations, engine, rollout, interface)
                                         for t in tasks], phases)
        played.append((groups, seconds, phases))
    engine.close()
    return played


def part_step(args, tokenizer, Baseline) -> dict:
    recipe, tasks, interface = step_setup()
    rollout, G = recipe.rollout, recipe.rollout.num_generations
    path = str(gguf_path(recipe.policy.model))
    baseline = baseline_plays("step", args, tokenizer, Baseline)
    seeds, engines = [], {"baseline": None,
                          "rounds": Rounds(LlamaCppGenerator(path, tokenizer, n_ctx=rollout.max_context_tokens,
                                                             n_threads=2)),
                          "batched": LlamaCppGenerator(path, tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2)}
    everything = {name: [] for name in engines}
    for seed in range(args.step_seeds):
        row = {"seed": seed}
        for name, engine in engines.items():
            if name == "baseline":
                groups, seconds, row[name] = baseline[seed]
            else:
                engine.load_adapter(None)  # a new step: caches of the last one dropped
                engine.reseed(seed, 1)
                row[name] = {}
                groups, seconds = timed(lambda e=engine: rollout_groups([(t, interface) for t in tasks], G, e, rollout),
                                        row[name])
            trajectories = [t for group in groups for t in group]
            everything[name] += trajectories
            row[name] |= {"seconds": seconds, "rewards": [int(diagnose_episode(task, t.turns).valid)
                                                         for task, group in zip(tasks, groups) for t in group]}
        row["speedup"] = row["baseline"]["seconds"] / row["batched"]["seconds"]
        seeds.append(row)
        print(f"  seed {seed}: {row['baseline']['seconds']:.1f} s, in rounds {row['rounds']['seconds']:.1f} s, "
              f"continuous {row['batched']['seconds']:.1f} s ({row['speedup']:.2f}x), rewards "
              f"{row['baseline']['rewards']}, {row['rounds']['rewards']}, {row['batched']['rewards']}", flush=True)
    for engine in engines.values():
        if engine is not None:
            engine.close()
    gaps = {}
    for name, trajectories in everything.items():
        values = np.asarray(engine_gaps(str(resolve_model(recipe.policy.model)), trajectories, rollout.temperature))
        gaps[name] = {"tokens": len(values), "mean": float(values.mean()), "p99": float(np.quantile(values, 0.99)),
                      "max": float(values.max()), "share_over_1": float((values > 1.0).mean())}
    total = {name: sum(row[name]["seconds"] for row in seeds) for name in engines}
    return {"seeds": seeds, "speedup": total["baseline"] / total["batched"],
            "speedup_in_rounds": total["baseline"] / total["rounds"], "logprob_gap": gaps}


def screen_setup(args):
    recipe = load_recipe(ROOT / "recipes" / "cpu-learn.yaml", {"data.screen": 4})
    ids = [task_id for task_id in split_ids("train") if task_id.startswith("multi_turn_base_")][: args.screen_tasks]
    tasks = [task.truncated(recipe.rollout.max_turns) for task in load_tasks(ids)]
    config = recipe.interface
    return recipe, tasks, TrainingInterface(config.schema_cues, config.recovery_feedback, (), config.tool_format)


def baseline_screen(args, tokenizer, Baseline):
    recipe, tasks, interface = screen_setup(args)
    old = Baseline(str(gguf_path(recipe.policy.model)), tokenizer, n_ctx=recipe.rollout.max_context_tokens,
                   n_threads=2)
    old.reseed(recipe.seed, 0)
    phases = {}
    groups, seconds = timed(lambda: [rollout_group(task, 4, old, recipe.rollout, interface) for task in tasks], phases)
    old.close()
    return groups, seconds, phases


def part_screen(args, tokenizer, Baseline) -> dict:
    recipe, tasks, interface = screen_setup(args)
    path = str(gguf_path(recipe.policy.model))
    groups, old_s, phases = baseline_plays("screen", args, tokenizer, Baseline)
    phases = {"baseline": phases}
    before = [sum(diagnose_episode(task, t.turns).valid for t in group) for task, group in zip(tasks, groups)]
    seconds, passes = {}, {}
    for name in ("rounds", "batched"):
        engine = LlamaCppGenerator(path, tokenizer, n_ctx=recipe.rollout.max_context_tokens, n_threads=2)
        engine.reseed(recipe.seed, 0)
        with tempfile.TemporaryDirectory() as directory:
            store = Store(Path(directory) / "seal.db")
            played = Rounds(engine) if name == "rounds" else engine
            phases[name] = {}
            rates, seconds[name] = timed(lambda p=played, s=store: screen_tasks(tasks, p, recipe, s), phases[name])
        engine.close()
        passes[name] = [round(rates[task.id] * 4) for task in tasks]
    after = passes["batched"]
    return {"tasks": len(tasks), "samples": 4, "baseline_s": old_s, "rounds_s": seconds["rounds"],
            "batched_s": seconds["batched"], "speedup": old_s / seconds["batched"],
            "speedup_in_rounds": old_s / seconds["rounds"], "phases": phases,
            "passes": [sum(before), sum(passes["rounds"]), sum(after)],
            "tasks_with_signal": [sum(0 < p < 4 for p in before), sum(0 < p < 4 for p in after)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--baseline", default="f8c4b0c", help="the commit whose per-context engine is the baseline")
    parser.add_argument("--eval-tasks", type=int, default=48)
    parser.add_argument("--step-seeds", type=int, default=3)
    parser.add_argument("--screen-tasks", type=int, default=16)
    parser.add_argument("--parts", default="eval,step,screen")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "llamacpp_batching.json")
    parser.add_argument("--baseline-build", type=Path, help="a folder holding another llama_cpp (pip install "
                        "--target) for the baseline, e.g. the generic build against this environment's avx512 one")
    parser.add_argument("--baseline-to", type=Path, help=argparse.SUPPRESS)  # the child of --baseline-build
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model), clean_up_tokenization_spaces=False)
    Baseline = baseline_engine(args.baseline)
    if args.baseline_to:
        args.baseline_build = None
        args.baseline_to.write_bytes(pickle.dumps(baseline_plays(args.parts, args, tokenizer, Baseline)))
        return
    import llama_cpp

    builds = {"this": llama_cpp.llama_print_system_info().decode()}
    if args.baseline_build:
        builds["baseline"] = subprocess.run(
            [sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"],
            env=with_build(args.baseline_build), capture_output=True, text=True,
            check=True).stdout.strip()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = f"{sys.platform}, {len(os.sched_getaffinity(0))} cores, {cpu_name()}"
    results["llama_cpp_builds"] = builds
    for part in args.parts.split(","):
        if part in results:
            print(f"{part}: already measured (in {args.out})")
        else:
            print(f"{part}: measuring ...", flush=True)
            results[part] = {"eval": part_eval, "step": part_step, "screen": part_screen}[part](args, tokenizer, Baseline)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))
        figures = {k: v for k, v in results[part].items() if k not in ("differences", "seeds")}
        print(f"{part}: {json.dumps(figures)}", flush=True)


if __name__ == "__main__":
    main()
