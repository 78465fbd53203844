"""`seal-lite export`: each export of a real run, loaded where it is meant to run, against the run's policy.

Real parts: a one-step SmolLM2-135M run (its pip GGUF, llama.cpp rollouts, a GRPO step; about a minute on 2
cores), exported by the CLI to all three kinds; transformers loads the merged directory, and llama-cpp-python's
``Llama`` (what ``python -m llama_cpp.server`` runs) the merged GGUF, and the base GGUF with the LoRA GGUF. The
prompts are the openings of three BFCL tasks (``turn_text``) in the signatures view, the one the run trained on.
The run's policy is its base model with its adapter in transformers and peft (``policy.load_adapted``).

One step barely moves a LoRA (its B starts at 0, the learning rate is 2e-5), so every export would match the base
model as well as the policy. Before exporting, the test therefore gives the run's adapter seeded random B matrices
(N(0, 0.1²), as tests/real/test_gguf_lora.py does), which move SmolLM2's log-probs by about 1 nat.

What is compared, over the policy's greedy continuation of 16 tokens per prompt:

* merged: transformers' greedy continuation is the policy's, token for token, and the log-probs agree within 1e-3
  (measured: max |Δ| 3.5e-5; merging only changes the rounding).
* gguf and lora-gguf: llama.cpp computes in its own formats (the base's Q4_1 matrices against 8-bit activations,
  the merged GGUF's f16 ones), so equal tokens cannot be promised at a near tie. Teacher-forced on the policy's continuation, llama.cpp's choice is the policy's
  greedy token at ≥ 90% of the positions, and the policy's token is never more than ``NEAR_TIE`` nats below
  llama.cpp's best; the mean |Δ log-prob| over the policy's top 10 tokens is at most 0.25 and the mean KL at most
  0.03. Measured on the 48 positions: both 96 % (two near ties broken the other way, 0.05 nat apart), gguf mean
  0.043 and KL 0.0007, lora-gguf 0.084 and 0.0028. The base GGUF without the adapter fails every bound (69 %,
  4.1 nat, mean 1.16, KL 0.37), which the last llama.cpp test checks.

About 5 minutes on 2 shared cores: the run, three exports, and four models reading 3 prompts of 500-850 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from seal_lite.cli import main

TASKS = ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_miss_func_0")
NEW_TOKENS = 16
SIGMA = 0.1  # the adapter's B matrices: N(0, SIGMA²)
MERGED_TOL = 1e-3  # max |Δ log-prob| of the merged directory against the policy, both fp32 transformers
ARGMAX_MIN = 0.9  # share of positions where llama.cpp's argmax is the policy's greedy token
NEAR_TIE = 0.5  # nats: the policy's token is never further below llama.cpp's best than this
MEAN_TOL = 0.25  # mean |Δ log-prob| over the policy's top 10
KL_TOL = 0.03  # mean KL(policy ‖ llama.cpp) per position


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A real one-step SmolLM2 run, its adapter's B made random, exported by the CLI to each kind."""
    import torch
    from safetensors.torch import load_file, save_file

    from seal_lite.core.recipe import load_recipe
    from seal_lite.runs.train import run

    run_dir = tmp_path_factory.mktemp("export") / "run"
    run(load_recipe(None, {
        "policy.model": "smollm2-135m", "policy.dtype": "float32", "diagnoser.mode": "off",
        "interface.tool_format": "signatures", "data.task_ids": ["multi_turn_base_0"], "grpo.tasks_per_step": 1,
        "grpo.steps": 1, "rollout.num_generations": 2, "rollout.max_turns": 1, "rollout.max_new_tokens": 8,
        "rollout.max_model_calls": 1,
    }), run_dir)
    weights_file = run_dir / "adapter" / "adapter_model.safetensors"
    weights, generator = load_file(weights_file), torch.Generator().manual_seed(1)
    for name in sorted(weights):
        if "lora_B" in name:
            weights[name] = torch.randn(weights[name].shape, generator=generator) * SIGMA
    save_file(weights, weights_file, metadata={"format": "pt"})

    printed = {}
    for kind in ("merged", "gguf", "lora-gguf"):
        result = CliRunner().invoke(main, ["export", str(run_dir), "--to", kind])
        assert result.exit_code == 0, result.output
        printed[kind] = result.output
    return run_dir, printed


