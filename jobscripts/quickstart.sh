#!/usr/bin/env bash
# jobscripts/quickstart.sh: the local demo. Installs what is missing (Debian 12), builds Release,
# trains gpt-tiny (0.8M parameters, 200 steps of 8 x 64 tokens = 102k tokens, ~0.1 TFLOP in all:
# under a minute on one core) and prints where the metrics are.
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
build/bin/zero3d train input/gpt-tiny.json --run-dir "$run"
echo
echo "quickstart: metrics in $run/metrics.jsonl, resolved config in $run/config.json"
