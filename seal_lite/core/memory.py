"""How much memory a policy needs on its device, from its config alone: what stays (weights, LoRA with its Adam
state) and what one generate call adds, so that every call can be cut to fit the card (``rollout_token_budget``).

One generate call over B left-padded rows of width W, making up to N new tokens each, holds at its peak:

* the KV cache: B x (W + N) x layers x 2 x kv_heads x head_dim, in the compute dtype;
* Unsloth only: a second copy of it at the first decode step (its paged decode buffers are filled from the
  prefill cache: unsloth/models/_decode_graphs.py, ``alloc_decode_buffers``);
* the padded prefill's attention mask, B x W x W, for the whole prefill: bool on transformers' path, 16-bit on
  Unsloth's (unsloth/models/llama.py builds it with ``_prepare_4d_causal_attention_mask_for_sdpa``);
* a few hidden-state-sized tensors for the whole prefill: ``HIDDEN_COPIES`` x B x W x hidden;
* then, in each layer, the larger of its attention's and its MLP's transients:
  - attention, transformers: the additive mask torch's SDPA makes from the bool one, B x W x W in the compute dtype;
  - attention, Unsloth (unsloth/utils/attention_dispatch.py): a bool keep mask made from the 16-bit one; for
    cuDNN attention, every tensor padded by 1 to 128 positions (``_cudnn_length_bucketed_sdpa``): a padded bool
    mask and the additive mask SDPA makes of it; and eight query-sized tensors, B x W x heads x head_dim (the
    query after RoPE, query, keys and values repeated to every head made contiguous, the three padded, the output);
  - MLP: ``MLP_COPIES`` x B x W x intermediate (transformers: act(gate), up and their product; Unsloth: gate, up
    and their product, and two hidden-sized tensors, the down projection's output and the residual beside it);
    through peft's LoRA layers (the peft backends' policy: its LoRA weights are fp32) the up projection holds more:
    act(gate) and its own output in the compute dtype, LoRA B's output and its scaled copy in fp32, and the input
    cast to fp32 (peft/tuners/lora/bnb.py, ``Linear4bit.forward``), B x W x (intermediate x (2 x dtype + 8) + hidden
    x 4) bytes;
* Unsloth only: one projection weight dequantized from 4 bits (its ``fast_dequantize`` scratch);
* the last position's logits, B x vocab in fp32.

Unsloth's terms are read off CUDA's allocator history of real generate calls on an H200 (every live block at the
peak, by the code that allocated it: benchmarks/gpu_memory_trace.py, benchmarks/results/gpu-check-h200/); the
model then gave 0.96-1.11 of the measured peaks (benchmarks/RESULTS.md). With peft's LoRA terms it gave 0.994 of a
full-depth call that fitted its card and more than the cap for the two that did not (``scripts/gpu_check.py``'s fit
checks). transformers' path, bare and through the LoRA, runs on a CPU too, where tests/real/test_memory.py checks
the whole model against measured peaks in fp32 (benchmarks/memory_model.py). Pure arithmetic, no torch: the
recipes' budgets and docs/gpu.md's table come from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30
MLP_COPIES = 3
# The engines: "unsloth"; "peft", transformers generate through peft's LoRA layers (the peft backends' rollouts, an
# evaluation with an adapter); "transformers", a bare model (a base-model evaluation)
HIDDEN_COPIES = {"unsloth": 3, "peft": 4, "transformers": 4}  # Unsloth: embeddings' output, residual, normed input
CUDNN_BUCKET = 128  # Unsloth pads cuDNN attention's sequence by 1 to this many positions (UNSLOTH_SDPA_CUDNN_BUCKET)
CUDA_CONTEXT = 0.6 * GIB  # the CUDA context and the kernels' workspaces (an estimate, not measured here)
NF4_BYTES = 0.5 + 0.127 / 8  # 4 bits per weight, plus double-quantized block scales (~0.127 bits)


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that its memory depends on (a transformers config's fields)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config) -> Shape:
        """From a transformers config object or its config.json as a dict."""
        get = config.get if isinstance(config, dict) else lambda name, default=None: getattr(config, name, default)
        heads = get("num_attention_heads")
        return cls(layers=get("num_hidden_layers"), hidden=get("hidden_size"), intermediate=get("intermediate_size"),
                   heads=heads, kv_heads=get("num_key_value_heads") or heads,
                   head_dim=get("head_dim") or get("hidden_size") // heads, vocab=get("vocab_size"),
                   tied_embeddings=bool(get("tie_word_embeddings", False)))

    def linear_params(self) -> int:
        """Weights of the decoder blocks' projections (what 4-bit quantizes and LoRA adapts)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, o; k, v
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """One token's keys and values in every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes

    def lora_params(self, rank: int) -> int:
        """LoRA on every projection (q, k, v, o, gate, up, down): rank x (in + out) each."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = rank * ((self.hidden + q_out) * 2 + (self.hidden + kv_out) * 2
                            + (self.hidden + self.intermediate) * 3)
        return self.layers * per_layer


