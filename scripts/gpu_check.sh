#!/usr/bin/env bash
# seal-lite's GPU path in one command, for one NVIDIA GPU without network access, in about 7.5 minutes with the
# wheels' install (a fresh H200, 2026-12-04: 6 minutes without the fit checks; Unsloth's compiles are most of it),
# at most about 9.7. Two processes, so Unsloth never patches the peft-4bit one; the checks a later one needs, or
# that matter most, run first:
#   unsloth     steps, adapter, memory, timing, parity, over_length, parity_fp16, fit_t4   (at most 450 s)
#   peft-4bit   steps, parity, fit_24gb, vllm (skipped without vLLM)                      (at most 130 s)
# (scripts/gpu_check.py says what each check is; the other fit checks, fit_80gb and each backend's remaining
# ones, run alone: python3 scripts/gpu_check.py --backend unsloth --checks fit_24gb,fit_80gb --out OUT)
# Each check writes OUT/<backend>-<check>.json the moment it ends ("ok": true/false), each process its whole
# output to OUT/<backend>.log (Unsloth prints banners on stdout); at the end the JSON lines are printed together.
# A process over its limit is stopped; the checks it finished keep their files. Bring the wheels first:
#   on a machine with pip:   bash scripts/gpu_wheels.sh          (writes .whl/, about 60 MB)
#   on the GPU machine:      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                              --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#   then:                    OUT=/some/folder bash scripts/gpu_check.sh   (--tiny: 2-layer models, also on a CPU)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
py=${PYTHON:-python3}
tiny=() scale=1
[ "${1:-}" = "--tiny" ] && tiny=(--tiny) scale=10  # a tiny check on a shared 2-core CPU is slower than on a GPU
failed=0

group() {  # group BACKEND SECONDS CHECKS
  timeout "$(($2 * scale))" "$py" scripts/gpu_check.py --backend "$1" --checks "$3" --out "$out" \
    ${tiny[@]+"${tiny[@]}"} >"$out/$1.log" 2>&1 || failed=1
  for check in ${3//,/ }; do
    [ -f "$out/$1-$check.json" ] \
      || echo "{\"check\": \"$1-$check\", \"ok\": false, \"error\": \"not run: the process ended (see $1.log)\"}" \
        >"$out/$1-$check.json"
    cat "$out/$1-$check.json"
  done
}

if "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  group unsloth 450 steps,adapter,memory,timing,parity,over_length,parity_fp16,fit_t4
else
  echo '{"check": "unsloth", "ok": null, "skipped": "no GPU: Unsloth needs one"}' | tee "$out/unsloth.json"
fi
group peft-4bit 130 steps,parity$([ ${#tiny[@]} = 1 ] && echo ",parity_fp16,adapter,over_length,memory,timing"),fit_24gb,vllm
exit $failed
