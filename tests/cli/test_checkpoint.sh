#!/usr/bin/env bash
# Checkpoint/restart of gpt-tiny (global batch 8 sequences):
#  - exact resume: 40 uninterrupted steps (saving at 20) against a new process resuming the step-20
#    checkpoint for steps 21-40, bit for bit in every metric but timings, for layouts across
#    (tp, pp, dp), every ZeRO stage, fp32, fp16 (with an overflow before the save) and bf16;
#  - resharding: a checkpoint saved on one layout resumed on another (dp, tp, pp, stage and the
#    precision change): the first loss equals the saving run's within 1e-5 (1e-3 when the resumed
#    run computes in bf16) and training goes on;
#  - a rank killed (SIGKILL) in the middle of a save leaves `latest` on the previous checkpoint, and
#    checkpoint.load=auto resumes it to the same result as the uninterrupted run;
#  - SIGUSR1 to mpirun: every rank stops after a committed checkpoint with exit code 6, and resumes;
#    so does a run whose run.max_minutes budget runs out;
#  - corrupt, truncated, foreign-shaped and incomplete checkpoints: exit 2 naming file and dataset;
#    auto falls back to the previous checkpoint with a warning;
#  - every save and load was done with collective MPI-IO (no independent fallback).
# usage: test_checkpoint.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
py=/usr/bin/python3

base=(--peak-flops 1e11 --set data.val= --set train_batch_size=8 --set gradient_accumulation_steps=1)
layout() {  # layout TP PP DP STAGE: the --set flags of that layout
  echo "--set tensor_parallel.tp_size=$1 --set pipeline_parallel.pp_size=$2 --set train_micro_batch_size_per_gpu=$((8 / $3))" \
       "--set zero_optimization.stage=$4"
}
ranks() { echo $(($1 * $2 * $3)); }
run() {  # run NAME NP ARGS...: a run that must succeed
  local name=$1 np=$2; shift 2
  timeout 300 $MPIRUN -np "$np" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$name" "${base[@]}" "$@" \
    > "$tmp/$name.log" 2>&1 || { echo "run $name failed:"; cat "$tmp/$name.log"; exit 1; }
}
expect_fail() {  # expect_fail NAME CODE MESSAGE NP ARGS...: a run that must exit CODE saying MESSAGE
  local name=$1 code=$2 msg=$3 np=$4 rc=0; shift 4
  timeout 300 $MPIRUN -np "$np" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/$name" "${base[@]}" "$@" \
    > "$tmp/$name.log" 2>&1 || rc=$?
  if [ "$rc" != "$code" ] || ! grep -qF -- "$msg" "$tmp/$name.log"; then
    echo "FAIL $name: expected exit $code and '$msg', got exit $rc:"; cat "$tmp/$name.log"; exit 1
  fi
  echo "ok   $name: exit $code, '$msg'"
}

# ---- exact resume: NAME TP PP DP STAGE [extra flags] ----
fp16=(--set fp16.enabled=true --set fp16.loss_scale_window=4 --set fp16.hysteresis=1)
configs=(
  "s0_dp4      1 1 4 0"
  "s1_dp4_val  1 1 4 1 --set data.val=\"input/data/val.bin\" --set data.val_interval=10 --set data.val_batches=2"
  "s2_dp4      1 1 4 2"
  "s3_dp8      1 1 8 3"
  "s3_tp2_dp2  2 1 2 3"
  "s2_pp2_dp2  1 2 2 2"
  "s1_3d       2 2 2 1"
  "fp16_s0_dp4 1 1 4 0 ${fp16[*]}"
  "fp16_s1_tp2 2 1 2 1 ${fp16[*]}"
  "fp16_s2_pp2 1 2 2 2 ${fp16[*]}"
  "fp16_s3_dp4 1 1 4 3 ${fp16[*]}"
  "bf16_s3_pp2 1 2 2 3 --set bf16.enabled=true"
)
for c in "${configs[@]}"; do
  read -r name tp pp dp stage extra <<< "$c"
  set -- $(layout $tp $pp $dp $stage) ${extra:-}
  # fp16: an overflow at step 18 (before the save) puts the loss scaler in a state worth restoring.
  fault=""; [[ $name == fp16* ]] && fault="inf:0:18"
  ZERO3D_FAULT=$fault run "$name" "$(ranks $tp $pp $dp)" --set train_steps=40 --set checkpoint.save_interval=20 "$@"
  run "${name}_resumed" "$(ranks $tp $pp $dp)" --set train_steps=40 \
    --set checkpoint.load=\""$tmp/$name/checkpoints/step_00000020.h5"\" "$@"
