"""Where a step's time goes: wall-clock seconds per phase, summed over all the code that runs in it.

The rollout code marks its phases (rendering, prefill, decode, environment, verification, store); the loop
takes the sums once per step and stores them as ``time/<phase>_s`` metrics (benchmarks/step_profile.py prints
them as a table). A phase is a few ``perf_counter`` calls: cheap enough to stay on.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

_seconds: defaultdict[str, float] = defaultdict(float)


@contextlib.contextmanager
def phase(name: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        _seconds[name] += time.perf_counter() - started


def add(name: str, seconds: float) -> None:
    _seconds[name] += seconds


def take() -> dict[str, float]:
    """The sums since the last call, and start again."""
    sums = dict(_seconds)
    _seconds.clear()
    return sums
