#!/usr/bin/env bash
# seal-lite's GPU path in one command, for one NVIDIA GPU without network access. At most 8 minutes (each check
# has a time limit; they add up to 480 s). One JSON line per check on stdout ("ok": true/false), progress and
# library noise on stderr:
#   1. doctor              hardware, backends, and the masking self-test + one GRPO step on NF4 layers (peft-4bit)
#   2. steps-unsloth       two real SEAL steps on real BFCL tasks, Qwen2.5-1.5B-shaped random policy, Unsloth QLoRA
#   3. steps-peft-4bit     the same with transformers + bitsandbytes + peft
#   4. gpu_memory          benchmarks/gpu_memory.py --measure, one shape per process, memory capped to the card the
#                          recipe targets: Qwen2.5-3B at 16k under 15 GB (colab-t4), 7B at 16k under 24 GB (gpu-24gb)
# Models are random-init of the real shapes with a tokenizer built locally (no hub). Bring the wheels first:
#   on a machine with pip:   bash scripts/gpu_wheels.sh          (writes .whl/, about 60 MB)
#   on the GPU machine:      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                              --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   then:                    bash scripts/gpu_check.sh            (--tiny: 2-layer models, also on a CPU)
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
py=${PYTHON:-python3}
tiny=() scale=1
[ "${1:-}" = "--tiny" ] && tiny=(--tiny) scale=5  # on a shared 2-core CPU a tiny check takes 1-2 minutes
failed=0

check() {  # check NAME SECONDS COMMAND...: the command's JSON line, or one saying how it ended
  local name=$1 limit=$(($2 * scale)) out rc
  shift 2
  out=$(timeout "$limit" "$@")
  rc=$?
  if [ -n "$out" ]; then echo "$out"; else
    echo "{\"check\": \"$name\", \"ok\": false, \"error\": \"exit status $rc$([ $rc = 124 ] && echo ", over ${limit} s")\"}"
  fi
  [ $rc = 0 ] || failed=1
}

check doctor 90 "$py" scripts/gpu_check.py doctor ${tiny[@]+"${tiny[@]}"}
if [ ${#tiny[@]} = 0 ] || "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  check steps-unsloth 120 "$py" scripts/gpu_check.py steps --backend unsloth ${tiny[@]+"${tiny[@]}"}
else
  echo '{"check": "steps-unsloth", "ok": null, "skipped": "no GPU: Unsloth needs one"}'
fi
check steps-peft-4bit 90 "$py" scripts/gpu_check.py steps --backend peft-4bit ${tiny[@]+"${tiny[@]}"}
if [ ${#tiny[@]} = 0 ]; then
  check gpu_memory-3b 70 "$py" benchmarks/gpu_memory.py --measure --json --shapes 3b --tokens 16384 --cap-gb 15
  check gpu_memory-7b 110 "$py" benchmarks/gpu_memory.py --measure --json --shapes 7b --tokens 16384 --cap-gb 24
else
  check gpu_memory-tiny 120 "$py" benchmarks/gpu_memory.py --measure --json --tiny --shapes 1.5b --tokens 1024 \
    --backend peft-4bit
fi
exit $failed
