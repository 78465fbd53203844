"""The training interface: phi_err and phi_cap, versions in the store, evaluation untouched, no leaks."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_lite.cli import main
from seal_lite.core.explainer import argument_values, redact_unseen_values
from seal_lite.core.interface import (
    GUIDELINES,
    GUIDELINES_HEADER,
    SCHEMA_CUE_LINE,
    TrainingInterface,
    apply_schema_cues,
    capability_guidelines,
    evaluation_interface,
    guideline_candidates,
    observation,
    recovery_feedback,
    render_tools,
    render_view,
)
from seal_lite.core.recipe import Recipe
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import episode, load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.step.rollout import rollout_group
from tests.helpers import ScriptedGenerator

DATA = Path(__file__).parents[2] / "data"
TRAIN_IDS = DATA.joinpath("train_ids.txt").read_text().split()


@pytest.mark.parametrize("call, hint", [
    ("[mkdir()]", "Supply the required argument 'dir_name'."),
    ("[mkdir(dir_name='a', mode=1)]", "Drop the argument 'mode': this tool does not take it."),
    ("[cd(folder='nowhere')]", "Inspect first"),
    ("[mkdir(dir_name='a/b')]", "Go one step at a time"),
    ("[post_tweet(content='hi')]", "Log in first"),
    ("[move(a=1)]", "Use only the listed tools: authenticate_twitter, cat, cd,"),
    ("[cat(file_name=3)]", "Re-check the argument types"),
    ("<tool_call>{bad</tool_call>", "Write each call as <tool_call>"),
    ("[rmdir(dir_name='document')]", "The current state does not allow this yet"),  # Directory not empty
    ("[cd(folder='..')]", "Inspect first"),  # at the root: "cd: ..: No such directory"
])
def test_recovery_feedback_picks_a_hint_from_the_real_error(call, hint):
    task = load_tasks(["multi_turn_base_0"])[0]
    (outcome,) = episode(task).run(call, 0)
    assert outcome.status != "ok"
    visible = [doc["name"] for doc in task.visible_functions(0)]
    assert recovery_feedback(outcome.status, outcome.result, visible).startswith(hint)
    text = observation([(outcome.status, outcome.result)], TrainingInterface(recovery_feedback=True), visible)
    assert text.endswith("Hint: " + recovery_feedback(outcome.status, outcome.result, visible))
    assert "Hint:" not in observation([(outcome.status, outcome.result)], TrainingInterface(), visible)


# the failure statistics of one window: label counts and the mean reward of each label's trajectories
COUNTS = {"empty_turn_model_response": 40, "state_mismatch": 20, "response_mismatch": 9, "spurious_tool_call": 7,
          "instance_mismatch": 8, "pass": 100}
REWARDS = {"empty_turn_model_response": 0.0, "state_mismatch": 0.5, "response_mismatch": 0.0,
           "spurious_tool_call": 0.0, "instance_mismatch": 0.7}


def test_guidelines_follow_the_selection_rule():
    counts, rewards = COUNTS, REWARDS
    lines = capability_guidelines(counts, rewards)
    # ranked by prevalence * (1 - reward): empty 40/84, response 9/84 (0.107), state 20/84 * 0.5 (0.119);
    # spurious has count 7 < 8, instance_mismatch has reward 0.7 >= 0.6; at most 3 lines
    assert lines == (GUIDELINES["empty_turn_model_response"], GUIDELINES["state_mismatch"],
                     GUIDELINES["response_mismatch"])
    recovered = capability_guidelines(counts, rewards | {"empty_turn_model_response": 0.8})
    assert GUIDELINES["empty_turn_model_response"] not in recovered  # the line leaves once reward recovers
    rare = capability_guidelines({"state_mismatch": 9, "empty_turn_model_response": 200}, {})
    assert rare == (GUIDELINES["empty_turn_model_response"],)  # 9/209 is under 10% prevalence
    assert capability_guidelines(counts, rewards, {"state_mismatch": "Say the folder name."})[1] == "Say the folder name."
    # the quickstart's threshold: 3 of one label in the window is enough; the release's 8 is not
    first_step = {"empty_turn_model_response": 3, "response_mismatch": 2}
    assert capability_guidelines(first_step, {}) == ()
    assert capability_guidelines(first_step, {}, min_count=3) == (GUIDELINES["empty_turn_model_response"],)


def test_guideline_candidates_show_each_label_against_the_rule():
    counts, rewards = COUNTS, REWARDS
    candidates = guideline_candidates(counts, rewards)
    by_label = {c.label: c for c in candidates}
    assert set(by_label) == set(counts) - {"pass"}  # pass has no guideline
    assert by_label["state_mismatch"].prevalence == pytest.approx(20 / 84)
    assert by_label["state_mismatch"].score == pytest.approx(20 / 84 * 0.5)
    assert [c.label for c in candidates if not c.qualifies] == ["spurious_tool_call", "instance_mismatch"]
    assert [c.score for c in candidates] == sorted((c.score for c in candidates), reverse=True)
    # capability_guidelines is the first three qualifying candidates
    chosen = tuple(GUIDELINES[c.label] for c in candidates if c.qualifies)[:3]
    assert capability_guidelines(counts, rewards) == chosen
    assert guideline_candidates({}, {}) == []


labels = st.sampled_from(sorted(GUIDELINES) + ["pass", "correct_abstention"])
statistics = st.tuples(st.dictionaries(labels, st.integers(0, 60)), st.dictionaries(labels, st.floats(0, 1)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(statistics, st.booleans(), st.booleans(), st.sampled_from(["signatures", "official"]),
       st.sampled_from(TRAIN_IDS[:40]))
def test_evaluation_sees_the_plain_view_whatever_the_training_interface(stats, cues, feedback, tool_format, task_id):
    task = load_tasks([task_id])[0]
    training = TrainingInterface(cues, feedback, capability_guidelines(*stats), tool_format)
    evaluation = evaluation_interface()
    functions = task.visible_functions(0)
    view, plain = render_view(functions, evaluation), render_view(functions, TrainingInterface())
    assert view == plain and view.tools == functions  # the BFCL docs, untouched
    for marker in (SCHEMA_CUE_LINE, GUIDELINES_HEADER, "[required]", "Allowed values:"):
        assert marker not in view.system_prompt
    results = [("tool_error", '{"error": "cd: x: No such file or directory"}'), ("ok", "{}")]
    visible = [doc["name"] for doc in functions]
    assert observation(results, evaluation, visible) == \
        f"<tool_response>\n{results[0][1]}\n</tool_response>\n<tool_response>\n{{}}\n</tool_response>"
    if not training.plain:  # and the training interface does change what the policy sees
        assert render_view(functions, training) != view or observation(results, training, visible) != \
            observation(results, evaluation, visible)


def test_evaluation_episode_is_byte_identical_to_a_plain_one(smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(2)
    script = ['<tool_call>{"name": "cd", "arguments": {"folder": "nowhere"}}</tool_call>', "Done.", "Done."]
    rollout = Recipe().rollout.model_copy(update={"max_calls_per_turn": 2})
    trained = TrainingInterface(True, True, capability_guidelines({"state_mismatch": 50}, {}))
    runs = {}
    for name, interface in (("plain", TrainingInterface()), ("evaluation", evaluation_interface()),
                            ("training", trained)):
        (trajectory,) = rollout_group(task, 1, ScriptedGenerator(smol_tokenizer, [script]), rollout, interface)
        runs[name] = trajectory
    assert runs["evaluation"].messages == runs["plain"].messages
    assert runs["evaluation"].prompt_ids + runs["evaluation"].completion_ids == \
        runs["plain"].prompt_ids + runs["plain"].completion_ids
    assert runs["training"].messages != runs["plain"].messages


def test_no_component_reveals_an_unseen_ground_truth_value_on_any_training_task():
    """Over all 400 training tasks: phi_schema, phi_err and phi_cap texts carry no ground-truth argument value
    that the task's own plain conversation (its BFCL tool docs and user turns) does not already show."""
    error_texts = [("parse_error", "[ERROR] Invalid tool call format: Tool call JSON must contain both 'name' and "
                                   "'arguments'."),
                   ("unknown_tool", "[ERROR] Invalid tool call format: Tool 'x' is not available in the current tool "
                                    "list."),
                   ("argument_error", "Error during execution: missing a required argument: 'name'"),
                   ("argument_error", "Error during execution: got an unexpected keyword argument 'mode'"),
                   ("tool_error", '{"error": "No such file or directory"}'),
                   ("tool_error", '{"error": "User not authenticated."}'), ("tool_error", '{"error": "bad type"}'),
                   ("tool_error", '{"error": "Directory not empty"}')]
    leaks = []
    for task in load_tasks(TRAIN_IDS):
        functions = task.visible_functions(len(task.turns) - 1)
        seen = json.dumps(functions) + " ".join(task.user_message(i) for i in range(len(task.turns)))
        hidden = argument_values([call for turn in task.ground_truth for call in turn])
        visible = [doc["name"] for doc in functions]
        texts = [render_tools(apply_schema_cues(functions), fmt) for fmt in ("signatures", "official")]
        texts += [SCHEMA_CUE_LINE, *GUIDELINES.values()]
        texts += [recovery_feedback(status, error, visible) for status, error in error_texts]
        for text in texts:
            if redact_unseen_values(text, hidden, seen)[1]:
                leaks.append((task.id, text[:80]))
    assert leaks == []