done

# ---- resharding: NAME FROM_RUN FROM_STEP TP PP DP STAGE TOLERANCE LAST_STEP [extra] ----
# The first pair saves at 30 for the second: 8 x 1 x 1 ZeRO-3 -> 2 x 2 x 2 ZeRO-1 -> 1 x 1 x 1.
pairs=(
  "rs_dp8s3_to_3d_s1  s3_dp8            20 2 2 2 1 1e-5 32 --set checkpoint.save_interval=10"
  "rs_3d_s1_to_single rs_dp8s3_to_3d_s1 30 1 1 1 0 1e-5 34"
  "rs_dp4s2_to_pp2s3  s2_dp4            20 1 2 2 3 1e-5 24"
  "rs_tp2s3_to_dp4s0  s3_tp2_dp2        20 1 1 4 0 1e-5 24"
  "rs_pp2s2_to_tp4s0  s2_pp2_dp2        20 4 1 1 0 1e-5 24"
  "rs_3d_s1_to_dp2s2  s1_3d             20 1 1 2 2 1e-5 24"
  "rs_fp16_to_fp32    fp16_s3_dp4       20 2 1 2 1 1e-5 24"
  "rs_fp32_to_bf16    s2_dp4            20 1 2 2 2 1e-3 24 --set bf16.enabled=true"
)
for p in "${pairs[@]}"; do
  read -r name from step tp pp dp stage tol last extra <<< "$p"
  run "$name" "$(ranks $tp $pp $dp)" $(layout $tp $pp $dp $stage) --set train_steps=$last ${extra:-} \
    --set checkpoint.load=\""$tmp/$from/checkpoints/$(printf step_%08d.h5 $step)"\"
  echo "$name $from $step $tol" >> "$tmp/pairs.txt"
done

# ---- a rank killed in the middle of a save ----
kill_args=($(layout 1 1 4 2) --set train_steps=40 --set checkpoint.save_interval=10 --set checkpoint.keep_last=2)
ZERO3D_FAULT=stall_save:1:20 timeout 300 $MPIRUN -np 4 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/killed" \
  "${base[@]}" "${kill_args[@]}" > "$tmp/killed.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do grep -q "stalls in the middle" "$tmp/killed.log" && break; sleep 0.1; done
grep -q "stalls in the middle" "$tmp/killed.log" || { echo "FAIL: the stalled save never started"; cat "$tmp/killed.log"; exit 1; }
ls "$tmp/killed/checkpoints/step_00000020.h5.tmp" > /dev/null
mpirun_pid=$(pgrep -P "$launcher")  # the launcher is `timeout`; its child is mpirun, whose children are the ranks
victim=$(pgrep -P "$mpirun_pid" | tail -1)
kill -KILL "$victim"
wait "$launcher" && { echo "FAIL: the job survived SIGKILL of a rank"; exit 1; } || true
[ "$(cat "$tmp/killed/checkpoints/latest")" = step_00000010.h5 ] ||
  { echo "FAIL: latest is '$(cat "$tmp/killed/checkpoints/latest")' after a kill mid-save"; exit 1; }
echo "ok   killed mid-save: latest still names step_00000010.h5"
run killed 4 "${kill_args[@]}" --set checkpoint.load=auto
grep -q "resumed from $tmp/killed/checkpoints/step_00000010.h5" "$tmp/killed.log" || { cat "$tmp/killed.log"; exit 1; }
# keep_last 2 pruned the older ones, and the dead save's temporary file is gone
[ "$(ls "$tmp/killed/checkpoints" | tr '\n' ' ')" = "latest step_00000030.h5 step_00000040.h5 " ] ||
  { echo "FAIL: checkpoint dir after keep_last=2: $(ls "$tmp/killed/checkpoints")"; exit 1; }
echo "ok   keep_last 2 left steps 30 and 40, no temporary file"

