"""Shared-prefix scoring: a group's trajectories scored with their common prefix computed once.

The G trajectories of a task share their prompt token for token (several thousand tokens of tool docs under the
official view), and often the first tokens of their answers. Scoring them one by one reads that prefix G times.
Here, per group of rows with the same prompt:

1. the longest common prefix is run once, with gradients, keeping each layer's keys and values;
2. each trajectory's suffix is run against those keys and values (a read-only cache in front of its own), so the
   gradient of every suffix flows into the prefix's keys and values, and from there into the prefix's layers;
3. logits are computed only at the positions whose next token is scored (a model token): environment tokens
   inside a completion, and the prompt, get none.

The result is the same function of the weights as one forward pass per trajectory (attention over
[prefix; suffix] with the suffix at positions s, s + 1, ...), so the log-probabilities and every gradient are
the same up to float summation order; ``tests/scripted/test_grpo_reference.py`` checks it. Nothing is detached.

Memory: the prefix's graph once (as one trajectory's would be), and the suffixes' graphs as memory allows. With
the model's gradient checkpointing (every GPU recipe) a suffix's graph is each decoder layer's input, a known size
(``held_bytes``): suffixes keep theirs for the backward pass while they add up to at most ``hold_bytes``
(``hold_budget``: half the free memory, the GPU's or the RAM). Any other suffix's forward pass and log-probs are one checkpointed
function, recomputed in the backward pass (one extra forward pass over its tokens), so the backward holds one such
suffix at a time; its decoder layers checkpoint themselves inside it (the cache is read-only, so a replayed layer
reads the same keys and values: ``_can_checkpoint_with_cache``; nested non-reentrant checkpoints). The LM head and
log-softmax are checkpointed per chunk of positions, so no vocabulary-wide logits outlive their chunk. The
prefix's keys and values are let go once the last suffix's backward has passed (``PrefixRelease``), before the
prefix's own backward. Memory thus stays what one trajectory per micro-batch needs, whatever G, plus at most
``hold_bytes``.

Model support: decoder-only models whose attention layers read the cache through ``past_key_values.update`` and
use full (not sliding-window) attention, without logit soft-capping: Llama, Qwen2, SmolLM2 and the like.
``supports(model)`` says whether a model qualifies; the trainer falls back to TRL's scoring otherwise.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

HEAD_CHUNK = 1024  # positions per LM-head chunk: bounds the vocabulary-wide logits held at once
HOLD_SHARE = 0.5  # of the GPU's free memory when scoring starts: what kept suffix graphs may take (``hold_budget``)


class PrefixLayer(DynamicLayer):
    """One layer's cache for a pass over a suffix: the prefix's keys and values, fixed, in front of the pass's own.

    ``update`` returns the concatenation without storing it, so a replayed layer (gradient checkpointing) sees
    the same cache, and an empty cache records the pass's own keys and values in ``own``: the prefix pass's are
    what the suffixes read."""

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
        super().__init__()
        self.prefix = None if keys is None else (keys, values)
        self.own: tuple[torch.Tensor, torch.Tensor] | None = None
        self.recording = keys is None
        self.is_initialized = True

    def stop_recording(self) -> None:
        """Forget the recorded keys and values, and record no more: a checkpointed prefix layer replayed in the
        backward pass would otherwise store its recomputed ones here until the whole backward pass ends."""
        self.own, self.recording = None, False

    def update(self, key_states, value_states, *args, **kwargs):
        if self.recording:
            self.own = (key_states, value_states)
        if self.prefix is None:
            return key_states, value_states
        keys, values = self.prefix
        return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)

    def get_seq_length(self) -> int:
        return 0 if self.prefix is None else self.prefix[0].shape[-2]


def prefix_cache(layers: int, prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Cache:
    """A cache for a pass: empty (the prefix pass records into it), or reading ``prefix``: each layer's keys and
    values, as the prefix pass recorded them."""
    if prefix is None:
        return Cache(layers=[PrefixLayer() for _ in range(layers)])
    return Cache(layers=[PrefixLayer(keys, values) for keys, values in prefix])


def split_point(sequences: list[list[int]]) -> int:
    """Tokens of the prefix pass for these sequences: one less than their longest common prefix, and at least one
    token short of the shortest, so every suffix starts with a shared token (whose logit predicts the first token
    that differs) and holds at least one token. 0: nothing to share (one sequence, or no common first token)."""
    if len(sequences) < 2:
        return 0
    shortest = min(len(sequence) for sequence in sequences)
    common = 0
    while common < shortest and all(sequence[common] == sequences[0][common] for sequence in sequences):
        common += 1
    return max(0, min(common, shortest) - 1)


def groups_of_rows(prompts: list[list[int]]) -> list[list[int]]:
    """Row indices grouped by identical prompt, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(row)
    return list(groups.values())


def decoder_and_head(model):
    """The decoder stack and the LM head of a (peft-wrapped) causal LM; LoRA layers live inside both."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def supports(model) -> bool:
    """Whether this model's attention and head allow shared-prefix scoring (see the module docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return False
    if getattr(config, "is_encoder_decoder", False) or not getattr(config, "is_causal", True):
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return set(layer_types) == {"full_attention"}


