#!/usr/bin/env bash
# The trainer on "device" memory without a GPU: ZERO3D_DEVICE_WALLS=1 makes the host backend's
# memory device memory that the host cannot read except inside the backend's ops and copies
# (kernels/host/walled_backend.cpp), so any host code that touches a device buffer directly
# (the trainer, the ZeRO engine, the collectives' staging, checkpoints) faults instead of passing
# as it would on a GPU. Losses must equal the host backend's bit for bit: 2 ranks ZeRO-2 bf16 with
# a checkpoint, a resume of that checkpoint onto ZeRO-1, the same with the optimizer offloaded to
# host memory and to nvme (and a resume without), tp 2 x pp 2 with ZeRO-3 (offloaded too), and
# ZeRO-3 with the parameter slices offloaded as well (refused without offload_optimizer).
# usage: test_device_walls.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
run() {  # run NAME WALLS TP PP DP GAS [--set ...]: ZERO3D_DEVICE_WALLS=WALLS (1: walled, 0: the host backend)
  local name=$1 walls=$2
  shift 2
  ZERO3D_DEVICE_WALLS=$walls train_layout input/gpt-tiny.json "$name" "$@"
}
# The layouts (TP PP DP GAS), each in micro-batches of 4 sequences.
dp2=(1 1 2 1)
t2p2=(2 2 1 2)
losses() {  # losses NAME: "step loss" per line
  python3 -c 'import sys; from z3dcheck import train
for r in train(sys.argv[1]): print(r["step"], r["loss"].hex() if isinstance(r["loss"], float) else r["loss"])' \
    "$tmp/$1/metrics.jsonl"
}
same() {  # same A B [FROM_STEP]: A's losses equal B's (from a step on), bit for bit
  local a b
  a=$(losses "$1" | awk -v f="${3:-0}" '$1 > f')
  b=$(losses "$2" | awk -v f="${3:-0}" '$1 > f')
  [[ -n $a && $a == "$b" ]] || fail "$1 vs $2: losses differ
$a
--
$b"
  echo "ok $1 = $2 ($(wc -l <<< "$a") steps)"
}

z2=(--set train_steps=6 --set zero_optimization.stage=2 --set bf16.enabled=true --set checkpoint.save_interval=3)
run host_z2 0 "${dp2[@]}" "${z2[@]}"
run walled_z2 1 "${dp2[@]}" "${z2[@]}"
same walled_z2 host_z2
grep -q "behind device-memory walls" "$tmp/walled_z2.log" || fail "the walled run did not use the walled backend"
grep -q '"comm_device_buffers": *"device buffers staged' "$tmp/walled_z2/metrics.jsonl" ||
  fail "the walled run's collectives did not stage device buffers"
run walled_resume 1 "${dp2[@]}" --set train_steps=6 --set zero_optimization.stage=1 --set bf16.enabled=true \
  --set checkpoint.load=\""$tmp/walled_z2/checkpoints/step_00000003.h5"\"
same walled_resume host_z2 3
# Optimizer offload from device memory: the state in host memory (cpu) or swap files (nvme),
# AdamW on the CPU, gradients down and weights up per sub-group; a checkpoint of the offloaded
# run resumes without offload.
sub=(--set zero_optimization.sub_group_size=20000)
run walled_cpu 1 "${dp2[@]}" "${z2[@]}" "${sub[@]}" --set zero_optimization.offload_optimizer.device=cpu
same walled_cpu host_z2
mkdir -p "$tmp/nvme"
run walled_nvme 1 "${dp2[@]}" "${z2[@]}" "${sub[@]}" --set zero_optimization.offload_optimizer.device=nvme \
  --set zero_optimization.offload_optimizer.nvme_path="$tmp/nvme"
same walled_nvme host_z2
[[ -z $(find "$tmp/nvme" -mindepth 1) ]] || fail "walled_nvme left swap files behind"
python3 - "$tmp/walled_cpu/metrics.jsonl" <<'PY' || fail "walled_cpu: the run record does not show the state in host memory"
import sys
from z3dcheck import run_and_train
run, train = run_and_train(sys.argv[1])
assert run["mem_host_bytes"] > 0 and run["mem_optimizer_bytes"] == 0 and "AdamW on the CPU" in run["offload_optimizer"], run
assert all(r["offload_down_bytes"] > 0 and r["offload_up_bytes"] > 0 for r in train), train
PY
run walled_cpu_resume 1 "${dp2[@]}" --set train_steps=6 --set zero_optimization.stage=2 --set bf16.enabled=true \
  --set checkpoint.load=\""$tmp/walled_cpu/checkpoints/step_00000003.h5"\"
same walled_cpu_resume host_z2 3
t3=(--set train_steps=4 --set zero_optimization.stage=3)  # on t2p2: dp 1, 8 = micro 4 x 2
run host_3d 0 "${t2p2[@]}" "${t3[@]}"
run walled_3d 1 "${t2p2[@]}" "${t3[@]}"
same walled_3d host_3d
run walled_3d_cpu 1 "${t2p2[@]}" "${t3[@]}" "${sub[@]}" --set zero_optimization.offload_optimizer.device=cpu
same walled_3d_cpu host_3d
# ZeRO-Infinity from device memory: stage 3's parameter slices in host memory or swap files too,
# copied up into the gather slots; dp 2 in bf16.
z3=(--set train_steps=4 --set zero_optimization.stage=3 --set bf16.enabled=true "${sub[@]}"
    --set zero_optimization.offload_optimizer.device=cpu)
run host_z3 0 "${dp2[@]}" --set train_steps=4 --set zero_optimization.stage=3 --set bf16.enabled=true
run walled_z3_param_cpu 1 "${dp2[@]}" "${z3[@]}" --set zero_optimization.offload_param.device=cpu
same walled_z3_param_cpu host_z3
run walled_z3_param_nvme 1 "${dp2[@]}" "${z3[@]}" --set zero_optimization.offload_param.device=nvme \
  --set zero_optimization.offload_param.nvme_path="$tmp/nvme"
same walled_z3_param_nvme host_z3
[[ -z $(find "$tmp/nvme" -mindepth 1) ]] || fail "walled_z3_param_nvme left swap files behind"
expect_exit 2 refused "offload_param on a device backend needs offload_optimizer" env ZERO3D_DEVICE_WALLS=1 \
  $MPIRUN -np 1 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/refused" --set data.val="" \
  --set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu
echo "device walls: all passed"