# Shapes of the GPU recipes' models (their config.json), so budgets are computed without the hub.
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-3B-Instruct": Shape(36, 2048, 11008, 16, 2, 128, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": Shape(28, 3584, 18944, 28, 4, 128, 152064, False),
    "Team-ACE/ToolACE-2-Llama-3.1-8B": Shape(32, 4096, 14336, 32, 8, 128, 128256, False),  # Llama-3.1-8B's
}


def resident_bytes(shape: Shape, dtype_bytes: int, quantized: bool, lora_rank: int) -> int:
    """What stays for the whole run: the weights (projections in NF4 when quantized, embeddings and LM head in the
    compute dtype), and the LoRA weights in fp32 with their gradients and Adam's two moments (16 bytes each)."""
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2) * dtype_bytes
    projections = shape.linear_params() * (NF4_BYTES if quantized else dtype_bytes)
    return int(embeddings + projections + 16 * shape.lora_params(lora_rank))


def generate_bytes(shape: Shape, rows: int, width: int, new_tokens: int, dtype_bytes: int, engine: str) -> dict:
    """The peak one generate call adds, by term (bytes): ``rows`` left-padded to ``width`` prompt tokens, each
    making up to ``new_tokens``. ``engine``: "unsloth", "peft" or "transformers" (``HIDDEN_COPIES``)."""
    kv = rows * (width + new_tokens) * shape.kv_bytes_per_token(dtype_bytes)
    hidden = rows * width * shape.hidden * dtype_bytes
    hidden_states = HIDDEN_COPIES[engine] * hidden
    mlp = MLP_COPIES * rows * width * shape.intermediate * dtype_bytes
    if engine == "unsloth":
        padded = width + CUDNN_BUCKET - width % CUDNN_BUCKET
        query = rows * padded * shape.heads * shape.head_dim * dtype_bytes
        return {"kv_cache": kv, "kv_copy": kv, "mask": 2 * rows * width * width, "hidden": hidden_states,
                "attention": rows * width * width + 3 * rows * padded * padded + 8 * query,
                "mlp": mlp + 2 * hidden, "dequantized": shape.intermediate * shape.hidden * dtype_bytes,
                "logits": rows * shape.vocab * 4}
    if engine == "peft":
        cast = 4 if dtype_bytes < 4 else 0  # the input to LoRA A, unless it is fp32 already
        mlp = rows * width * (shape.intermediate * (2 * dtype_bytes + 8) + shape.hidden * cast)
    return {"kv_cache": kv, "kv_copy": 0, "mask": rows * width * width, "hidden": hidden_states,
            "attention": rows * width * width * dtype_bytes, "mlp": mlp, "dequantized": 0,
            "logits": rows * shape.vocab * 4}


def generate_peak(shape: Shape, rows: int, width: int, new_tokens: int, dtype_bytes: int, engine: str) -> int:
    """The peak a generate call adds: the prefill's (its KV cache, mask and hidden states, with one layer's
    attention or MLP transients, whichever is larger), or at the first decode step the cache with Unsloth's copy."""
    terms = generate_bytes(shape, rows, width, new_tokens, dtype_bytes, engine)
    always = terms["kv_cache"] + terms["dequantized"] + terms["logits"]
    prefill = always + terms["mask"] + terms["hidden"] + max(terms["attention"], terms["mlp"])
    first_decode = always + terms["kv_copy"]
    return max(prefill, first_decode)


def rollout_token_budget(shape: Shape, card_bytes: float, max_context: int, new_tokens: int, dtype_bytes: int,
                         engine: str, quantized: bool, lora_rank: int, headroom: float = 0.1) -> int:
    """The most padded tokens, rows x (width + new tokens), that one generate call may hold on a card of
    ``card_bytes`` with ``headroom`` of it left free, when every row is as wide as the context allows (the mask
    grows with width x width, so narrower rows fit at least as many tokens). 0: not even one row fits."""
    free = card_bytes * (1 - headroom) - CUDA_CONTEXT - resident_bytes(shape, dtype_bytes, quantized, lora_rank)
    width = max_context - new_tokens
    fixed = generate_peak(shape, 0, width, new_tokens, dtype_bytes, engine)  # whatever the rows: a dequantized weight
    per_row = generate_peak(shape, 1, width, new_tokens, dtype_bytes, engine) - fixed
    return max(0, math.floor((free - fixed) / per_row)) * max_context


