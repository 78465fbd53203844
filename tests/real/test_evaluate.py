"""Held-out evaluation: the plain interface, the official verdict per category, greedy and repeatable."""

import json
import subprocess
import sys

from seal_lite.core.interface import SCHEMA_CUE_LINE
from seal_lite.core.recipe import load_recipe
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.evaluate_bfcl import evaluate, summarize, view_label
from tests.helpers import ScriptedGenerator, tool_call_text

IDS = ["multi_turn_base_1", "multi_turn_base_4", "multi_turn_miss_param_3"]


def test_ground_truth_scores_full_marks_under_the_plain_interface(smol_tokenizer):
    recipe = load_recipe(None, {"rollout.max_turns": 1, "rollout.max_calls_per_turn": 1})
    tasks = [task.truncated(1) for task in load_tasks(IDS)]
    results = []
    for task, right in zip(tasks, [True, False, True], strict=True):
        # no per-turn cap at evaluation: after its calls the model must close the turn itself
        script = [tool_call_text(task.ground_truth[0]), "Done."] if right else ["I need more details."]
        generator = ScriptedGenerator(smol_tokenizer, [script])
        results += evaluate([task], generator, recipe.rollout)
        assert SCHEMA_CUE_LINE not in smol_tokenizer.decode(generator.seen[0][0])  # the plain view
    assert [r.valid for r in results] == [True, False, True]
    table = summarize(results)
    assert table["base"] == {"tasks": 2, "accuracy": 0.5, "turn_pass_rate": 0.5}
    assert table["miss_param"] == {"tasks": 1, "accuracy": 1.0, "turn_pass_rate": 1.0}
    assert table["mean"] == {"tasks": 3, "accuracy": 0.75, "turn_pass_rate": 0.75}  # over categories, not tasks


def test_eval_command_is_greedy_repeatable_and_marks_the_signatures_view(tmp_path):
    """Two runs under the official view give the same result (the recipe's training tool format does not reach
    evaluation); a third with --view signatures says, and stores, that it is not the BFCL view."""
    command = [sys.executable, "-m", "seal_lite", "eval", "smollm2-135m", "--split", "multi_turn_base_1",
               "--set", "rollout.max_turns=2", "--set", "interface.tool_format=signatures"]
    outputs = []
    for attempt in range(2):
        path = tmp_path / f"eval{attempt}.json"
        result = subprocess.run(command + ["--json-file", str(path)], capture_output=True, text=True, timeout=1800,
                                check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "official verdict accuracy" in result.stdout and "not the BFCL view" not in result.stderr
        outputs.append(json.loads(path.read_text()))
    assert outputs[0] == outputs[1]
    assert list(outputs[0]["summary"]) == ["base"]
    [task] = outputs[0]["tasks"]["base"]
    assert task["task_id"] == "multi_turn_base_1" and task["turns"] == 2 and len(task["labels"]) == 2
    assert outputs[0]["summary"]["base"]["mean"]["tasks"] == 1

    path = tmp_path / "signatures.json"
    marked = subprocess.run(command + ["--set", "rollout.max_turns=1", "--set", "rollout.max_model_calls=2",
                                       "--view", "signatures", "--json-file", str(path)],
                            capture_output=True, text=True, timeout=1800, check=False)
    assert marked.returncode == 0, marked.stderr[-2000:]
    assert "not the BFCL view" in marked.stderr  # and in the stored label below (the table may abbreviate it)
    assert list(json.loads(path.read_text())["summary"]) == ["base [signatures view: not the BFCL view]"]


def test_the_view_label_marks_everything_but_the_official_view():
    assert view_label("step 3", "official") == "step 3"
    assert view_label("step 3", "signatures") == "step 3 [signatures view: not the BFCL view]"


def test_eval_base_frees_each_variants_policy_before_the_next_one_loads(tmp_path, tiny_model_dir, monkeypatch):
    """`seal-lite eval RUN --base` plays the base model, then the trained adapter, in one process: the first policy
    is gone when the second loads (on a GPU, a second vLLM engine starts only where the card's memory is free)."""
    import weakref

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from seal_lite.engines import policy as policy_module
    from seal_lite.engines.store import Store
    from seal_lite.runs.evaluate_bfcl import evaluate_target

    run = tmp_path / "run"
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "policy.dtype": "float32", "diagnoser.mode": "off",
                                "rollout.max_new_tokens": 8, "rollout.max_turns": 1})
    store = Store(run / "seal.db")
    store.start_run(recipe.name, recipe.model_dump(), tiny_model_dir)
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, target_modules="all-linear")
                   ).save_pretrained(run / "checkpoints" / "checkpoint-1")
    store.commit_checkpoint(1, "checkpoints/checkpoint-1", {})
    loaded, alive_at_each_load = [], []
    load = policy_module.load_policy

    def load_watched(model_dir, recipe):
        alive_at_each_load.append([model() is not None for model in loaded])
        policy = load(model_dir, recipe)
        loaded.append(weakref.ref(policy.model))
        return policy

    monkeypatch.setattr(policy_module, "load_policy", load_watched)
    output = evaluate_target(str(run), split="multi_turn_base_1", base=True)
    assert list(output["summary"]) == ["base", "step 1"]
    assert alive_at_each_load == [[], [False]]
