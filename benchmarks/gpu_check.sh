#!/usr/bin/env bash
# The GPU check (issue 14), one prepared script for the GPU machine:
#   1. tests/test_gpu.py: CUDA vs CPU for every algorithm x model, float64 to
#      1e-9 (sequential and batched workers, the CNN too) and float32 on
#      metrics, plus 2 Ray workers on fractional GPUs;
#   2. the quickstart through the CLI on the CPU, on the GPU in-process, and
#      on 2 Ray workers x 0.25 GPU: the same final accuracy;
#   3. benchmarks/run.py on the cnn-mnist workload with --device cuda: fedsim
#      in-process, 1 and 2 Ray workers, batched, against the bare CUDA loop;
#      then 100 clients per round, batched against the bare loop;
#   4. benchmarks/batched_k.py: the largest K the batched executor trains at
#      once, and its local steps/s against the bare loop.
# Everything lands in $OUT (or the folder given): gpu-check.log, the JUnit
# report and results-gpu.md, which is appended to benchmarks/results.md back
# here. About 6 minutes on an H200. Prepare the carried folder on the CPU
# machine first (dependencies the GPU machine lacks, and the MNIST test set):
#
#   bash benchmarks/gpu_prep.sh                    # makes .device-carry/
#   bash benchmarks/gpu_check.sh /tmp/out          # there, from the repo root
#
# GPU_CHECK_DRY=1 runs every step on the CPU with tiny sizes: the way to test
# this script on a machine without CUDA (the GPU tests then skip).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
[ -f .device-carry/env.sh ] && source .device-carry/env.sh
[ -d .device-carry/data ] && export FEDSIM_DATA_ROOT="$PWD/.device-carry/data"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
if [ "$DRY" = 1 ]; then
  DEV=cpu GPU=0 QUARTER=0 ROUNDS=2 BIG=2 PER_ROUND=4 KS="4 8"
  SMALL=(--set round.max_steps=2 --set selector.clients_per_round=2)
else
  DEV=cuda GPU=1 QUARTER=0.25 ROUNDS=8 BIG=4 PER_ROUND=100 KS="100 400 1600 6400 25600"
  SMALL=()
fi
failed=()
step() {  # step NAME SECONDS CMD...: run, time-bound, and remember a failure
  local name=$1 limit=$2; shift 2
  echo; echo "=== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" || { echo "=== $name: FAILED (exit $?)"; failed+=("$name"); }
}
date -u; nvidia-smi -L 2>/dev/null || echo "nvidia-smi: none"
"$PY" -c 'import torch; c = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", c, torch.cuda.get_device_name(0) if c else "-")'
if [ "$DRY" != 1 ] && ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  echo "no CUDA device: nothing to check (GPU_CHECK_DRY=1 tests the script on a CPU)"
  exit 3
fi

step "GPU tests" 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts="-ra" \
  --junitxml="$OUT/gpu-tests.xml" tests/test_gpu.py

runs=$(mktemp -d)
quick=("$PY" -m fedsim.tools.cli run scenarios/quickstart.yaml -q --no-report)
step "quickstart cpu" 120 "${quick[@]}" --workers 0 --out "$runs/cpu"
step "quickstart gpu" 120 "${quick[@]}" --workers 0 --out "$runs/gpu" \
  --set resources.gpus_per_worker="$GPU"
step "quickstart 2 Ray workers" 180 "${quick[@]}" --workers 2 --out "$runs/ray2" \
  --set resources.gpus_per_worker="$QUARTER"
step "quickstart agree" 30 "$PY" - "$runs" <<'PY'
import json, sys
acc = {d: json.load(open(f"{sys.argv[1]}/{d}/summary.json"))["final_test_accuracy"]
       for d in ("cpu", "gpu", "ray2")}
print("final accuracy:", "  ".join(f"{d} {a:.5f}" for d, a in acc.items()))
assert max(acc.values()) - min(acc.values()) <= 0.01, acc
PY

step "benchmark cnn-mnist" 240 "$PY" benchmarks/run.py cnn-mnist --device "$DEV" \
  --rounds "$ROUNDS" "${SMALL[@]}" --out "$OUT/results-gpu.md"
step "benchmark cnn-mnist, $PER_ROUND clients per round" 180 "$PY" benchmarks/run.py \
  cnn-mnist --device "$DEV" --rounds "$BIG" --only local batched "${SMALL[@]:0:2}" \
  --set selector.clients_per_round="$PER_ROUND" --out "$OUT/results-gpu.md"
# shellcheck disable=SC2086
step "batched K sweep" 150 "$PY" benchmarks/batched_k.py --device "$DEV" \
  --k $KS --max-seconds 90 "${SMALL[@]:0:2}" --out "$OUT/results-gpu.md"

echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_check: every step passed"
else
  printf 'gpu_check: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