VLLM_ACTIVATIONS = 1.0 * GIB  # vLLM's own activations and sampler workspace inside its share (an estimate)


def vllm_cache_tokens(shape: Shape, card_bytes: float, share: float, dtype_bytes: int, quantized: bool,
                      lora_rank: int) -> int:
    """Tokens of KV cache the vLLM rollout engine holds on a card of ``card_bytes`` when it takes ``share`` of it
    (``rollout.vllm_memory``): its share less its copy of the weights (NF4 when the policy is 4-bit), its LoRA slot
    and ``VLLM_ACTIVATIONS``. 0: its weights alone do not fit its share."""
    weights = resident_bytes(shape, dtype_bytes, quantized, 0) + shape.lora_params(lora_rank) * dtype_bytes
    free = card_bytes * share - weights - VLLM_ACTIVATIONS
    return max(0, math.floor(free / shape.kv_bytes_per_token(dtype_bytes)))


def vllm_share(shape: Shape, card_bytes: float, dtype_bytes: int, quantized: bool, lora_rank: int,
               headroom: float = 0.1) -> float:
    """The largest ``rollout.vllm_memory`` that leaves the trainer's resident memory, the CUDA context and
    ``headroom`` of the card free during rollouts (during the update vLLM sleeps: its KV cache is freed and its
    weights go to host memory, so the update has the card as without vLLM)."""
    trainer = resident_bytes(shape, dtype_bytes, quantized, lora_rank) + CUDA_CONTEXT
    return max(0.0, 1 - headroom - trainer / card_bytes)


def paged_bytes(shape: Shape, pool_tokens: int, batch_tokens: int, dtype_bytes: int) -> dict:
    """The peak of transformers' continuous batching on paged|sdpa (``rollout.backend: paged``), by term (bytes): a
    KV pool of ``pool_tokens`` and one forward pass of ``batch_tokens`` queries through peft's LoRA layers. Its
    scheduler lets a pass read at most the whole pool, and torch's SDPA then attends every query to every key read
    (transformers/integrations/sdpa_paged.py): the keys and values read are gathered out of the pool, repeated to
    every attention head, and masked by a ``batch_tokens`` x keys mask in the compute dtype (flash attention needs
    neither: this is the bound for cards without it, the T4 included). The logits are the last position's of
    each row, at most one per query."""
    pool = pool_tokens * shape.kv_bytes_per_token(dtype_bytes)
    per_key = 2 * (shape.kv_heads + shape.heads) * shape.head_dim * dtype_bytes  # gathered, then repeated
    terms = generate_bytes(shape, 1, batch_tokens, 0, dtype_bytes, "peft")
    return {"kv_cache": pool, "mask": batch_tokens * pool_tokens * dtype_bytes, "keys": pool_tokens * per_key,
            "hidden": terms["hidden"], "mlp": terms["mlp"], "logits": batch_tokens * shape.vocab * 4}


def paged_live_rows(pool_tokens: int, max_context_tokens: int, rows_cap: int | None) -> int:
    """Episodes the paged engine lets play at once: as many as its KV pool of ``pool_tokens`` holds at the full
    context, at most ``rows_cap`` (rollout.generation_batch_size; None: no cap), at least one. More would not fit
    once they grow: transformers' scheduler then evicts some, and each evicted one is prefilled again whole."""
    rows = pool_tokens // max_context_tokens
    return max(1, rows if rows_cap is None else min(rows, rows_cap))


def paged_pool_tokens(shape: Shape, available_bytes: float, batch_tokens: int, dtype_bytes: int) -> int:
    """The largest KV pool, in tokens, whose ``paged_bytes`` peak fits in ``available_bytes`` (what the card has
    once the policy is loaded, less the headroom left free). 0: not even the forward pass fits."""
    fixed = sum(paged_bytes(shape, 0, batch_tokens, dtype_bytes).values())
    per_token = sum(paged_bytes(shape, 1, batch_tokens, dtype_bytes).values()) - fixed
    return max(0, math.floor((available_bytes - fixed) / per_token))
