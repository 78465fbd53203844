"""llama.cpp behind one adapter: the diagnoser model in-process, or as llama-cpp-python's OpenAI-compatible server.

* ``InProcessModel`` loads a GGUF with ``llama_cpp.Llama`` and answers chat requests under a JSON schema.
* ``LocalServer`` starts llama-cpp-python's server (``python -m llama_cpp.server``) on 127.0.0.1 at a free port
  as a child process, waits until it answers, and stops it on exit, on error and on Ctrl-C. On Linux the child
  also gets a signal when seal-lite dies for any reason (even ``kill -9``), so no server outlives its run.
* ``ServerModel`` talks to such a server, or to any URL the user gives, over HTTP (standard library only).
* ``LlamaCppGenerator`` plays rollouts from a GGUF (the ``Generator`` of seal_lite/agent.py): the benchmarks use
  it to collect real failed turns from the pip models several times faster than transformers on a CPU.

Every failure to answer (timeout, connection refused, server gone) is a ``BackendError``; what to do about it
is the diagnoser's business (seal_lite/diagnosis/diagnoser.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


class BackendError(RuntimeError):
    """The model did not answer: timed out, unreachable, or its server is gone."""


class InProcessModel:
    """A GGUF loaded in this process. The request timeout stops generation between tokens (the prompt itself is
    read in one go)."""

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None, seed: int = 0):
        from llama_cpp import Llama

        self.llm = Llama(model_path, n_ctx=n_ctx, n_threads=n_threads or os.cpu_count(), seed=seed, verbose=False)

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        text = []
        try:  # streamed, so the deadline is checked between tokens; leaving the loop stops generation
            for chunk in self.llm.create_chat_completion(
                messages, response_format={"type": "json_object", "schema": schema}, max_tokens=max_tokens,
                temperature=0.0, stream=True,
            ):
                text.append(chunk["choices"][0]["delta"].get("content") or "")
                if time.monotonic() > deadline:
                    raise BackendError(f"no answer within {timeout_s:g} s")
        except ValueError as error:  # e.g. the prompt does not fit the context
            raise BackendError(f"llama.cpp refused the request: {error}") from None
        return "".join(text)

    def close(self) -> None:
        self.llm.close()


class LlamaCppGenerator:
    """Continue token sequences with a GGUF. ``tokenizer`` is the same model's Hugging Face tokenizer (chat
    template and ids; a GGUF and the model converted from it share the vocabulary). Sequences run one by one;
    llama.cpp keeps the longest common prefix of consecutive prompts in its cache."""

    def __init__(self, model_path: str, tokenizer, n_ctx: int = 8192, n_threads: int | None = None, seed: int = 0):
        from llama_cpp import Llama

        self.tokenizer = tokenizer
        self.llm = Llama(model_path, n_ctx=n_ctx, n_threads=n_threads or os.cpu_count(), seed=seed, verbose=False)
        stops = {self.llm.token_eos(), tokenizer.eos_token_id, tokenizer.get_vocab().get("<|im_end|>")}
        self.stop_ids = {token for token in stops if token is not None}

    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        results = []
        for ids in batch:
            new: list[int] = []
            for token in self.llm.generate(ids, temp=temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                new.append(token)
                if token in self.stop_ids or len(new) >= max_new_tokens:
                    break
            results.append(new)
        return results

    def close(self) -> None:
        self.llm.close()


class ServerModel:
    """An OpenAI-compatible chat endpoint (llama-cpp-python's server, or any URL the user gives)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float) -> str:
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                "response_format": {"type": "json_object", "schema": schema}}
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                payload = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as error:  # URLError covers refused and HTTP errors
            raise BackendError(f"{self.url} did not answer: {error}") from None
        try:
            return payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.url} answered without a chat completion: {str(payload)[:200]}") from None

    def close(self) -> None:
        pass


class LocalServer:
    """``python -m llama_cpp.server`` for one GGUF, as a child process on 127.0.0.1 at a free port."""

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None, startup_timeout_s: float = 120):
        self.model_path, self.n_ctx, self.n_threads = model_path, n_ctx, n_threads or os.cpu_count()
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log = Path(tempfile.gettempdir()) / f"seal-lite-llama-server-{os.getpid()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalServer:
        self.port = _free_port()
        command = [sys.executable, "-c", _SERVER_BOOTSTRAP, str(os.getpid()), "--model", self.model_path,
                   "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                   "--n_threads", str(self.n_threads)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendError(f"llama.cpp server exited with {self.process.returncode} while starting; "
                                   f"its log: {self.log}\n{_tail(self.log)}")
            if self._answers():
                return self
            time.sleep(0.2)
        self.stop()
        raise BackendError(f"llama.cpp server did not answer within {self.startup_timeout_s:g} s; its log: {self.log}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The server's first act: on Linux, ask for SIGTERM when its parent (seal-lite) dies for any reason, even kill -9
# (PR_SET_PDEATHSIG), and exit at once if that parent is already gone; then run llama-cpp-python's server.
_SERVER_BOOTSTRAP = """
import ctypes, os, runpy, signal, sys
parent = int(sys.argv.pop(1))
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
if os.getppid() != parent:
    sys.exit(0)
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
