"""τ²-bench with real models: SmolLM2 plays both roles of one real conversation per domain through llama.cpp
servers, and a run's LoRA is served on top of the policy's GGUF. The harness without a model is
tests/scripted/test_tau2.py's."""

import json
import os
import subprocess
import sys

from seal_lite.envs import tau2_bench
from seal_lite.runs import evaluate_tau2


def test_one_real_conversation_per_domain_with_a_small_local_model(tmp_path):
    """SmolLM2-135M (its pip GGUF, llama.cpp servers) plays both roles on the first task of each domain. It cannot
    solve them; what is checked is that the conversations happen and τ² scores them."""
    out = tmp_path / "tau2.json"
    command = [sys.executable, "-m", "seal_lite", "eval", "smollm2-135m", "--benchmark", "tau2", "--tasks", "1",
               "--max-steps", "4", "--json-file", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    (tasks,) = report["tasks"].values()
    assert [task["domain"] for task in tasks] == list(tau2_bench.DOMAINS)
    for task in tasks:
        assert task["reward"] in (0.0, 1.0) and task["termination"] in ("max_steps", "user_stop", "agent_stop")
        spoken = [m for m in task["conversation"][1:] if m["role"] in ("assistant", "user")]
        assert len(spoken) >= 2 and all(m["content"] or m.get("tool_calls") for m in spoken)  # the models spoke
    summary = report["summary"]["smollm2-135m"]
    assert summary["mean"]["tasks"] == 3 and "pass^1" in summary["retail"]
    assert "τ²-bench pass^1" in result.stdout and "telecom" in result.stdout


def test_a_runs_lora_is_served_on_top_of_the_policy_gguf(tmp_path, smol_dir):
    """The path `eval RUN --benchmark tau2` takes for a trained adapter: the PEFT adapter exported to a LoRA GGUF
    and given to llama.cpp's server with the base GGUF; a LoRA that changes the model changes the answer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from seal_lite.core.recipe import load_recipe

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    model.save_pretrained(tmp_path / "adapter")
    lora = evaluate_tau2.export_adapter("smollm2-135m", tmp_path / "adapter", tmp_path / "policy-lora.gguf", load_recipe(None, {}))
    messages = [{"role": "user", "content": "Tell me about your day at the sea."}]
    schema = tau2_bench.answer_schema(None)
    answers = []
    for model_spec in (evaluate_tau2.chat_model("smollm2-135m"), evaluate_tau2.chat_model("smollm2-135m", lora)):
        with evaluate_tau2.serving(model_spec, n_ctx=2048) as chat:
            answers.append(chat.complete(messages, schema, 32, 300))
    assert all(answer.replace(" ", "").startswith('{"message":"') for answer in answers), answers  # the schema held
    assert answers[0] != answers[1]
