#!/usr/bin/env bash
# jobscripts/quickstart.sh: the local demo. Installs what is missing (Debian 12), builds Release,
# trains gpt-tiny on a 3-D layout of 4 local ranks: 2 pipeline stages (two layers each, 1F1B over
# 2 micro-batches) x 2 data-parallel ranks, ZeRO stage 2 inside each stage (each rank keeps half of
# its stage's gradients and Adam state), checkpointing at steps 100 and 200; then resumes the step-200
# checkpoint on another layout (tp 2 x dp 2, ZeRO-3) for 20 more steps, and prints where everything is.
# The arithmetic: 0.8M parameters, 200 steps of a global batch of 8 x 64 tokens = 102k tokens at
# 5.1 MFLOP per token = 0.5 TFLOP in all: about a minute on two cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source jobscripts/deps.sh
zero3d_install_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target zero3d
run=runs/quickstart
resumed=runs/quickstart-resumed
rm -rf "$run" "$resumed"
# global batch 8 = micro 2 x 2 micro-batches x dp 2
mpirun --oversubscribe -np 4 build/bin/zero3d train input/gpt-tiny.json --run-dir "$run" \
  --set pipeline_parallel.pp_size=2 --set zero_optimization.stage=2 \
  --set train_micro_batch_size_per_gpu=2 --set gradient_accumulation_steps=2 --set checkpoint.save_interval=100
# The same global batch on another grid: 8 = micro 4 x dp 2, each stage's weights split over tp 2.
# The checkpoint is resharded on load; nothing is converted.
mpirun --oversubscribe -np 4 build/bin/zero3d train input/gpt-tiny.json --run-dir "$resumed" \
  --set tensor_parallel.tp_size=2 --set zero_optimization.stage=3 \
  --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=1 \
  --set checkpoint.load=\"$run/checkpoints\" --set train_steps=220 2>&1 | tee "$resumed.log"
grep -q "resumed from $run/checkpoints/step_00000200.h5" "$resumed.log"
build/bin/zero3d ckpt verify "$run/checkpoints" >/dev/null
# Plots: both runs' loss curves on one plot; model-state memory of both layouts against ZeRO's formula.
/usr/bin/python3 postprocess/loss.py "$run" "$resumed" --val --out "$run/loss.png" >/dev/null
/usr/bin/python3 postprocess/memory.py "$run" "$resumed" --out "$run" >/dev/null
# Text out of the step-200 checkpoint (byte-level: each byte a token; 64-token context).
sample=$(build/bin/zero3d generate "$run/checkpoints" --prompt "The program " --max-tokens 48 --temperature 0.7 \
  --top-k 20 --seed 1 2>/dev/null)
echo
echo "quickstart: trained 200 steps on pp 2 x dp 2 (ZeRO-2): metrics in $run/metrics.jsonl, config in $run/config.json,"
echo "  checkpoints in $run/checkpoints (zero3d ckpt inspect $run/checkpoints)"
echo "quickstart: resumed its step-200 checkpoint on tp 2 x dp 2 (ZeRO-3) and trained to step 220:"
echo "  metrics in $resumed/metrics.jsonl"
echo "quickstart: plots in $run/loss.png (loss curves of both) and $run/memory.png (memory per rank against"
echo "  ZeRO's formula; table in $run/memory.md)"
echo "quickstart: text from its step-200 model (zero3d generate $run/checkpoints --prompt \"The program \" ...):"
echo "  $sample" | tr '\n' ' '
echo
