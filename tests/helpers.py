"""Helpers the tests import (``from tests.helpers import ...``): scripted policies and the text a model writes.

Fixtures stay in tests/conftest.py; scaffolding that benchmarks share is in tests/support/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from seal_lite.core.calls import parse_calls

ROOT = Path(__file__).resolve().parent.parent  # the repository
# the first line of a script that a test runs in another Python process and that imports tests.support
IMPORT_TESTS = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


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
    """For the tasks in ``learnable`` the first half of each group answers with the ground truth and the rest with
    nothing; the tasks in ``mastered`` are solved in every episode; every other task fails in all episodes.
    ``played`` lists the tasks whose groups it started, in the order their sequences came."""

    def __init__(self, tokenizer, tasks, learnable, mastered=()):
        self.tokenizer, self.tasks, self.learnable, self.mastered = tokenizer, tasks, set(learnable), set(mastered)
        self.played: list[str] = []

    def generate(self, batch, max_new_tokens, temperature):
        texts = [self.tokenizer.decode(ids) for ids in batch]
        tasks = [next(t for t in self.tasks if t.user_message(0) in text) for text in texts]
        out = []
        for text, task in zip(texts, tasks, strict=True):
            first = text.count("<|im_start|>assistant\n") == 1  # the episode's first message
            position, size = tasks[: len(out)].count(task), tasks.count(task)  # within its group in this batch
            if first and position == 0:
                self.played.append(task.id)
            right = first and (task.id in self.mastered or task.id in self.learnable and position < size // 2)
            reply = tool_call_text(task.ground_truth[0]) if right else "I cannot do that."
            out.append(self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        return out


def answer_with_ground_truth(monkeypatch, tasks, right, others_play: bool = False) -> None:
    """Patch ``TransformersGenerator.generate``: the model generates as usual, then each message whose context holds
    one of ``tasks`` becomes that task's ground truth (its first turn, as <tool_call> blocks) where ``right(row)``
    says so, ``row`` its place in the batch. A message of no such task is an error, or with ``others_play`` stays
    the model's."""
    from seal_lite.engines.transformers_generate import TransformersGenerator

    generate = TransformersGenerator.generate

    def scripted(self, batch, max_new_tokens, temperature):
        answers = []
        for row, (context, ids) in enumerate(zip(batch, generate(self, batch, max_new_tokens, temperature))):
            text = self.tokenizer.decode(context)
            task = next((t for t in tasks if t.user_message(0) in text), None)
            assert task is not None or others_play, "a message of a task the script does not know"
            if task is not None and right(row):
                ids = (self.tokenizer(tool_call_text(task.ground_truth[0]), add_special_tokens=False)["input_ids"]
                       + [self.tokenizer.eos_token_id])
            answers.append(ids)
        return answers

    monkeypatch.setattr(TransformersGenerator, "generate", scripted)


def randomize_lora(model, seed: int = 1) -> None:
    """A trained LoRA: every B, zero when peft made it, drawn from N(0, 0.5²) by ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def torch_logprobs(model, prompt: list[int], completion: list[int], temperature: float):
    """log softmax(logits / T) of ``completion``'s tokens after ``prompt`` under ``model`` (T 0: the raw logits)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    scaled = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(scaled, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def largest_engine_gap(model, batch, temperature: float) -> float:
    """The largest |log p_model − log p_engine| over the model tokens of a step's ``batch`` (a RolloutBatch with
    the engine's ``sampled_logprobs``)."""
    import torch

    gaps = []
    for prompt, completion, mask, sampled in zip(batch.prompt_ids, batch.completion_ids, batch.env_mask,
                                                 batch.sampled_logprobs, strict=True):
        reference = torch_logprobs(model, prompt, completion, temperature)
        gaps.append((reference - torch.tensor(sampled))[torch.tensor(mask).bool()].abs().max().item())
    return max(gaps)
