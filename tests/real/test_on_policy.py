"""Rollouts are on-policy: every sampled token comes from softmax(logits / T) of the model being trained, the
distribution the GRPO loss scores it with, even when the checkpoint ships sampling defaults (Qwen2.5's
generation_config.json: repetition_penalty 1.05, top_k 20, top_p 0.8, temperature 0.7)."""

import json
import shutil

import torch

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.policy import load_policy
from seal_lite.engines.transformers_generate import TransformersGenerator
from seal_lite.training import grpo

QWEN_SAMPLING = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20, "top_p": 0.8}
TEMPERATURE = 0.9  # the rollout temperature: neither 1 nor Qwen's 0.7


def test_sampled_tokens_have_the_trained_models_log_probs(tmp_path, smol_dir, monkeypatch):
    model_dir = tmp_path / "smol-with-qwen-sampling"
    shutil.copytree(smol_dir, model_dir)
    config_path = model_dir / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps(config | QWEN_SAMPLING))

    recipe = load_recipe(None, {"interface.tool_format": "signatures", "policy.dtype": "float32",
                                "rollout.temperature": TEMPERATURE, "data.task_ids": ["multi_turn_base_0"],
                                "grpo.tasks_per_step": 1})
    policy = load_policy(str(model_dir), recipe)
    trainer = grpo.build_trainer(policy, recipe, ["multi_turn_base_0"], lambda prompts: None, str(tmp_path / "trl"))
    generator = TransformersGenerator(trainer.model, policy.tokenizer, policy.generation_mode)

    # the distribution each token is drawn from: transformers samples with torch.multinomial(probs)
    draws = []
    multinomial = torch.multinomial

    def recording_multinomial(probs, *args, **kwargs):
        tokens = multinomial(probs, *args, **kwargs)
        draws.append(probs.gather(-1, tokens).squeeze(-1).log())
        return tokens

    monkeypatch.setattr(torch, "multinomial", recording_multinomial)
    # a prompt that repeats itself: the tokens a repetition penalty would push down are likely continuations
    text = "List the files: a.txt b.txt c.txt a.txt b.txt c.txt a.txt b.txt"
    prompt = policy.tokenizer(text)["input_ids"]
    torch.manual_seed(0)
    [completion] = generator.generate([prompt], max_new_tokens=24, temperature=TEMPERATURE)
    monkeypatch.undo()
    sampled = torch.stack(draws)[: len(completion), 0]

    ids = torch.tensor([prompt + completion])
    trained, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, torch.ones_like(ids), len(completion))
    assert len(completion) >= 8
    torch.testing.assert_close(sampled, trained[0], rtol=0, atol=1e-4)
