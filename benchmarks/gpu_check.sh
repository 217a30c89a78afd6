#!/usr/bin/env bash
# The CUDA check, for a machine with a GPU: workers given gpus_per_worker > 0
# train on CUDA and match the CPU run within float32 tolerance.
#
#   bash benchmarks/gpu_check.sh            # from the repository root
#
# It uses the python3 on PATH (or $PYTHON). fedsim's dependencies that are
# missing there can be put as wheels in .whl/ (.gitignore lists it); they
# are installed into a private directory, never into the system. For a
# machine with CPython 3.12 and PyTorch but no simpy or pydantic:
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl \
#     simpy==4.1.2 pydantic==2.14.4 pydantic-core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5
#
# Without ray, the Ray test (fractional GPUs per worker actor) is skipped;
# the in-process tests still run every algorithm's CUDA path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/fedsim-site .whl/*.whl
  export PYTHONPATH="/tmp/fedsim-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
nvidia-smi -L || true
"$PY" - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: nothing to check")
PY
"$PY" -m pytest -q -p no:cacheprovider -o addopts="-ra" tests/test_gpu.py
# One quickstart run each way, end to end through the CLI, in process.
out=$(mktemp -d)
for dev in cpu gpu; do
  gpus=0; [ "$dev" = gpu ] && gpus=0.25
  /usr/bin/time -f "$dev: %e s wall" "$PY" -m fedsim.cli run scenarios/quickstart.yaml \
    --workers 0 -q --no-report --out "$out/$dev" --set resources.gpus_per_worker=$gpus
done
"$PY" - "$out" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{d}/summary.json")) for d in ("cpu", "gpu"))
print(f"final accuracy: cpu {a['final_test_accuracy']:.4f}  gpu {b['final_test_accuracy']:.4f}")
assert abs(a["final_test_accuracy"] - b["final_test_accuracy"]) <= 0.01
PY
