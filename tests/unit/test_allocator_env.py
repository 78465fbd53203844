"""`import seal_lite` (which the CLI does first) turns on PyTorch's expandable segments before torch is imported,
unless the user has set the allocator under either of the names torch reads."""

import os
import subprocess
import sys

NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def after_import(**user) -> tuple[str, str, str]:
    """Both variables after `import seal_lite` in a fresh interpreter whose environment sets only ``user``'s, and
    whether torch had been imported by then."""
    env = {name: value for name, value in os.environ.items() if name not in NAMES} | user
    code = ("import os, sys, seal_lite; "
            f"print(*[os.environ.get(name, '-') for name in {NAMES!r}], 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return tuple(result.stdout.split())


def test_import_sets_expandable_segments_before_torch_but_keeps_a_users_settings():
    assert after_import() == ("expandable_segments:True", "-", "False")
    assert after_import(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128")[:2] == ("max_split_size_mb:128", "-")
    assert after_import(PYTORCH_ALLOC_CONF="expandable_segments:False")[:2] == ("-", "expandable_segments:False")
