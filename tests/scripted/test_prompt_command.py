"""`seal-lite prompt`: exactly what the policy reads, under the evaluation view or a run's training interface."""

import json
from pathlib import Path

from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.interface import GUIDELINES_HEADER, SCHEMA_CUE_LINE
from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks

TRAIN_IDS = (Path(__file__).parents[2] / "data" / "train_ids.txt").read_text().split()


def vehicle_task():
    return next(task for task in load_tasks(TRAIN_IDS) if "VehicleControlAPI" in task.involved_classes)


def test_the_evaluation_view_shows_every_description_and_enum(smol_dir):
    task = vehicle_task()
    result = CliRunner().invoke(main, ["prompt", task.id])
    assert result.exit_code == 0, result.output
    shown = result.stdout
    docs = {doc["name"]: doc for doc in task.visible_functions(0)}
    assert '[Enum]: [\\"engage\\", \\"release\\"]' in shown  # activateParkingBrake's mode, as json.dumps writes it
    enums = 0
    for doc in docs.values():
        assert json.dumps(doc["description"]) in shown
        for spec in doc["parameters"].get("properties", {}).values():
            assert json.dumps(spec["description"]) in shown
            if "enum" in spec:
                assert json.dumps(spec["enum"]) in shown
            enums += "[Enum]" in spec["description"] or "enum" in spec
    assert enums >= 5
    assert shown.startswith("<|im_start|>system\n# Tools") and shown.endswith("<|im_start|>assistant\n\n")
    assert SCHEMA_CUE_LINE not in shown
    assert "tokens" in result.stderr and "evaluation view" in result.stderr
    tokens = int(result.stderr.split(": ")[-1].split()[0])
    assert tokens > 1000


def test_a_later_turn_shows_what_it_adds_and_a_run_shows_its_training_interface(tmp_path, smol_dir):
    (turn,) = load_tasks(["multi_turn_miss_func_0"])[0].revealed
    reveal = CliRunner().invoke(main, ["prompt", "multi_turn_miss_func_0", "--turn", str(turn)])
    assert reveal.exit_code == 0, reveal.output
    assert reveal.stdout.startswith("<|im_start|>user\n[{") and "What about now?" in reveal.stdout

    store = Store(tmp_path / "seal.db")
    store.start_run("r", Recipe().model_dump(), "smollm2-135m")
    for version, guidelines in ((1, []), (2, ["Check names and values against the request before acting."])):
        store.save_interface_version({
            "version": version, "parent": version - 1 or None, "step": version - 1, "reason": "test",
            "components": {"schema_cues": True, "recovery_feedback": True, "capability_hints": True,
                           "hints": "template", "tool_format": "official"},
            "system_prompt_cues": SCHEMA_CUE_LINE, "guidelines": guidelines, "statistics": {}})
    first = CliRunner().invoke(main, ["prompt", "multi_turn_base_0", "--run", str(tmp_path), "--version", "1"])
    latest = CliRunner().invoke(main, ["prompt", "multi_turn_base_0", "--run", str(tmp_path)])
    assert first.exit_code == latest.exit_code == 0, latest.output
    assert SCHEMA_CUE_LINE in first.stdout and "[required]" in first.stdout and GUIDELINES_HEADER not in first.stdout
    assert GUIDELINES_HEADER + "\n- Check names" in latest.stdout and "training interface v2" in latest.stderr

    missing = CliRunner().invoke(main, ["prompt", "multi_turn_base_0", "--run", str(tmp_path), "--version", "9"])
    assert missing.exit_code == 1 and "not 9" in missing.output
    unknown = CliRunner().invoke(main, ["prompt", "multi_turn_base_9999"])
    assert unknown.exit_code == 2 and "multi_turn_base_9999" in unknown.output


def test_a_llama_family_format_shows_its_own_view(smol_dir):
    """--parser toolace shows the release's ToolACE system prompt, not Qwen's tool block; a run's view has its own."""
    from seal_lite.core.interface import TOOLS_HEADER
    from seal_lite.core.llama_formats import TOOLACE_INSTRUCTIONS

    toolace = CliRunner().invoke(main, ["prompt", "multi_turn_base_0", "--parser", "toolace"])
    assert toolace.exit_code == 0, toolace.output
    assert TOOLACE_INSTRUCTIONS in toolace.stdout and TOOLS_HEADER not in toolace.stdout
    assert "toolace format" in toolace.stderr
    refused = CliRunner().invoke(main, ["prompt", "multi_turn_base_0", "--parser", "toolace", "--run", "."])
    assert refused.exit_code != 0 and "own format" in refused.output
