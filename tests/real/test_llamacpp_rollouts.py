"""The llama.cpp rollout backend with SmolLM2's real GGUF: prompt read once per task, each trajectory's cache
kept between its calls, exact sampling log-probs, and the policy's LoRA swapped in place."""

from pathlib import Path

import numpy as np
import pytest
from llama_cpp import Llama

from seal_lite.core.interface import TrainingInterface, render_view
from seal_lite.engines.llamacpp import LlamaCppGenerator
from seal_lite.engines.model_sources import gguf_path
from seal_lite.envs.bfcl import load_tasks

SMOL = str(gguf_path("smollm2-135m"))


@pytest.fixture(scope="module")
def prompt(smol_tokenizer):
    task = load_tasks(["multi_turn_base_1"])[0]
    view = render_view(task.visible_functions(0), TrainingInterface(True, True, (), "signatures"))
    messages = [{"role": "system", "content": view.system_prompt}, {"role": "user", "content": task.user_message(0)}]
    text = smol_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return smol_tokenizer(text, add_special_tokens=False)["input_ids"]


def _count_reads(generator: LlamaCppGenerator) -> list[int]:
    """Wrap every context's eval to count the tokens it reads (prompt and generated alike)."""
    reads = [0]
    for llm in generator.contexts:
        original = llm.eval

        def counting(tokens, original=original):
            reads[0] += len(tokens)
            return original(tokens)

        llm.eval = counting
    return reads


def test_group_reads_its_prompt_once_and_each_trajectory_only_what_is_new(smol_tokenizer, prompt):
    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2, seed=1)
    try:
        generator.generate([prompt[:8]] * 4, 1, 1.0)  # create the four contexts
        reads = _count_reads(generator)
        first = generator.generate([prompt] * 4, 12, 1.0)
        generated = sum(len(ids) for ids in first)
        # one context reads the prompt, the three others copy its cache; each re-reads only its last token
        # and reads its own generated tokens (all but the last, which is not fed back)
        assert reads[0] == len(prompt) + 4 + generated - 4 - 8  # minus the 8 tokens cached by the warm-up
        reads[0] = 0
        user = smol_tokenizer("<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)["input_ids"]
        follow = [prompt + ids + user for ids in first]
        second = generator.generate(list(reversed(follow)), 12, 1.0)  # order shuffled: matched by prefix
        assert reads[0] == sum(len(user) + 1 for _ in follow) + sum(len(ids) - 1 for ids in second)
    finally:
        generator.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_llama_cpps_log_softmax_at_the_temperature(smol_tokenizer, prompt, temperature):
    import llama_cpp

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2, seed=3)
    # the same reads in the same batches (llama.cpp's numbers depend on them), then a plain log-softmax
    reference = Llama(SMOL, n_ctx=2048, n_threads=2, flash_attn=True, verbose=False)
    try:
        [ids] = generator.generate([prompt], 16, temperature)
        [logprobs] = generator.sampled_logprobs
        rows = []
        for chunk in [prompt[:-1], prompt[-1:], *([token] for token in ids[:-1])]:
            reference.eval(chunk)
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(reference.ctx, -1),
                                              shape=(reference.n_vocab(),)).copy())
        logits = np.asarray(rows[1:], dtype=np.float64)
        scaled = logits / temperature
        expected = scaled - scaled.max(-1, keepdims=True)
        expected -= np.log(np.exp(expected).sum(-1, keepdims=True))
        assert len(logprobs) == len(ids) > 1
        assert np.allclose(logprobs, expected[np.arange(len(ids)), ids], atol=1e-4)
    finally:
        generator.close()
        reference.close()


def test_load_adapter_changes_the_policy_in_place_and_drops_stale_caches(smol_tokenizer, prompt, tmp_path):
    import torch
    from peft import get_peft_model

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.gguf_lora import export_lora_gguf
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy

    recipe = load_recipe(None, {"policy.dtype": "float32"})
    policy = load_policy(resolve_model("smollm2-135m"), recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.1)
    adapter = export_lora_gguf(model, Path(SMOL), tmp_path / "lora.gguf")

    def first_token_logprobs(generator):
        generator.rng = np.random.default_rng(0)
        generator.generate([prompt], 4, 1.0)
        return generator.sampled_logprobs[0]

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2)
    try:
        plain = first_token_logprobs(generator)
        generator.load_adapter(str(adapter))
        assert all(llm.n_tokens == 0 for llm in generator.contexts)  # computed with the old weights
        tuned = first_token_logprobs(generator)
        generator.load_adapter(None)
        again = first_token_logprobs(generator)
    finally:
        generator.close()
    assert plain != tuned
    assert np.allclose(plain, again, atol=1e-4)



def test_every_llama_cpp_reads_prompts_with_the_threads_it_was_given(smol_tokenizer):
    """llama-cpp-python reads prompts with the machine's whole CPU count unless told (2 here): a process pinned to
    fewer cores (taskset, a cgroup, one core per process of a several-process run) would oversubscribe them."""
    from seal_lite.engines.serving import InProcessModel, LocalServer

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=512, n_threads=1)
    generator.generate([[1, 2, 3]], 1, 0.0)
    (llm,) = generator.contexts
    assert (llm.context_params.n_threads, llm.context_params.n_threads_batch) == (1, 1)
    assert InProcessModel(SMOL, n_ctx=512, n_threads=1).llm.context_params.n_threads_batch == 1
    with LocalServer(SMOL, n_ctx=512, n_threads=1) as server:
        argv = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--n_threads_batch") + 1] == "1"
