"""The diagnoser's chat models: a GGUF in this process, llama-cpp-python's server as a child, or any URL.

* ``InProcessModel`` loads a GGUF with ``llama_cpp.Llama`` and answers chat requests under a JSON schema.
* ``LocalServer`` starts llama-cpp-python's server (``python -m llama_cpp.server``) on 127.0.0.1 at a free port
  as a child process, waits until it answers, and stops it on exit, on error and on Ctrl-C. On Linux the child
  also gets a signal when seal-lite dies for any reason (even ``kill -9``), so no server outlives its run.
* ``ServerModel`` talks to such a server, or to any OpenAI-compatible URL the user gives (vLLM, SGLang,
  llama.cpp's ``llama-server``), over HTTP (standard library only).

Every failure to answer (timeout, connection refused, server gone) is a ``BackendError``; what to do about it
is the diagnoser's business (seal_lite/step/diagnoser.py).
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

from seal_lite.core.errors import ModelError


def usable_cores() -> int:
    """The cores this process may run on (taskset, cgroup cpusets), not all of the machine's: llama.cpp's threads
    wait for each other, so one thread more than there are cores slows every token several-fold. Every llama.cpp
    seal-lite starts gets it for both thread counts: llama-cpp-python's default for reading prompts
    (``n_threads_batch``) is the machine's whole CPU count, whatever the affinity."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class BackendError(ModelError):
    """The model did not answer: timed out, unreachable, or its server is gone."""


def require_llama_cpp_build() -> None:
    """Refuse, with the fix, a llama.cpp compiled for instructions this CPU lacks (it would die of SIGILL)."""
    from seal_lite.engines.llama_build import mismatch

    if (why := mismatch()) is not None:
        raise BackendError(why)


class InProcessModel:
    """A GGUF loaded in this process. The request timeout stops generation between tokens (the prompt itself is
    read in one go)."""

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None, seed: int = 0):
        require_llama_cpp_build()
        from llama_cpp import Llama

        threads = n_threads or usable_cores()
        self.llm = Llama(model_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=seed, verbose=False)

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


class ServerModel:
    """An OpenAI-compatible chat endpoint (llama-cpp-python's server, or any URL the user gives).

    ``json_format`` says how the server takes a JSON schema: llama-cpp-python's server only knows
    ``{"type": "json_object", "schema": ...}``; OpenAI's own form, ``{"type": "json_schema", ...}``, is what vLLM,
    SGLang and llama.cpp's ``llama-server`` read. ``model`` is sent as the request's model name where the server
    serves several (vLLM wants it)."""

    def __init__(self, url: str, model: str | None = None, json_format: str = "llama-cpp-python"):
        if json_format not in ("llama-cpp-python", "openai"):
            raise ValueError(f"json_format {json_format!r}: use llama-cpp-python or openai")
        self.url, self.model, self.json_format = url.rstrip("/"), model, json_format

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float) -> str:
        response_format = ({"type": "json_object", "schema": schema} if self.json_format == "llama-cpp-python" else
                           {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "response_format": response_format}
        if self.model:
            body["model"] = self.model
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
    """``python -m llama_cpp.server`` for one GGUF, as a child process on 127.0.0.1 at a free port.

    ``startup_timeout_s`` counts the server's own CPU seconds where Linux reports them (/proc), so a busy machine,
    which slows the start without the server doing anything wrong, does not fail it; a server that uses no CPU
    (stuck) is given up after ten times that in wall-clock seconds."""

    def __init__(self, model_path: str, n_ctx: int = 4096, n_threads: int | None = None, startup_timeout_s: float = 120,
                 lora_path: str | None = None):
        self.model_path, self.n_ctx, self.n_threads = model_path, n_ctx, n_threads or usable_cores()
        self.lora_path = lora_path  # a LoRA GGUF (seal_lite/engines/gguf_lora.py) applied on top of the model
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log = Path(tempfile.gettempdir()) / f"seal-lite-llama-server-{os.getpid()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalServer:
        require_llama_cpp_build()
        self.port = _free_port()
        command = [sys.executable, "-c", _SERVER_BOOTSTRAP, str(os.getpid()), "--model", self.model_path,
                   "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                   "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads)] + \
            (["--lora_path", self.lora_path] if self.lora_path else [])
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise BackendError(f"llama.cpp server exited with {self.process.returncode} while starting; "
                                   f"its log: {self.log}\n{_tail(self.log)}")
            if self._answers():
                return self
            waited, spent = time.monotonic() - started, _cpu_seconds(self.process.pid)
            if (spent if spent is not None else waited) > self.startup_timeout_s or \
                    waited > 10 * self.startup_timeout_s:
                break
            time.sleep(0.2)
        self.stop()
        raise BackendError(f"llama.cpp server did not answer after {self.startup_timeout_s:g} s of its CPU time "
                           f"({time.monotonic() - started:.0f} s in all); its log: {self.log}")

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


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


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
