#!/usr/bin/env bash
# seal-lite as a user runs it, on one NVIDIA GPU without network access, in at most 6 minutes after the wheels'
# install: the real `seal-lite run` on the GPU recipes' backend (peft-4bit) killed with SIGKILL after step 1's
# checkpoint and resumed to the end, `seal-lite eval RUN --base --tasks 1`, Unsloth's log-probs against an engine's
# on prompts of different lengths (off- and on-policy, trained on Unsloth), and one step of colab-t4's path (NF4 in
# fp16, paged rollouts on paged|sdpa, SDPA held to a T4's kernels, the pool handed back before the update)
# (scripts/gpu_e2e.py says what each part checks and what stands in for a user's model, verdict and diagnoser).
# Each part writes OUT/<part>.json as it goes (4 files); a part over its limit keeps what it finished. At the end
# every part's JSON line has been printed; the exit status is 0 when all passed.
#   on a machine with pip:   bash scripts/gpu_wheels.sh          (writes .whl/, about 60 MB)
#   on the GPU machine:      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                              --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   then:                    OUT=/some/folder bash scripts/gpu_e2e.sh
#   on a CPU (the test suite): OUT=/some/folder bash scripts/gpu_e2e.sh --cpu     (a 2-layer model; peft but
#                              for paged_fp16's NF4 in fp16)
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
exec "${PYTHON:-python3}" scripts/gpu_e2e.py --out "${OUT:-gpu-e2e-out}" "$@"