@contextlib.contextmanager
def cache_through_checkpointing(model):
    """Let gradient-checkpointed decoder layers keep the cache (transformers drops it by default, because a
    replayed layer would append to a cache twice; ``PrefixLayer`` is read-only, so the replay is exact)."""
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    before = [layer.__dict__.get("_can_checkpoint_with_cache") for layer in layers]  # None: the class's default
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer, value in zip(layers, before, strict=True):
            if value is None:
                del layer._can_checkpoint_with_cache
            else:
                layer._can_checkpoint_with_cache = value


class PrefixRelease:
    """Frees a prefix's keys and values once every suffix's backward pass has gone through them.

    ``prefix`` holds each layer's (keys, values) as the prefix pass produced them; the suffix passes read them
    through ``read``, an identity whose backward counts the suffixes per layer. When all ``suffixes`` have
    passed, the layer's entry is dropped: with gradient checkpointing nothing else holds those tensors (the
    prefix's own layers recompute theirs), so they are freed before the prefix's backward pass, where memory peaks
    (Qwen2.5-0.5B on a 4.9k-token prompt: 24 layers x (K, V) x 4,934 x 128 x 4 bytes = 0.12 GB). A gradient hook on
    the keys would fire too late: after the prefix's own attention of that layer, in the prefix's backward."""

    def __init__(self, prefix: list, suffixes: int):
        self.prefix, self.left = prefix, [suffixes] * len(prefix)

    def read(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [_Counted.apply(self, layer, keys, values) for layer, (keys, values) in enumerate(self.prefix)]

    def passed(self, layer: int) -> None:
        self.left[layer] -= 1
        if self.left[layer] == 0:
            self.prefix[layer] = None


class _Counted(torch.autograd.Function):
    """The identity on one layer's (keys, values); its backward tells the release that a suffix has passed."""

    @staticmethod
    def forward(ctx, release, layer, keys, values):
        ctx.release, ctx.layer = release, layer
        return keys.view_as(keys), values.view_as(values)

    @staticmethod
    def backward(ctx, keys_grad, values_grad):
        ctx.release.passed(ctx.layer)
        return None, None, keys_grad, values_grad


def head_logps(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool,
               entropy_grad: bool, recompute: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(hidden) / T)[targets] and the entropy of each row, in fp32 whatever the model's dtype, in
    chunks of ``HEAD_CHUNK`` positions, each chunk recomputed in the backward pass when ``recompute`` (its logits
    are then never kept)."""

    def chunk_logps(hidden_chunk, targets_chunk):
        # fp32 from the head's output on: in fp16 (a T4's policy) log-probs near -10 would be 0.008 apart
        logits = head(hidden_chunk).float()
        if temperature != 1.0:
            logits = logits / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        picked = logprobs.gather(-1, targets_chunk[:, None])[:, 0]
        if not entropy:
            return picked, None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            return picked, -(logprobs.exp() * logprobs).sum(-1)

    logps, entropies = [], []
    for start in range(0, len(targets), HEAD_CHUNK):
        part = (hidden[start : start + HEAD_CHUNK], targets[start : start + HEAD_CHUNK])
        logp, ent = checkpoint(chunk_logps, *part, use_reentrant=False) if recompute else chunk_logps(*part)
        logps.append(logp)
        entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if entropy else None
    return torch.cat(logps), torch.cat(entropies) if entropy else None


def hold_budget(device: torch.device) -> float:
    """Bytes of suffix graphs ``score_completions`` may keep instead of recomputing them: ``HOLD_SHARE`` of the free
    memory. On a GPU that counts what PyTorch's allocator holds but no tensor uses (after the rollouts, their KV
    cache: the driver sees it as taken, yet the suffixes' graphs would get it); on a CPU it is the RAM available. A
    graph is kept only under gradient checkpointing (the GPU recipes'), where it is each layer's input."""
    if device.type != "cuda":
        import psutil

        return HOLD_SHARE * psutil.virtual_memory().available
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return HOLD_SHARE * (free + cached)


def held_bytes(layers: int, hidden: int, tokens: int, element_size: int) -> int:
    """What a suffix's graph holds under gradient checkpointing: each decoder layer's input."""
    return layers * tokens * hidden * element_size


def score_completions(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int,
                      scored: torch.Tensor, temperature: float, entropy: bool = False,
                      entropy_grad: bool = False, hold_bytes: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (and entropies) of the completion tokens, shaped as TRL's: ``input_ids`` and
    ``attention_mask`` are (B, prompt + ``width``) with left-padded prompts and right-padded completions; the
    result is (B, ``width``), non-zero only where ``scored`` (B, ``width``) is true.

    Rows with the same prompt share a prefix pass (see the module docstring); a row alone in its group is one
    plain pass, with logits still only at its scored positions. With gradients and the model's gradient
    checkpointing, suffixes keep their graphs while they add up to at most ``hold_bytes`` (``held_bytes`` each);
    the others are recomputed in the backward pass. The result and every gradient are the same either way."""
    decoder, head = decoder_and_head(model)
    text_config = decoder.config.get_text_config()
    layers = text_config.num_hidden_layers
    grad = torch.is_grad_enabled()
    layer_checkpointing = grad and any(getattr(module, "gradient_checkpointing", False) and module.training
                                       for module in model.modules()
                                       if isinstance(module, GradientCheckpointingLayer))
    rows = []  # per row: its unpadded ids, and for each scored column the index of the token it predicts
    for row in range(input_ids.size(0)):
        real = attention_mask[row].bool()
        prompt_length = int(real[:-width].sum())
        completion_real = real[-width:]
        columns = torch.nonzero(completion_real & scored[row].bool())[:, 0]
        targets = prompt_length + torch.cumsum(completion_real.long(), 0)[columns] - 1
        assert prompt_length > 0 or not len(columns), "a scored first token needs a prompt token before it"
        rows.append((input_ids[row][real], columns, targets))

    values, entropy_values, flat_index = [], [], []

    def collect(row, columns, logp, ent):
        values.append(logp)
        entropy_values.append(ent)
        flat_index.append(row * width + columns)

    prompts = [ids[: int(attention_mask[row, :-width].sum())].tolist() for row, (ids, _, _) in enumerate(rows)]
    element_size = head.weight.element_size()  # the hidden states' dtype: the LM head is never quantized
    held = 0  # bytes of the suffix graphs kept for the backward pass so far
    with cache_through_checkpointing(model):
        for group in groups_of_rows(prompts):
            shared = split_point([rows[row][0].tolist() for row in group])
            prefix = None  # reads the prefix pass's keys and values, per layer, as its forward pass produced them
            if shared:
                recording = prefix_cache(layers)
                ids = rows[group[0]][0]  # its first shared + 1 tokens are every row's
                # positions inside the prefix whose next token is scored in some row (shared tokens: same target)
                positions = torch.unique(torch.cat([targets[targets <= shared] - 1 for _, _, targets in
                                                    (rows[row] for row in group)]))
                hidden = decoder(input_ids=ids[None, :shared], past_key_values=recording, use_cache=False)
                hidden = hidden.last_hidden_state
                suffixes = sum(bool((rows[row][2] > shared).any()) for row in group)
                release = PrefixRelease([layer.own for layer in recording.layers], suffixes if grad else 0)
                for layer in recording.layers:  # the checkpointed prefix layers keep this cache for their replay
                    layer.stop_recording()
                prefix = release.read if grad else lambda release=release: release.prefix
                logp, ent = head_logps(head, hidden[0, positions], ids[positions + 1], temperature, entropy,
                                       entropy_grad, recompute=grad)
                for row in group:
                    _, columns, targets = rows[row]
                    inside = targets <= shared
                    index = torch.searchsorted(positions, targets[inside] - 1)
                    collect(row, columns[inside], logp[index], None if ent is None else ent[index])
            for row in group:
                ids, columns, targets = rows[row]
                outside = targets > shared
                if not outside.any():
                    continue  # nothing scored after the prefix: no suffix pass
                suffix, local = ids[shared:], targets[outside] - 1 - shared

                def suffix_logps(suffix, local=local, prefix=prefix, recompute_head=layer_checkpointing):
                    cache = prefix_cache(layers, prefix()) if prefix is not None else None
                    with cache_through_checkpointing(model):  # also when the backward pass replays this
                        hidden = decoder(input_ids=suffix[None], past_key_values=cache, use_cache=False)
                    hidden = hidden.last_hidden_state
                    return head_logps(head, hidden[0, local], suffix[local + 1], temperature, entropy, entropy_grad,
                                      recompute=recompute_head)

                size = held_bytes(layers, text_config.hidden_size, len(suffix), element_size)
                if not grad:
                    logp, ent = suffix_logps(suffix)
                elif layer_checkpointing and held + size <= hold_bytes:  # its layers' inputs kept for the backward
                    held += size
                    logp, ent = suffix_logps(suffix)
                else:  # recomputed in the backward pass: one such suffix's graph at a time. ``suffix`` is passed,
                    # not closed over: torch stashes the RNG of the devices its tensor arguments are on, so the
                    # replay draws the same LoRA dropout masks on a GPU too (the CPU's RNG is always stashed)
                    logp, ent = checkpoint(suffix_logps, suffix, use_reentrant=False)
                collect(row, columns[outside], logp, ent)

    batch = input_ids.size(0)
    logps = _scatter(values, flat_index, batch, width, input_ids.device)
    if grad and not values:  # nothing scored: a zero that still reaches the trainable weights, for backward()
        logps = logps + sum((p * 0).sum() for p in model.parameters() if p.requires_grad)
    entropies = _scatter(entropy_values, flat_index, batch, width, input_ids.device) if entropy else None
    return logps, entropies


def _scatter(values, flat_index, batch, width, device) -> torch.Tensor:
    out = torch.zeros(batch * width, device=device)  # fp32, as ``head_logps`` computes them
    if values:
        out = out.index_put((torch.cat(flat_index),), torch.cat(values))
    return out.view(batch, width)
