"""The LoRA exported to GGUF does in llama.cpp what peft does in torch.

Real parts: the pip GGUF of SmolLM2 (llama architecture, Q4_1) and the safetensors model converted from it, a peft
LoRA (r=8) whose B matrices are seeded random values, llama.cpp loading the exported adapter on the original GGUF.

Tolerances, from measurement on a 41-token prompt (top-10 = the torch model's 10 most likely tokens per position):
llama.cpp runs the Q4_1 weights against 8-bit quantized activations, so even without any LoRA its log-probs differ
from the de-quantized fp32 torch model by mean |Δ| 0.127 nat over the top 10 (max 0.73, mean KL 0.005, argmax
agrees everywhere). With the exported adapter the difference stays at that floor (0.12-0.14, max ≤ 1.1, KL ≤ 0.011,
argmax ≥ 95 %); llama.cpp without the adapter, or with q/k LoRA B left unpermuted, is off by 1.2-1.3 nat (KL ≥ 0.38),
and an adapter at half its scale (alpha/r wrong by 2x) by 0.5-0.8.
The bounds below sit between the two. Qwen2.5-Coder-0.5B (qwen2: no q/k permutation; Q5_0/Q4_K/Q6_K) measured
0.069 with the adapter (floor 0.055) and 0.86 without.
"""

from __future__ import annotations

import numpy as np
import pytest

from seal_lite.engines.gguf_lora import (
    BaseGGUF,
    GGUFLoraError,
    export_lora_gguf,
    export_merged_gguf,
    lora_tensors,
    permute_rows,
)
from seal_lite.engines.model_sources import ModelSourceError, gguf_path, resolve_model

PROMPT = (
    "The quick brown fox jumps over the lazy dog. In Python, a list comprehension builds a new list from an "
    "iterable, for example squares = [x * x for x in range(10)]."
)
TOP_K = 10
MEAN_TOL = 0.25  # mean |Δ log-prob| over the top 10 (floor 0.06-0.13, wrong or missing adapter ≥ 0.86)
MAX_TOL = 2.0  # worst single top-10 log-prob (measured ≤ 1.1; missing adapter 5-13)
KL_TOL = 0.03  # mean KL(torch ‖ llama.cpp) per position (measured ≤ 0.011; missing adapter ≥ 0.1)
ARGMAX_MIN = 0.9  # share of positions where both pick the same next token (measured ≥ 0.95)


