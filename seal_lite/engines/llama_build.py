"""Which llama.cpp build this CPU gets. llama-cpp-python compiles llama.cpp when it is installed, and the
instructions it is compiled for set both how fast it reads prompts and on which CPUs it runs at all.

scripts/setup.sh compiles the first build of ``BUILDS`` whose instructions this CPU has, keeps its wheel in
``.venv/llama-cpp-wheels/BUILD`` and names it in ``.venv/llama-cpp-build``, so a ``.venv`` that meets another kind
of CPU reinstalls the right build (compiling only the first time):

* ``avx512``: AVX-512 (F, CD, VL, DQ, BW) with VBMI and VNNI, on Ice Lake and later Xeons and AMD Zen 4 and later.
  On the 2-core Xeon of docs/measured.md it reads prompts 1.5x as fast as ``generic``, which is most of a CPU
  evaluation's time (benchmarks/RESULTS.md).
* ``generic``: llama.cpp's portable defaults (AVX2, FMA, F16C on x86-64), for every other CPU.

Neither is ``-march=native``: on an AMX Xeon that also compiles llama.cpp's AMX kernels, and a native build
segfaulted in llama_decode (0.3.35 and 0.3.36; ggml-org/llama.cpp#20824, #26954). ``CMAKE_ARGS`` set by the user
overrides the choice (build ``custom-HASH``).

This file runs before seal-lite is installed (``python seal_lite/engines/llama_build.py``), so it imports only the
standard library.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
GENERIC_FLAGS = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})  # llama.cpp's x86-64 defaults
BUILDS = {  # name: (the /proc/cpuinfo flags it needs, its CMAKE_ARGS); the first this CPU can run is chosen
    "avx512": (GENERIC_FLAGS | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni"},
               "-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON"),
    "generic": (frozenset(), "-DGGML_NATIVE=OFF"),
}
INSTALLED = Path(sys.prefix) / "llama-cpp-build"  # written by scripts/setup.sh: the build in this environment


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's flags from ``cpuinfo`` (default: this machine's /proc/cpuinfo); None where they are unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    return {flag for line in cpuinfo.splitlines() if line.startswith("flags")
            for flag in line.partition(":")[2].split()}


def chosen_build(flags: set[str] | None, cmake_args: str | None = None) -> tuple[str, str]:
    """(name, CMAKE_ARGS) of the build for a CPU with ``flags``; ``cmake_args`` (the user's) wins."""
    if cmake_args:
        return f"custom-{hashlib.sha256(cmake_args.encode()).hexdigest()[:8]}", cmake_args
    return next((name, args) for name, (needed, args) in BUILDS.items() if needed <= (flags or set()))


def installed_build() -> str:
    """The build scripts/setup.sh installed here ("" when llama-cpp-python was installed otherwise)."""
    return INSTALLED.read_text().strip() if INSTALLED.exists() else ""


def mismatch(installed: str | None = None, flags: set[str] | None = None) -> str | None:
    """Why the llama.cpp build in this environment cannot run on this CPU (None when it can, or is unknown):
    loading it would die of an illegal instruction instead."""
    installed = installed_build() if installed is None else installed
    if installed not in BUILDS:
        return None
    flags = cpu_flags() if flags is None else flags
    missing = sorted(BUILDS[installed][0] - flags) if flags is not None else []
    if not missing:
        return None
    return (f"llama.cpp in this environment was compiled for {installed} CPUs and this one lacks "
            f"{', '.join(missing)}: run `bash scripts/setup.sh` to install the build for this CPU")


if __name__ == "__main__":  # for scripts/setup.sh: "NAME VERSION CMAKE_ARGS"
    name, cmake_args = chosen_build(cpu_flags(), os.environ.get("CMAKE_ARGS"))
    print(name, LLAMA_CPP_PYTHON, cmake_args)
