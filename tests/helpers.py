"""Helpers the tests import (``from tests.helpers import ...``): scripted policies and the text a model writes.

Fixtures stay in tests/conftest.py; scaffolding that benchmarks share is in tests/support/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from seal_lite.core.calls import parse_calls

ROOT = Path(__file__).resolve().parent.parent  # the repository
# the first line of a script that a test runs in another Python process and that imports tests.support
IMPORT_TESTS = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
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