def lora_model(model_dir: str, targets, sigma: float, seed: int = 0, **config):
    """A fp32 peft LoRA (r=8, alpha=16) whose B matrices are N(0, sigma²), so it really changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets, **config)
    peft_model = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * sigma)
    return peft_model.eval()


def torch_logprobs(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), -1).numpy()


def llama_logprobs(gguf, ids: list[int], lora_path=None) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(str(gguf), lora_path=str(lora_path) if lora_path else None, n_ctx=512, n_threads=1,
                logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def compare(llama: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    top = np.argsort(-reference, -1)[:, :TOP_K]
    delta = np.abs(np.take_along_axis(llama, top, -1) - np.take_along_axis(reference, top, -1))
    kl = (np.exp(reference) * (reference - llama)).sum(-1)
    return {
        "mean": float(delta.mean()), "max": float(delta.max()), "kl": float(kl.mean()),
        "argmax": float((llama.argmax(-1) == reference.argmax(-1)).mean()),
    }


def _fmt(stats: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4f}" for key, value in stats.items())


@pytest.fixture(scope="module")
def base_llama_logprobs():
    """llama.cpp without adapter, once per model."""
    cache = {}

    def get(name: str, ids: list[int]) -> np.ndarray:
        if name not in cache:
            cache[name] = llama_logprobs(gguf_path(name), ids)
        return cache[name]

    return get


def _model_or_skip(name: str) -> tuple:
    try:
        return gguf_path(name), resolve_model(name)
    except ModelSourceError as error:
        pytest.skip(str(error))


@pytest.mark.parametrize("name, targets, sigma", [
    ("smollm2-135m", "all-linear", 0.1),
    ("smollm2-135m", ["q_proj", "k_proj"], 0.3),  # only the rotary-permuted weights: catches a missing permute
    ("qwen2.5-coder-0.5b", "all-linear", 0.02),  # larger model, smaller B moves it as far (σ 0.1 wrecks it)
], ids=["smollm2-all-linear", "smollm2-q-k-only", "qwen2.5-coder-0.5b-all-linear"])
def test_llama_cpp_with_exported_adapter_matches_torch(tmp_path, base_llama_logprobs, name, targets, sigma):
    from transformers import AutoTokenizer

    gguf, model_dir = _model_or_skip(name)
    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"]
    model = lora_model(model_dir, targets, sigma)
    adapter = export_lora_gguf(model, gguf, tmp_path / "adapter.gguf")

    reference = torch_logprobs(model, ids)
    with model.disable_adapter():
        reference_base = torch_logprobs(model, ids)
    with_adapter = compare(llama_logprobs(gguf, ids, adapter), reference)
    base = base_llama_logprobs(name, ids)
    without_adapter = compare(base, reference)
    floor = compare(base, reference_base)  # quantization alone, no LoRA anywhere
    report = f"with adapter: {_fmt(with_adapter)}\nwithout: {_fmt(without_adapter)}\nno-LoRA floor: {_fmt(floor)}"
    print(f"\n{name} {targets}:\n{report}")

    assert with_adapter["mean"] < MEAN_TOL and with_adapter["max"] < MAX_TOL, report
    assert with_adapter["kl"] < KL_TOL and with_adapter["argmax"] >= ARGMAX_MIN, report
    # The adapter must matter: llama.cpp without it is far off the LoRA'd torch model (measured 6-12x).
    assert without_adapter["mean"] > max(4 * with_adapter["mean"], MEAN_TOL), report
    assert without_adapter["kl"] > 4 * with_adapter["kl"], report


@pytest.mark.parametrize("name, sigma, weight_type", [
    ("smollm2-135m", 0.1, "f16"),
    ("smollm2-135m", 0.1, "q8_0"),
    ("qwen2.5-coder-0.5b", 0.02, "f16"),  # qwen2: no q/k permutation, Q5_0/Q4_K/Q6_K matrices de-quantized
], ids=["smollm2-f16", "smollm2-q8_0", "qwen2.5-coder-0.5b-f16"])
def test_the_merged_gguf_runs_in_llama_cpp_as_the_lora_does_in_torch(tmp_path, name, sigma, weight_type):
    """`seal-lite export --to gguf`: the base GGUF with W + (alpha/r)·B·A in place of each LoRA'd matrix, and no
    adapter file, stays within the bounds the adapter file is held to. Measured: SmolLM2 f16 mean 0.037 (KL
    0.0005), q8_0 0.19 (KL 0.013, argmax 93 %: 8-bit weights on top of the base's Q4_1 rounding), Qwen2.5-Coder
    f16 0.016, below the no-LoRA floor: f16 matrices round less than the base's own Q5_0 or Q4_K ones."""
    from transformers import AutoTokenizer

    gguf, model_dir = _model_or_skip(name)
    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"]
    model = lora_model(model_dir, "all-linear", sigma)
    merged = export_merged_gguf(model, gguf, tmp_path / "merged.gguf", weight_type)
    stats = compare(llama_logprobs(merged, ids), torch_logprobs(model, ids))
    print(f"\n{name} merged as {weight_type}: {_fmt(stats)}")
    assert stats["mean"] < MEAN_TOL and stats["max"] < MAX_TOL, _fmt(stats)
    assert stats["kl"] < KL_TOL and stats["argmax"] >= ARGMAX_MIN, _fmt(stats)


def test_adapter_file_has_what_llama_cpp_reads(tmp_path, smol_dir):
    import gguf

    model = lora_model(smol_dir, "all-linear", 0.1)
    out = tmp_path / "adapter.gguf"
    out.write_bytes(b"an older adapter")
    assert export_lora_gguf(model, gguf_path("smollm2-135m"), out) == out
    assert [path.name for path in tmp_path.iterdir()] == ["adapter.gguf"]  # replaced, no partial file left

    reader = gguf.GGUFReader(out)
    fields = {key: reader.fields[key].contents() for key in
              ("general.architecture", "general.type", "adapter.type", "adapter.lora.alpha")}
    assert fields == {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
                      "adapter.lora.alpha": 16.0}
    tensors = {tensor.name: tuple(int(n) for n in tensor.shape) for tensor in reader.tensors}
    assert len(tensors) == 30 * 7 * 2  # 30 blocks x (q, k, v, o, gate, up, down) x (A, B)
    assert tensors["blk.0.attn_k.weight.lora_a"] == (576, 8)  # ggml order: A is [r, in] in torch
    assert tensors["blk.0.attn_k.weight.lora_b"] == (8, 192)  # B is [out, r]; 3 KV heads of 64
    assert tensors["blk.29.ffn_down.weight.lora_b"] == (8, 576)


def test_module_without_gguf_tensor_is_named(tmp_path, smol_dir):
    # SmolLM2 ties lm_head to the embedding: its GGUF has no output.weight for a LoRA on lm_head to attach to.
    model = lora_model(smol_dir, ["q_proj", "lm_head"], 0.1)
    with pytest.raises(GGUFLoraError, match=r"lm_head .*output\.weight"):
        export_lora_gguf(model, gguf_path("smollm2-135m"), tmp_path / "adapter.gguf")
    assert list(tmp_path.iterdir()) == []


def test_per_module_scaling_and_permutation_against_plain_formulas(tiny_model_dir):
    """rank_pattern gives modules different alpha/r: the file's single alpha plus folded B must reproduce each."""
    import torch
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    model = lora_model(tiny_model_dir, "all-linear", 0.1, rank_pattern={"q_proj": 4}, alpha_pattern={"v_proj": 4})
    base = BaseGGUF("llama", block_count=2, head_count=4, head_count_kv=2, shapes={})
    for block in range(2):
        for gguf_name, shape in [("attn_q", (32, 32)), ("attn_k", (32, 16)), ("attn_v", (32, 16)),
                                 ("attn_output", (32, 32)), ("ffn_gate", (32, 64)), ("ffn_up", (32, 64)),
                                 ("ffn_down", (64, 32))]:
            base.shapes[f"blk.{block}.{gguf_name}.weight"] = shape
    tensors, alpha = lora_tensors(model, base)
    tensors = dict(tensors)
    # transformers' GGUF loader undoes llama.cpp's permutation: an independent inverse of permute_rows
    unpermute = LlamaTensorProcessor()._reverse_permute_weights
    modules = dict(model.named_modules())
    for block in range(2):
        for hf, gguf_name, heads in [("self_attn.q_proj", "attn_q", 4), ("self_attn.k_proj", "attn_k", 2),
                                     ("self_attn.v_proj", "attn_v", None), ("mlp.down_proj", "ffn_down", None)]:
            module = modules[f"base_model.model.model.layers.{block}.{hf}"]
            a, b = module.lora_A["default"].weight.detach(), module.lora_B["default"].weight.detach()
            expected = (module.scaling["default"] * b @ a).numpy()
            name = f"blk.{block}.{gguf_name}.weight"
            file_a, file_b = tensors[name + ".lora_a"], tensors[name + ".lora_b"]
            delta = (alpha / file_b.shape[1]) * file_b @ file_a  # llama.cpp: alpha / r, r from B
            if heads:
                delta = unpermute(delta, 4, heads)
            np.testing.assert_allclose(delta, expected, rtol=1e-5, atol=1e-7)
    assert torch.equal(torch.from_numpy(permute_rows(np.arange(8.0)[:, None], 1))[:, 0],
                       torch.tensor([0.0, 4, 1, 5, 2, 6, 3, 7]))