@pytest.fixture(scope="module")
def policy_greedy(exported):
    """Per prompt: (prompt ids, the policy's greedy continuation, its log-probs at each continuation position)."""
    from seal_lite.core.interface import evaluation_interface
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_adapted
    from seal_lite.envs.bfcl import load_tasks
    from seal_lite.step.rollout import turn_text

    run_dir, _ = exported
    model, tokenizer = load_adapted(resolve_model("smollm2-135m"), run_dir / "adapter")
    prompts = [tokenizer(turn_text(tokenizer, task, 0, evaluation_interface("signatures")),
                         add_special_tokens=False)["input_ids"] for task in load_tasks(list(TASKS))]
    return tokenizer, [(ids, *greedy(model, ids)) for ids in prompts]


def greedy(model, ids: list[int]) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation of ``ids`` and the log-probs it was chosen from."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    logits = torch.stack(out.logits)[:, 0].double()
    return out.sequences[0, len(ids):].tolist(), torch.log_softmax(logits, -1).numpy()


def llama_cpp_logprobs(gguf, prompts, lora=None) -> list[np.ndarray]:
    """llama.cpp's log-probs at each position of each policy continuation, teacher-forced (one model load)."""
    from llama_cpp import Llama

    n_ctx = max(len(ids) + len(new) for ids, new, _ in prompts)
    llm = Llama(str(gguf), lora_path=str(lora) if lora else None, n_ctx=n_ctx, n_threads=1, logits_all=True,
                verbose=False)
    rows = []
    try:
        for ids, new, _ in prompts:
            llm.reset()
            llm.eval(ids + new[:-1])
            logits = np.array(llm.scores[len(ids) - 1:len(ids) - 1 + len(new)], dtype=np.float64)
            logits -= logits.max(-1, keepdims=True)
            rows.append(logits - np.log(np.exp(logits).sum(-1, keepdims=True)))
    finally:
        llm.close()
    return rows


def agreement(prompts, logprobs: list[np.ndarray]) -> dict[str, float]:
    """How close llama.cpp's log-probs are to the policy's, pooled over every continuation position."""
    new = np.concatenate([np.array(new) for _, new, _ in prompts])
    ours, theirs = np.concatenate([policy for _, _, policy in prompts]), np.concatenate(logprobs)
    top = np.argsort(-ours, -1)[:, :10]
    chosen = np.take_along_axis(theirs, new[:, None], -1)[:, 0]
    return {
        "argmax": float((theirs.argmax(-1) == new).mean()),
        "worst_gap": float((theirs.max(-1) - chosen).max()),  # how far below llama.cpp's best the policy's token is
        "mean": float(np.abs(np.take_along_axis(theirs, top, -1) - np.take_along_axis(ours, top, -1)).mean()),
        "kl": float((np.exp(ours) * (ours - theirs)).sum(-1).mean()),
    }