# ---- SIGUSR1 to the job ----
sig_args=($(layout 1 1 4 2) --set train_steps=40)
timeout 300 $MPIRUN -np 4 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/signalled" "${base[@]}" "${sig_args[@]}" \
  > "$tmp/signalled.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  n=$(grep -c '"kind": "train"' "$tmp/signalled/metrics.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 5 ] && break; sleep 0.1
done
kill -USR1 "$(pgrep -P "$launcher")"  # mpirun forwards SIGUSR1 to every rank
rc=0; wait "$launcher" || rc=$?
[ "$rc" = 6 ] || { echo "FAIL: exit $rc after SIGUSR1, expected 6"; cat "$tmp/signalled.log"; exit 1; }
[ "$(grep -c 'stopping after step .* on SIGUSR1: the checkpoint is committed' "$tmp/signalled.log")" = 4 ] ||
  { echo "FAIL: not every rank reported the stop"; cat "$tmp/signalled.log"; exit 1; }
echo "ok   SIGUSR1: exit 6 on every rank after $(cat "$tmp/signalled/checkpoints/latest")"
run signalled 4 "${sig_args[@]}" --set checkpoint.load=auto

# ---- a wall-time budget (run.max_minutes) ----
rc=0
timeout 300 $MPIRUN -np 4 "$z3d" train input/gpt-tiny.json --run-dir "$tmp/budget" "${base[@]}" "${sig_args[@]}" \
  --set run.max_minutes=0.01 > "$tmp/budget.log" 2>&1 || rc=$?
[ "$rc" = 6 ] && grep -q "would overrun the time budget" "$tmp/budget.log" ||
  { echo "FAIL: exit $rc with a 0.6 s budget, expected 6"; cat "$tmp/budget.log"; exit 1; }
echo "ok   time budget: exit 6 after $(cat "$tmp/budget/checkpoints/latest")"
run budget 4 "${sig_args[@]}" --set checkpoint.load=auto

# ---- damaged checkpoints ----
mkdir -p "$tmp/damaged"
cp -r "$tmp/s2_dp4/checkpoints" "$tmp/damaged/flipped"
$py - "$tmp/damaged/flipped/step_00000040.h5" <<'PY'
import sys
from z3dcheck import dataset_extent, xor_bytes
path = sys.argv[1]
off, _ = dataset_extent(path, "/optimizer/exp_avg/h.1.mlp.c_fc.weight")
xor_bytes(path, off + 1000, 4, 0x5A)
PY
s2=($(layout 1 1 4 2))
expect_fail flipped_path 2 "dataset '/optimizer/exp_avg/h.1.mlp.c_fc.weight' fails its checksum" 4 "${s2[@]}" \
  --set checkpoint.load=\""$tmp/damaged/flipped/step_00000040.h5"\"
run flipped_auto 4 "${s2[@]}" --set train_steps=22 --set checkpoint.load=auto --set checkpoint.dir=\""$tmp/damaged/flipped"\"
grep -q "fails its checksum.*trying an older one" "$tmp/flipped_auto.log" &&
  grep -q "resumed from $tmp/damaged/flipped/step_00000020.h5" "$tmp/flipped_auto.log" ||
  { echo "FAIL: auto did not fall back past the corrupt checkpoint"; cat "$tmp/flipped_auto.log"; exit 1; }
echo "ok   auto fell back from a corrupt latest to step 20"
cp -r "$tmp/s2_dp4/checkpoints" "$tmp/damaged/truncated"
truncate -s 5000000 "$tmp/damaged/truncated/step_00000040.h5"
expect_fail truncated_path 2 "is not a readable HDF5 file" 4 "${s2[@]}" --set checkpoint.load=\""$tmp/damaged/truncated"\"
run truncated_auto 4 "${s2[@]}" --set train_steps=22 --set checkpoint.load=auto --set checkpoint.dir=\""$tmp/damaged/truncated"\"
grep -q "resumed from $tmp/damaged/truncated/step_00000020.h5" "$tmp/truncated_auto.log" || { cat "$tmp/truncated_auto.log"; exit 1; }
expect_fail other_model 2 "holds a model with n_layer = 4, but this run's model.n_layer is 2" 4 "${s2[@]}" \
  --set model.n_layer=2 --set checkpoint.load=\""$tmp/s2_dp4/checkpoints"\"
cp "$tmp/s2_dp4/checkpoints/step_00000020.h5" "$tmp/damaged/incomplete.h5"
$py -c 'import sys, h5py; f = h5py.File(sys.argv[1], "r+"); del f["/optimizer/exp_avg_sq/wpe"]' "$tmp/damaged/incomplete.h5"
expect_fail incomplete 2 "has no dataset '/optimizer/exp_avg_sq/wpe'" 4 "${s2[@]}" \
  --set checkpoint.load=\""$tmp/damaged/incomplete.h5"\"
expect_fail missing 2 "does not exist" 1 $(layout 1 1 1 0) --set checkpoint.load=\""$tmp/nowhere"\"
[ ! -e "$tmp/missing" ] || { echo "FAIL: a failed load created its run dir"; exit 1; }

# ---- the comparisons ----
$py - "$tmp" "${configs[@]}" <<'PY'
import math, sys
from z3dcheck import MEASURED, Checks, records as run_records, rel, without
tmp, configs = sys.argv[1], [c.split()[0] for c in sys.argv[2:]]
check = Checks()
fail = check.fail
def records(run): return run_records(f"{tmp}/{run}")
# Everything but timings (and the fields that derive from them) must be equal.
def steps(run, kind="train"):
    return {r["step"]: without(r, MEASURED) for r in run_records(f"{tmp}/{run}", kind)}
for name in configs:
    ref, res = steps(name), steps(name + "_resumed")
    if sorted(res) != list(range(21, 41)): fail(f"{name}: resumed steps {sorted(res)}")
    bad = [s for s in res if res[s] != ref[s]]
    if bad: fail(f"{name}: steps {bad[:5]} differ after resume, e.g. {ref[bad[0]]} vs {res[bad[0]]}")
    vref, vres = steps(name, "val"), steps(name + "_resumed", "val")
    if any(vres[s] != vref[s] for s in vres): fail(f"{name}: validation differs after resume")
    if not check.failed: print(f"ok   {name}: steps 21-40 bitwise identical after resume"
                               + (f" (+{len(vres)} validations)" if vres else ""))
    if name.startswith("fp16") and not any(r["skipped"] for r in ref.values()): fail(f"{name}: no overflow step")
for line in open(f"{tmp}/pairs.txt"):
    name, src, step, tol = line.split(); step = int(step); tol = float(tol)
    a, b = steps(src), steps(name)
    first = step + 1
    err = rel(b[first]["loss"], a[first]["loss"])
    if err > tol: fail(f"{name}: first loss after resume {b[first]['loss']} vs {a[first]['loss']} (rel {err:.2e} > {tol})")
    if sorted(b) != list(range(first, max(b) + 1)) or not all(math.isfinite(r["loss"]) for r in b.values()):
        fail(f"{name}: training did not go on: steps {sorted(b)}")
    else: print(f"ok   {name}: first loss after resume within {err:.1e} of {src}'s (tolerance {tol:g}), {len(b)} steps")
for name, ref in (("killed", "s2_dp4"), ("signalled", "s2_dp4"), ("budget", "s2_dp4")):
    got, want = records(name), steps(ref)
    train = [r["step"] for r in got if r["kind"] == "train"]
    if train != list(range(1, 41)): fail(f"{name}: steps logged {train} (want 1..40 once each)")
    bad = [s for s, r in steps(name).items() if r != want[s]]
    if bad: fail(f"{name}: steps {bad[:5]} differ from the uninterrupted run")
    else: print(f"ok   {name}: metrics hold steps 1-40 once, equal to the uninterrupted run")
pairs = [l.split()[0] for l in open(f"{tmp}/pairs.txt")]
io = [r for run in configs + [c + "_resumed" for c in configs] + pairs for r in records(run) if r["kind"] == "checkpoint"]
saves, loads = (sum(r["action"] == a for r in io) for a in ("save", "load"))
# Two saves per reference run and two by the first pair; a load per resumed run and per pair.
if (saves, loads) != (2 * len(configs) + 2, len(configs) + len(pairs)):
    fail(f"checkpoint records: {saves} saves, {loads} loads")
elif any(r["independent_transfers"] != 0 or not r["bytes_per_s"] > 0 for r in io):
    fail(f"independent transfers or no bandwidth: {[(r['independent_transfers'], r['bytes_per_s']) for r in io]}")
else: print(f"ok   {saves} saves and {loads} loads, every transfer collective")
check.exit()
PY
