#!/usr/bin/env bash
# jobscripts/quickstart.sh: the local demo. Installs what is missing (Debian 12), builds Release,
# trains gpt-tiny on a 3-D layout of 4 local ranks: 2 pipeline stages (two layers each, 1F1B over
# 2 micro-batches) x 2 data-parallel ranks, ZeRO stage 2 inside each stage (each rank keeps half of
# its stage's gradients and Adam state), and prints where the metrics are.
# The arithmetic: 0.8M parameters, 200 steps of a global batch of 8 x 64 tokens = 102k tokens at
# 5.1 MFLOP per token = 0.5 TFLOP in all: about a minute on two cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source jobscripts/deps.sh
zero3d_install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target zero3d
export OPENBLAS_NUM_THREADS=1   # one BLAS thread per rank: the fastest layout on this class of machine
run=runs/quickstart
rm -rf "$run"
# global batch 8 = micro 2 x 2 micro-batches x dp 2
mpirun --oversubscribe -np 4 build/bin/zero3d train input/gpt-tiny.json --run-dir "$run" \
  --set pipeline_parallel.pp_size=2 --set zero_optimization.stage=2 \
  --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2
echo
echo "quickstart: metrics in $run/metrics.jsonl, resolved config in $run/config.json"
