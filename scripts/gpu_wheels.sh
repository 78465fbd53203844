#!/usr/bin/env bash
# Download, as wheels into .whl/, everything scripts/gpu_check.sh and scripts/gpu_e2e.sh need beyond a GPU image that
# has python3.12, torch (CUDA), transformers 5.17, peft 0.21 and accelerate: the GPU training stack (Unsloth,
# bitsandbytes, trl, datasets) and seal-lite's own runtime dependencies, bfcl-eval included. About 60 MB. Run it from the project
# root on a machine with pip; the install line for the GPU machine is in scripts/gpu_check.sh's header.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
exclude="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's .git is a file
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          "${plat[@]}" -d .whl "$@"; }
# the training stack (the versions seal-lite pins) and what Unsloth and trl import beyond the image. Left out to stay
# under the device's 64 MiB carry with the working tree: hf_transfer (3.5 MB; Unsloth only looks for it, and the
# check runs offline) and pygments (1.3 MB; the image has it)
get unsloth==2026.10.9 unsloth-zoo==2026.10.9 bitsandbytes==0.50.2 trl==1.14.2 "datasets<5" dill multiprocess tyro \
  docstring-parser shtab typeguard cut_cross_entropy torchao msgspec structlog json5 nest-asyncio
# seal-lite's runtime imports on the training path (recipe, store, console, BFCL environment and checker);
# llama-cpp-python is left out: the checks run without the diagnoser
get bfcl-eval==2026.3.23 pydantic pydantic-core annotated-types typing-inspection click rich markdown-it-py mdurl \
  sqlite-utils sqlite-fts4 tabulate click-default-group python-dateutil six pluggy
# Unsloth's wheel carries an 82 MB web app (studio/) that training never imports: drop it to fit the carry limit.
w=$(ls .whl/unsloth-2026.10.9-*.whl)
if python3 -c 'import sys, zipfile; sys.exit(not any(name.startswith("studio/")
                for name in zipfile.ZipFile(sys.argv[1]).namelist()))' "$w"; then
  t=$(mktemp -d)
  (cd "$t" && python3 -m zipfile -e "$OLDPWD/$w" . && rm -rf studio \
     && grep -v '^studio/' unsloth-*.dist-info/RECORD > R && mv R unsloth-*.dist-info/RECORD)
  rm "$w"
  (cd "$t" && python3 -m zipfile -c "$OLDPWD/$w" $(ls -A "$t"))
  rm -rf "$t"
fi
du -sh .whl
