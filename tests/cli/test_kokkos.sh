#!/usr/bin/env bash
# The Kokkos backend (--backend kokkos, kernels/kokkos) against the host backend, layout by layout:
# gpt-tiny and llama-tiny on 1, 2 and 8 ranks (tensor, pipeline and data parallelism, ZeRO stages 0-3),
# and a resume that reshards a 1-rank checkpoint onto 2 pipeline stages. Each layout runs on both
# backends; per-step losses and gradient norms agree within 1e-6 relative (fp32: the backends differ
# only in their sums' order, their exp and tanh, and their GEMM libraries' blocking; measured: at most
# 5e-8 and 4e-8).
# 6 steps each, the checkpoint at step 3. Skipped (77) where the binary has no Kokkos backend.
# usage: test_kokkos.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
"$z3d" --version | grep -q "kokkos" || { echo "skip: this zero3d has no Kokkos backend (ZERO3D_KOKKOS)"; exit 77; }

# both CONFIG NAME TP PP DP [ARGS...]: 6 steps of the layout (PP micro-batches) on the host backend
# into $tmp/NAME.host, and on Kokkos into $tmp/NAME.kokkos; a run that fails ends the test with its log's tail.
both() {
  local config=$1 name=$2 tp=$3 pp=$4 dp=$5 b
  shift 5
  for b in host kokkos; do
    train_layout "$config" "$name.$b" "$tp" "$pp" "$dp" "$pp" --backend $b --set train_steps=6 "$@"
  done
}
both input/gpt-tiny.json gpt_t1p1d1_s0 1 1 1 --set checkpoint.save_interval=3
both input/gpt-tiny.json gpt_t2p1d1_s1 2 1 1 --set zero_optimization.stage=1
both input/gpt-tiny.json gpt_t2p2d2_s3 2 2 2 --set zero_optimization.stage=3 \
  --set zero_optimization.stage3_param_persistence_threshold=0
# The 1-rank Kokkos run's step-3 checkpoint, resumed on 2 pipeline stages by both backends.
both input/gpt-tiny.json gpt_resume_t1p2d1 1 2 1 \
  --set checkpoint.load=\""$tmp/gpt_t1p1d1_s0.kokkos/checkpoints/step_00000003.h5"\"
both input/llama-tiny.json llama_t1p1d1_s0 1 1 1
both input/llama-tiny.json llama_t1p1d2_s2 1 1 2 --set zero_optimization.stage=2
both input/llama-tiny.json llama_t2p2d2_s1 2 2 2 --set zero_optimization.stage=1

/usr/bin/python3 - "$tmp" <<'PY'
import sys, glob, os
from z3dcheck import Checks, max_rel, run_and_train
tmp = sys.argv[1]
check = Checks("kokkos")
for d in sorted(glob.glob(f"{tmp}/*.kokkos/")):
    name = os.path.basename(d.rstrip("/"))[: -len(".kokkos")]
    (run_h, host), (run_k, kok) = run_and_train(f"{tmp}/{name}.host"), run_and_train(f"{tmp}/{name}.kokkos")
    check(run_k["backend"].startswith("kokkos") and run_h["backend"].startswith("host"),
          f"{name}: backends {run_h['backend']!r} and {run_k['backend']!r}")
    steps = [r["step"] for r in kok]
    want = list(range(4, 7)) if "resume" in name else list(range(1, 7))
    loss, norm = max_rel(kok, host), max_rel(kok, host, "grad_norm")
    check(steps == want and [r["step"] for r in host] == want, f"{name}: steps {steps}, expected {want}")
    check(loss <= 1e-6, f"{name}: loss {loss:.2e} relative to the host backend (tolerance 1e-6)")
    check(norm <= 1e-6, f"{name}: grad norm {norm:.2e} relative to the host backend (tolerance 1e-6)")
    print(f"{name}: kokkos against host: loss {loss:.2e}, grad norm {norm:.2e} (max relative over {len(kok)} steps)")
check.exit()
PY
