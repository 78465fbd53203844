"""Model text never reaches eval/exec: hostile calls go through the whole episode path and nothing runs."""

from pathlib import Path

from seal_lite.core.interface import TrainingInterface
from seal_lite.core.labels import SUCCESS_LABELS, label_turn
from seal_lite.core.recipe import Recipe
from seal_lite.envs.bfcl import load_tasks, official_verdict, turn_evidence
from seal_lite.step.rollout import rollout_group
from tests.helpers import ScriptedGenerator


def hostile_messages(marker: Path) -> list[str]:
    cmd = f"touch {marker}"
    return [
        f"__import__('os').system('{cmd}')",
        f"[__import__('os').system('{cmd}')]",
        f"[cd(folder=__import__('os').system('{cmd}'))]",
        f'<tool_call>{{"name": "__import__(\'os\').system(\'{cmd}\')", "arguments": {{}}}}</tool_call>',
        f'<tool_call>{{"name": "eval", "arguments": {{"source": "__import__(\'os\').system(\'{cmd}\')"}}}}</tool_call>',
        f"[exec(\"import os; os.system('{cmd}')\")]",
        # a literal argument is data: it must stay a string, in our environment and in bfcl's checker
        f"[mkdir(dir_name=\"x'); __import__('os').system('{cmd}'); ('\")]",
    ]


def test_injection_through_the_episode_path_runs_nothing(tmp_path, smol_tokenizer):
    marker = tmp_path / "pwned"
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    messages = hostile_messages(marker)
    recipe = Recipe()
    rollout = recipe.rollout.model_copy(update={"max_calls_per_turn": 1, "max_model_calls": 1})
    for text in messages:
        generator = ScriptedGenerator(smol_tokenizer, [[text]])
        (trajectory,) = rollout_group(task, 1, generator, rollout, TrainingInterface(schema_cues=True))
        verdict = official_verdict(task, trajectory.steps_per_turn())
        (label, cause), = [label_turn(e) for e in turn_evidence(task, trajectory.turns)]
        assert not marker.exists(), text
        assert verdict["valid"] is False
        assert label not in SUCCESS_LABELS, (text, label)
    assert not marker.exists()
