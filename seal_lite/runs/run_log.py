"""The run's log file, RUN/run.log: where the libraries' warnings, log lines and progress bars go while a run runs,
so that the terminal shows the run's own lines (``seal-lite run -v`` shows both).

What the libraries write, and how each reaches the file (Python's own mechanisms, no library is patched):

* log records: bitsandbytes 0.50's "Failed to load CPU gemm_4bit_forward from kernels-community" is a logger
  warning at import on a CPU with AVX512_BF16; a handler on the root logger takes every record, and seal-lite's
  own warnings (loggers ``seal_lite.*``, e.g. a tracker that cannot start) still reach the terminal;
* ``warnings.warn``: ``warnings.showwarning`` (the documented hook) makes each warning a record of ``py.warnings``;
* what they print to stderr, progress bars included (the GGUF conversion's three): ``sys.stderr`` is a stream that
  turns each finished line into a record of the logger ``stderr``, a bar only in the last state it drew.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

LOG_FILE = "run.log"
OWN = "seal_lite"  # the loggers whose warnings are the run's own lines


@contextlib.contextmanager
def library_output(log_file: Path, verbose: bool = False) -> Iterator[None]:
    """Send the libraries' log records, warnings and stderr to ``log_file`` (appended: a resumed run goes on in it)
    while the block runs; with ``verbose`` the records go to the terminal too, and stderr stays there."""
    root, terminal = logging.getLogger(), sys.stderr
    to_file = _LogFile(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    shown = logging.StreamHandler(terminal)
    shown.setFormatter(_TerminalFormat())
    if not verbose:
        shown.setLevel(logging.WARNING)
        shown.addFilter(lambda record: record.name == OWN or record.name.startswith(f"{OWN}."))
    level, showwarning = root.level, warnings.showwarning
    root.addHandler(to_file)
    root.addHandler(shown)
    root.setLevel(min(level, logging.INFO))  # INFO records reach the file (NOTSET, 0, on the root means all)
    warnings.showwarning = _warning_record
    stderr = _LinesToLog(logging.getLogger("stderr"), terminal)
    try:
        with contextlib.nullcontext() if verbose else contextlib.redirect_stderr(stderr):
            yield
    finally:
        stderr.close_into(terminal)  # a handler a library made meanwhile keeps this stream: it now reaches stderr
        warnings.showwarning = showwarning
        root.setLevel(level)
        for handler in (shown, to_file):
            root.removeHandler(handler)
            handler.close()


class _LogFile(logging.FileHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        # A full disk: logging would print its own traceback on stderr for every record. The run's own error says
        # the disk is full (seal_lite/runs/run_dir.py); the library lines are lost.
        pass


class _TerminalFormat(logging.Formatter):
    """seal-lite's lines as they are; a library's with its logger's name, so ``-v`` says who wrote what."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.name.startswith(OWN) else f"{record.name}: {text}"


def _warning_record(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` as ``logging.captureWarnings`` does it, for this block only."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    if file is not None:  # a caller that names a file gets it written there, as the default hook does
        file.write(text)
    else:
        logging.getLogger("py.warnings").warning("%s", text.rstrip())


class _LinesToLog:
    """A text stream whose finished lines become INFO records. A progress bar redraws its line after each '\\r';
    only what stands after the last one when the line ends is kept."""

    def __init__(self, logger: logging.Logger, terminal):
        self.logger, self.terminal, self.target = logger, terminal, None
        self.pending, self.lock, self.logging = "", threading.Lock(), threading.local()

    def write(self, text: str) -> int:
        if self.target is not None:
            return self.target.write(text)
        if getattr(self.logging, "now", False):  # a handler that failed reports it on stderr: not back into logging
            return self.terminal.write(text)
        with self.lock:
            *lines, self.pending = (self.pending + text).split("\n")
        self.logging.now = True
        try:
            for line in lines:
                if kept := line.rstrip("\r").rsplit("\r", 1)[-1].strip():
                    self.logger.info("%s", kept)
        finally:
            self.logging.now = False
        return len(text)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    def close_into(self, target) -> None:
        """Log what is left of an unfinished line, and pass whatever comes later on to ``target``."""
        self.write("\n")
        self.target = target

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # code that writes below Python (faulthandler) gets the terminal's descriptor
        return self.terminal.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.terminal, "encoding", None) or "utf-8"
