"""`seal-lite verify`: the JSONL contract, per-line errors, and worker processes that change nothing."""

import json

from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.verify import verify_lines
from tests.support.mutations import corpus

KEYS = {"id", "valid", "labels", "causes", "error", "irrelevance_valid"}


def line(task_id, turns):
    return json.dumps({"id": task_id, "turns": turns})


def test_contract_and_unreadable_lines_do_not_stop_the_rest(tmp_path):
    (base,) = load_tasks(["multi_turn_base_0"])
    lines = [
        line("multi_turn_base_0", base.ground_truth),
        "{not json",
        line("multi_turn_base_999", [[]]),
        line("multi_turn_base_0", [[]]),
        json.dumps({"id": "multi_turn_base_0", "turns": [["ls()"], 3, [], []]}),
        "",  # blank lines are skipped
        line("multi_turn_base_0", [[["cd(folder='document')"], ["mkdir(dir_name='temp')"]], [], [], []]),  # steps
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["verify", "--input", str(source), "--output", str(target), "--workers", "1"])
    assert result.exit_code == 0, result.output
    records = [json.loads(text) for text in target.read_text().splitlines()]
    assert len(records) == 6 and all(set(record) == KEYS for record in records)
    good, bad_json, unknown, short, bad_turn, steps = records
    assert good == {"id": "multi_turn_base_0", "valid": True, "labels": ["pass"] * 4, "causes": [None] * 4,
                    "error": None, "irrelevance_valid": True}
    assert bad_json["valid"] is None and bad_json["error"].startswith("line 2: not valid JSON")
    assert unknown["error"].startswith("line 3:") and "multi_turn_base_999" in unknown["error"]
    assert "has 4 user turns, the line has 1" in short["error"]
    assert "turn 1 must be a list of call strings" in bad_turn["error"]
    assert steps["valid"] is False and steps["labels"][0] == "state_mismatch" and steps["error"] is None
    assert "6 lines: 1 valid, 1 not valid, 4 unreadable" in result.output  # the summary on stderr


def test_four_workers_give_the_serial_results_in_order():
    tasks = load_tasks([f"multi_turn_{category}_{i}" for category in ("base", "miss_func", "miss_param", "long_context")
                        for i in (0, 5)])
    lines = [line(m.task_id, m.turns) for m in corpus(tasks)] + ["{broken"]
    serial = list(verify_lines(lines, workers=1))
    parallel = list(verify_lines(lines, workers=4))
    assert parallel == serial
    assert len(serial) == len(lines) and {r["valid"] for r in serial} == {True, False, None}


def test_a_turn_whose_only_call_names_no_real_tool_is_an_empty_turn():
    """A call of a tool that does not exist is rejected, so it is no decoded call (docs/method.md §8): the turn is
    empty_turn_model_response, and the verdict is bfcl-eval's on the calls without it."""
    from seal_lite.envs.bfcl import official_verdict

    (base,) = load_tasks(["multi_turn_base_0"])
    turns = [["move_everything(to='temp')"], *base.ground_truth[1:]]
    result = CliRunner().invoke(main, ["verify", "--input", "-", "--workers", "1"],
                                input=line("multi_turn_base_0", turns) + "\n")
    record = json.loads(result.stdout.splitlines()[0])
    assert record["labels"][0] == "empty_turn_model_response" and record["causes"][0] == "invalid_tool_call"
    official = official_verdict(base, [[]] + [[calls] for calls in base.ground_truth[1:]])
    assert record["valid"] is official["valid"] is False
    assert official["error_type"] == "multi_turn:empty_turn_model_response"
