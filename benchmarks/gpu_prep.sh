#!/usr/bin/env bash
# Build .device-carry/ for benchmarks/gpu_check.sh: the wheels and trimmed
# Ray the GPU machine lacks (../shared/tools/device-prep.sh, about 33 MB) and
# the MNIST test set (1.6 MB) the cnn-mnist workload and the CNN tests read.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHARED:-../shared}
bash "$shared/tools/device-prep.sh" .device-carry
mkdir -p .device-carry/data
cp -r "$shared/data/mnist-test" .device-carry/data/
du -sh .device-carry
