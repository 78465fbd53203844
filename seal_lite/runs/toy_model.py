"""Random-weight models of a real architecture, with a tokenizer built here: no hub, no download.

A rehearsal (``seal-lite rehearse``) and the GPU scripts need a model of the shape a recipe trains without its
weights: what runs (dtype, 4-bit layers, attention, the engine, the update) does not depend on their values.
``local_tokenizer`` trains a byte-level BPE with Qwen2.5's special tokens and ChatML on the text of a few BFCL
tasks in about a second, so real multi-turn prompts tokenize to realistic lengths; ``random_model_dir`` saves a
random-init Qwen2 (or Llama) of a ``Shape`` beside it."""

from __future__ import annotations

import dataclasses
import json

from seal_lite.core.memory import Shape

# Qwen2.5's ChatML, without its tool block (the agent renders tools into the system message itself)
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Qwen2.5's special tokens, in its order: it pads with <|endoftext|>, which also ends a generation
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"]
TOKENIZER_TASKS = ["multi_turn_base_0", "multi_turn_base_1", "multi_turn_base_10", "multi_turn_base_12"]
TOY_VOCAB = 8192  # the local tokenizer's vocabulary: a toy model's embedding and head stay small


def local_tokenizer(vocab_size: int = TOY_VOCAB):
    """A byte-level BPE tokenizer with Qwen2.5's special tokens and ChatML, trained in about a second on the
    text of a few BFCL tasks: real multi-turn prompts tokenize to realistic lengths without any download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from seal_lite.envs.bfcl import load_tasks

    texts = [json.dumps(task.functions) + json.dumps(task.turns) for task in load_tasks(TOKENIZER_TASKS)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=QWEN_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHATML
    return fast


def shrunk(shape: Shape, layers: int = 2, kv_heads: int = 2, head_dim: int = 16) -> Shape:
    """``shape`` at toy size: ``layers`` layers, ``kv_heads`` key-value heads of ``head_dim`` and as many query
    heads per key-value head as the real model (its grouped attention, which the paged engine repeats per head),
    the local tokenizer's vocabulary, tied embeddings as the real model's."""
    heads = kv_heads * (shape.heads // shape.kv_heads)
    hidden = heads * head_dim
    return dataclasses.replace(shape, layers=layers, hidden=hidden, intermediate=2 * hidden, heads=heads,
                               kv_heads=kv_heads, head_dim=head_dim, vocab=TOY_VOCAB)


def random_model_dir(shape: Shape, directory: str, family: str = "qwen2") -> str:
    """A random-init Qwen2 model of ``shape`` (bf16, initialised on the GPU where there is one) with the local
    tokenizer and Qwen2.5-Instruct's generation config (stops at <|im_end|> and <|endoftext|>, sampling defaults
    that seal-lite must ignore), saved to ``directory``. ``family`` llama: a Llama of the same shape instead."""
    import gc

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    tokenizer = local_tokenizer()
    specials = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIALS}
    config = config_class(
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate,
        head_dim=shape.head_dim, tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=32768,
        bos_token_id=specials["<|endoftext|>"], eos_token_id=specials["<|im_end|>"],
        pad_token_id=specials["<|endoftext|>"],
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialised in bf16: 7B in fp32 (28 GB) would not fit a 24 GB cap
    try:
        with torch.device(device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config = GenerationConfig(
        eos_token_id=[specials["<|im_end|>"], specials["<|endoftext|>"]], pad_token_id=specials["<|endoftext|>"],
        do_sample=True, repetition_penalty=1.05, temperature=0.7, top_k=20, top_p=0.8)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return directory