def test_interface_versions_evolve_with_failures_and_are_shown(tmp_path, smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(2)
    recipe = Recipe()
    recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn = 4, 1
    recipe.diagnoser.mode = "off"
    store = Store(tmp_path / "seal.db")
    step = SealStep(recipe, store, {task.id: task}, None)
    for _ in range(2):  # every episode answers in text: 8 empty turns per step
        step.generator = ScriptedGenerator(smol_tokenizer, [["Sure.", "Sure."]] * 4)
        step([task.id])
    versions = store.interface_versions()
    assert [v["version"] for v in versions] == [1, 2] and versions[1]["parent"] == 1 and versions[1]["step"] == 1
    assert versions[1]["guidelines"] == [GUIDELINES["empty_turn_model_response"]]
    assert versions[1]["statistics"]["counts"] == {"empty_turn_model_response": 8}
    assert "guideline added" in versions[1]["reason"]
    # step 2 rolled out under version 2: its system prompt carries the guideline; step 1's did not
    prompts = {row["step"]: json.loads(row["messages"])[0]["content"] for row in store.db["trajectories"].rows}
    assert GUIDELINES_HEADER in prompts[2] and GUIDELINES_HEADER not in prompts[1]
    rho = store.db.execute("select step, count(*) from metrics where name like 'rho/%' group by step").fetchall()
    assert rho == [(1, 7), (2, 7)]  # the utilities of the 7 weighted labels, stored every step

    runner = CliRunner()
    shown = runner.invoke(main, ["interface", "show", str(tmp_path)])
    assert shown.exit_code == 0 and "v2  step 1  parent 1  guideline added" in shown.output
    assert GUIDELINES["empty_turn_model_response"] in shown.output
    diff = runner.invoke(main, ["interface", "diff", str(tmp_path), "1", "2"])
    assert f"+  - {GUIDELINES['empty_turn_model_response']}" in diff.output and "-  (no guideline)" in diff.output
    as_json = json.loads(runner.invoke(main, ["interface", "show", str(tmp_path), "--version", "1", "--json"]).output)
    assert as_json["version"] == 1 and as_json["guidelines"] == []
    missing = runner.invoke(main, ["interface", "show", str(tmp_path), "--version", "7"])
    assert missing.exit_code == 1 and "not 7" in missing.output


def test_the_recipe_sets_how_often_a_label_must_occur_for_a_guideline(tmp_path, smol_tokenizer):
    """interface.guideline_min_count reaches phi_cap: 8 empty turns evolve the interface at 8, not at 9."""
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    versions = {}
    for min_count in (8, 9):
        recipe = Recipe()
        recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn = 8, 1
        recipe.diagnoser.mode, recipe.interface.guideline_min_count = "off", min_count
        store = Store(tmp_path / f"min{min_count}.db")
        step = SealStep(recipe, store, {task.id: task}, ScriptedGenerator(smol_tokenizer, [["Sure."]] * 8))
        step([task.id])
        versions[min_count] = [row["guidelines"] for row in store.interface_versions()]
    assert versions == {8: [[], [GUIDELINES["empty_turn_model_response"]]], 9: [[]]}
