"""`seal-lite export` refuses what it cannot do with one message and no traceback, before any model loads.

The exports themselves, loaded by transformers and llama.cpp, are tests/real/test_export.py's. Here the run
directories are stores written by hand: a run row, a checkpoint row and an adapter directory with only its config,
which is all the checks read."""

import json

from click.testing import CliRunner

from seal_lite.cli import export as export_command
from seal_lite.cli import main
from seal_lite.core.recipe import load_recipe
from seal_lite.engines.gguf_lora import MERGED_TYPES
from seal_lite.engines.store import Store
from seal_lite.runs.export import KINDS, default_out


def fake_run(run_dir, model="smollm2-135m", checkpoint=True):
    """A run directory as `seal-lite run` leaves it after step 1, with an adapter that holds only its config."""
    store = Store(run_dir / "seal.db")
    store.start_run("fake", load_recipe(None, {"policy.model": model}).model_dump(), model)
    if checkpoint:
        for directory in (run_dir / "checkpoints" / "checkpoint-1", run_dir / "adapter"):
            directory.mkdir(parents=True)
            (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
        store.commit_checkpoint(1, "checkpoints/checkpoint-1", {})
    return run_dir


def refused(*arguments) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["export", *map(str, arguments)])
    assert isinstance(result.exception, SystemExit), result.exception  # a message, not a traceback
    return result.exit_code, result.output


def test_what_is_no_run_or_has_no_adapter_yet_exits_1_saying_so(tmp_path):
    assert refused(tmp_path, "--to", "merged") == (1, f"Error: {tmp_path / 'seal.db'} does not exist; pass a run "
                                                   "directory made by `seal-lite run`\n")
    fake_run(tmp_path, checkpoint=False)
    code, output = refused(tmp_path, "--to", "lora-gguf")
    assert code == 1 and "has no trained adapter yet: a run saves one when its first step ends" in output


def test_an_unknown_kind_or_an_option_of_another_kind_exits_2(tmp_path):
    fake_run(tmp_path)
    code, output = refused(tmp_path, "--to", "onnx")
    assert code == 2 and "Invalid value for '--to': 'onnx' is not one of 'merged', 'gguf', 'lora-gguf'" in output
    code, output = refused(tmp_path, "--to", "merged", "--gguf-type", "q8_0")
    assert code == 2 and "--gguf-type is the type of a merged GGUF's matrices; --to merged has none" in output
    code, output = refused(tmp_path, "--to", "merged", "--base-gguf", tmp_path / "seal.db")
    assert code == 2 and "--base-gguf is for the GGUF kinds" in output


def test_what_is_already_at_the_output_is_kept_unless_overwrite_and_a_file_is_never_a_directory(tmp_path):
    run_dir = fake_run(tmp_path / "run")
    (run_dir / "export").mkdir()
    (run_dir / "export" / "merged").mkdir()
    code, output = refused(run_dir, "--to", "merged")
    assert code == 1 and f"{run_dir / 'export' / 'merged'} already exists; choose another --output or pass " \
        "--overwrite" in output
    code, output = refused(run_dir, "--to", "gguf", "--output", run_dir / "export" / "merged", "--overwrite")
    assert code == 1 and "is a directory, and --to gguf writes a file" in output
    assert (run_dir / "export" / "merged").is_dir()


def test_a_step_that_was_not_kept_and_a_policy_that_is_no_gguf_are_named(tmp_path):
    code, output = refused(fake_run(tmp_path / "a"), "--to", "merged", "--step", 3)
    assert code == 1 and "keeps checkpoints of steps [1], not 3" in output
    code, output = refused(fake_run(tmp_path / "b", model="Qwen/Qwen2.5-7B-Instruct"), "--to", "gguf")
    assert code == 2 and "policy.model 'Qwen/Qwen2.5-7B-Instruct' is no GGUF: pass --base-gguf FILE" in output


def test_the_default_places_and_the_choices_the_command_offers(tmp_path):
    assert default_out(tmp_path, "merged", None, "f16") == tmp_path / "export" / "merged"
    assert default_out(tmp_path, "gguf", 2, "q8_0") == tmp_path / "export" / "step-2" / "merged-q8_0.gguf"
    assert default_out(tmp_path, "lora-gguf", None, "f16") == tmp_path / "export" / "lora.gguf"
    choices = {param.name: tuple(param.type.choices) for param in export_command.params if hasattr(param.type, "choices")}
    assert choices == {"kind": KINDS, "gguf_type": MERGED_TYPES}


def test_help_names_the_kinds_and_an_example():
    result = CliRunner().invoke(main, ["export", "--help"])
    assert result.exit_code == 0 and "Examples:" in result.output and "[merged|gguf|lora-gguf]" in result.output