def test_each_export_is_where_the_command_says_with_what_its_loader_reads(exported):
    import gguf

    from seal_lite.engines.model_sources import gguf_path

    run_dir, printed = exported
    export, base = run_dir / "export", gguf_path("smollm2-135m")
    assert f"wrote {export / 'merged'} (--to merged, from {run_dir / 'adapter'})" in printed["merged"]
    assert f"serve it: vllm serve {export / 'merged'}" in printed["merged"]
    assert f"serve it: python -m llama_cpp.server --model {export / 'merged-f16.gguf'}" in printed["gguf"]
    assert f"--model {base} --lora_path {export / 'lora.gguf'}" in printed["lora-gguf"]
    assert {path.name for path in (export / "merged").iterdir()} >= {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert sorted(path.name for path in export.iterdir()) == ["lora.gguf", "merged", "merged-f16.gguf"]  # no partials

    merged, original = gguf.GGUFReader(export / "merged-f16.gguf"), gguf.GGUFReader(base)
    assert merged.fields["general.type"].contents() == "model"
    assert merged.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_F16
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template", "llama.block_count"):
        assert merged.fields[key].contents() == original.fields[key].contents()
    tensors = {tensor.name: tensor for tensor in merged.tensors}
    assert [tensor.name for tensor in original.tensors] == list(tensors)
    for tensor in original.tensors:
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                                 "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")):  # the LoRA'd ones
            assert tensors[tensor.name].tensor_type == gguf.GGMLQuantizationType.F16
            assert list(tensors[tensor.name].shape) == list(tensor.shape)
        else:  # embeddings and norms: the base's bytes
            assert tensors[tensor.name].tensor_type == tensor.tensor_type
            assert np.array_equal(tensors[tensor.name].data, tensor.data)
    lora = gguf.GGUFReader(export / "lora.gguf")
    assert (lora.fields["general.type"].contents(), lora.fields["adapter.type"].contents()) == ("adapter", "lora")


def test_the_merged_directory_generates_the_policys_greedy_tokens(exported, policy_greedy):
    import torch
    from transformers import AutoModelForCausalLM

    run_dir, _ = exported
    tokenizer, prompts = policy_greedy
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "export" / "merged", dtype=torch.float32).eval()
    for ids, new, logprobs in prompts:
        merged_new, merged_logprobs = greedy(merged, ids)
        assert merged_new == new, (tokenizer.decode(new), tokenizer.decode(merged_new))
        assert np.abs(merged_logprobs - logprobs).max() < MERGED_TOL


@pytest.mark.parametrize("kind", ["gguf", "lora-gguf"])
def test_llama_cpp_runs_each_gguf_export_as_the_policy(exported, policy_greedy, kind):
    from seal_lite.engines.model_sources import gguf_path

    run_dir, _ = exported
    _, prompts = policy_greedy
    export = run_dir / "export"
    gguf, lora = ((export / "merged-f16.gguf", None) if kind == "gguf" else
                  (gguf_path("smollm2-135m"), export / "lora.gguf"))
    stats = agreement(prompts, llama_cpp_logprobs(gguf, prompts, lora))
    print(f"\n{kind}: {stats}")
    assert stats["argmax"] >= ARGMAX_MIN and stats["worst_gap"] <= NEAR_TIE, stats
    assert stats["mean"] <= MEAN_TOL and stats["kl"] <= KL_TOL, stats


def test_without_the_adapter_llama_cpp_fails_the_same_bounds(policy_greedy):
    """The control: the bounds above tell the exported policy from its base model."""
    from seal_lite.engines.model_sources import gguf_path

    _, prompts = policy_greedy
    stats = agreement(prompts, llama_cpp_logprobs(gguf_path("smollm2-135m"), prompts))
    print(f"\nbase GGUF, no adapter: {stats}")
    assert stats["argmax"] < ARGMAX_MIN and stats["worst_gap"] > NEAR_TIE, stats
    assert stats["mean"] > 2 * MEAN_TOL and stats["kl"] > 3 * KL_TOL, stats


def test_a_second_export_to_the_same_place_needs_overwrite(exported):
    run_dir, _ = exported
    target = run_dir / "export" / "lora.gguf"
    before = target.read_bytes()
    refused = CliRunner().invoke(main, ["export", str(run_dir), "--to", "lora-gguf"])
    assert refused.exit_code == 1 and "already exists; choose another --output or pass --overwrite" in refused.output
    again = CliRunner().invoke(main, ["export", str(run_dir), "--to", "lora-gguf", "--overwrite"])
    assert again.exit_code == 0 and target.read_bytes() == before  # the same adapter, the same bytes
