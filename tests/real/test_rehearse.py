"""``seal-lite rehearse`` for real on this CPU: the 24 GB and the paper recipe, each in its own configuration at toy
size (peft-4bit NF4 in bf16, generate with sdpa as auto picks on a GPU, the shared-prefix update with kept suffix
graphs, validation, a SIGKILL after step 1's checkpoint and a resume), every check passing; and the checks
catching what they are there for. colab-t4's rehearsal runs in tests/real/test_notebooks.py, through its notebook."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.recipe import load_recipe
from seal_lite.runs import rehearse

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def rehearsed_24gb(tmp_path_factory):
    out = tmp_path_factory.mktemp("rehearse") / "gpu-24gb"
    result = CliRunner().invoke(main, ["rehearse", str(ROOT / "recipes" / "gpu-24gb.yaml"), "--out", str(out)])
    return out, result


def test_the_24gb_recipe_rehearses_in_its_own_configuration(rehearsed_24gb):
    out, result = rehearsed_24gb
    assert result.exit_code == 0, result.output
    assert "on the RTX 4090" in result.output and "Rehearsal passed" in result.output and "FAIL" not in result.output
    facts = [json.loads(line) for line in (out / rehearse.FACTS).read_text().splitlines()]
    assert {fact["dtype"] for fact in facts if "dtype" in fact} == {"torch.bfloat16"}
    assert {fact["backend"] for fact in facts if "backend" in fact} == {"peft-4bit"}
    assert {value for fact in facts for value in fact.get("attention", [])} == {"sdpa"}
    assert len({fact["pid"] for fact in facts}) == 2  # the killed run and the resumed one


def test_the_paper_recipe_rehearses_with_its_validation_before_training(tmp_path):
    result = CliRunner().invoke(main, ["rehearse", str(ROOT / "recipes" / "paper-qwen2.5-7b.yaml"),
                                       "--out", str(tmp_path / "paper")])
    assert result.exit_code == 0, result.output
    assert "on the A100 80GB" in result.output and "validated before training and after steps [1, 2]" in result.output


def test_the_checks_fail_on_a_run_that_did_not_do_what_the_card_does(rehearsed_24gb, tmp_path):
    """The same run judged against facts it did not show: FlashAttention where the card plays sdpa, fp16 without
    loss scaling, no suffix graph kept, and a second run that never said it resumed."""
    out, _ = rehearsed_24gb
    recipe = load_recipe(ROOT / "recipes" / "gpu-24gb.yaml")
    planned = rehearse.plan(recipe, rehearse.default_card(recipe), "/toy", [], [])
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(json.dumps(fact) for fact in (
        {"pid": 1, "dtype": "torch.bfloat16", "linear4bit": 14, "backend": "peft-4bit"},
        {"pid": 1, "attention": ["flash_attention_2"]},
        {"pid": 1, "shared_prefix": True, "hold_bytes": 0.0, "skipped_steps": 0})) + "\n")
    second = subprocess.CompletedProcess([], 0, stdout="the run, not resumed", stderr="")
    checks = {check.name: check.ok for check in rehearse.check_run(planned, out / "run", facts, 1, second)}
    assert checks == {"killed after a checkpoint": True, "resumed and finished": False, "updates applied": True,
                      "dtype": True, "4-bit layers": True, "attention": False, "update path": False,
                      "validation": True, "checkpoints": True}
