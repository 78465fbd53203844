"""seal-lite: co-evolve a tool-using agent and its training environment with SEAL (docs/method.md).

The library's front door is ``seal_lite.api``, whose docstring has an example a notebook can copy; its names are
available here too, loaded on first use (PEP 562), so that ``import seal_lite.core.calls`` and ``seal-lite --help``
import nothing heavy.
"""

import importlib
import os

# expandable segments: less fragmentation between 16k-token generate calls and the update; never over a user's setting
if "PYTORCH_ALLOC_CONF" not in os.environ:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

_FROM_API = ("run", "screen", "evaluate", "verify", "prompt", "report", "export", "diagnose", "trajectory", "doctor",
             "checked_recipe", "load_recipe", "SealLiteError", "ToolEnvironment")
__all__ = list(_FROM_API)


def __getattr__(name: str):
    if name in _FROM_API:
        return getattr(importlib.import_module("seal_lite.api"), name)
    raise AttributeError(f"module 'seal_lite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_FROM_API})
