"""One SEAL step in each Llama-family format (``rollout.parser`` toolace and llama3.1) on a tiny random Llama
carrying Llama 3.1's chat format: the scripted policy's calls are read in the format, run on BFCL's tools, verified
by bfcl-eval's checker, and a real TRL update moves the LoRA.

tests/data/llama3.1_chat_template.jinja is written from Meta's documented Llama 3.1 prompt format (each message
under <|start_header_id|>role<|end_header_id|>, ended by <|eot_id|>; tool output under the ipython role).
ToolACE-2-Llama-3.1-8B is a Llama 3.1 fine-tune in the same format. The tokenizer is SmolLM2's with Llama 3's
special tokens added.
"""

import json
from pathlib import Path

import pytest
import torch

from seal_lite.core.interface import recovery_feedback
from seal_lite.core.llama_formats import LLAMA31, LLAMA31_SYSTEM_PROMPT, TOOLACE, TOOLACE_INSTRUCTIONS
from seal_lite.core.recipe import load_recipe
from seal_lite.core.types import CallStatus
from seal_lite.engines.policy import load_policy
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo
from tests.helpers import ScriptedGenerator

TEMPLATE = (Path(__file__).parents[1] / "data" / "llama3.1_chat_template.jinja").read_text()
LLAMA_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                "<|python_tag|>"]
TASK_ID = "multi_turn_base_10"  # one tool class (a 3k-token prompt); the first turn's ground truth is two calls
CD_RESULT = '{"current_working_directory": "workspace"}'  # bfcl-eval's text of cd's result


@pytest.fixture(scope="module")
def llama_model_dir(tmp_path_factory, smol_dir):
    """A random 2-layer Llama whose tokenizer writes Llama 3.1's chat format and stops at <|eot_id|>."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smol_dir, clean_up_tokenization_spaces=False)
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA_TOKENS})
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.chat_template = "<|begin_of_text|>", "<|eot_id|>", TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    path = tmp_path_factory.mktemp("llama31")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def calls_in(call_format: str, calls: list[tuple[str, dict]]) -> str:
    """Calls as a model writes them in the format."""
    if call_format == TOOLACE:
        return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls) + "]"
    return json.dumps([{"name": name, "parameters": args} for name, args in calls])


@pytest.mark.parametrize("call_format", [TOOLACE, LLAMA31])
def test_a_step_in_the_format_parses_verifies_and_updates(tmp_path, llama_model_dir, call_format):
    recipe = load_recipe(None, {
        "rollout.parser": call_format, "interface.tool_format": "official", "rollout.max_context_tokens": 8192,
        "data.task_ids": [TASK_ID], "grpo.tasks_per_step": 1, "grpo.steps": 1, "grpo.learning_rate": 1e-2,
        "rollout.num_generations": 2, "rollout.max_turns": 1, "policy.dtype": "float32",
    })
    task = load_tasks([TASK_ID])[0].truncated(1)
    right = calls_in(call_format, [("cd", {"folder": "workspace"}), ("mkdir", {"dir_name": "Projects"})])
    cut_off = calls_in(call_format, [("mkdir", {"dir_name": "Projects"})])[:-3]  # cut by a token budget
    store = Store(tmp_path / "seal.db")
    policy = load_policy(llama_model_dir, recipe)
    generator = ScriptedGenerator(policy.tokenizer, [[right, "Done."], [cut_off, "Done."]])
    seal_step = SealStep(recipe, store, {task.id: task}, generator)
    trainer = grpo.build_trainer(policy, recipe, [task.id], seal_step, str(tmp_path / "trl"),
                                 callbacks=[grpo.StoreCallback(store, updates=1)])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()

    # parse and verify: the right calls ran and pass bfcl-eval's checker; the cut-off message was rejected whole
    rows = store.trajectories(step=1)
    assert [row["reward"] for row in rows] == [1.0, 0.0]
    (system, first, _, results, _), (_, _, _, rejected, _) = (store.trajectory(row["id"])["messages"]
                                                             for row in rows)
    if call_format == TOOLACE:
        assert system["content"].startswith(TOOLACE_INSTRUCTIONS) and first["content"] == task.user_message(0)
        assert [json.loads(line) for line in results["content"].splitlines()] == [{"output": CD_RESULT},
                                                                                   {"output": "None"}]
    else:
        assert system["content"] == LLAMA31_SYSTEM_PROMPT
        assert first["content"].startswith("Given the following functions") and first["content"].endswith(
            task.user_message(0))
        assert results["content"] == f"{CD_RESULT}\nNone"  # mkdir returns nothing
    assert results["role"] == "ipython" and rejected["role"] == "user"
    assert rejected["content"].startswith("[ERROR] Invalid tool call format:")
    visible = [doc["name"] for doc in task.visible_functions(0)]
    assert rejected["content"].endswith("Hint: " + recovery_feedback(CallStatus.PARSE_ERROR, "", visible, call_format))
    batch = trainer.seal_batch
    text = policy.tokenizer.decode(batch.prompt_ids[0] + batch.completion_ids[0])
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n" in text

    # update: only model tokens carry loss, and the LoRA moved
    for env_mask in batch.env_mask:
        assert 0 < sum(env_mask) < len(env_mask)
    after = {n: p.detach() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert any(not torch.equal(after[n], before[n]) for n in before)
    assert store.steps()[0]["loss"] is not None
