#!/usr/bin/env bash
# Safety nets: the replica consistency check names a deliberately perturbed tensor and stops
# with exit code 4; the collective watchdog turns a rank that never joins a collective into an
# abort with rank/group/operation/step within comm_timeout_s instead of a hang.
# usage: test_safety.sh ZERO3D_BINARY SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh" "$@"
fails=0; passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
train() {  # train NP [args...]
  local np=$1; shift
  timeout 120 $MPIRUN -np "$np" "$z3d" train input/gpt-tiny.json --peak-flops 1e11 \
    --set data.val="" --set train_steps=8 --set train_micro_batch_size_per_gpu=4 "$@"
}

# 1. consistency check on a healthy run: passes
train 2 --run-dir "$tmp/healthy" --set zero_optimization.stage=1 --set zero_optimization.consistency_check_interval=2 \
  > "$tmp/healthy.log" 2>&1 && ok || { bad "healthy run with consistency checks failed"; cat "$tmp/healthy.log"; }

# 2. a perturbed replica is caught, named, and stops the run with exit code 4
ZERO3D_FAULT=perturb:1:4 train 2 --run-dir "$tmp/perturbed" --set zero_optimization.stage=1 \
  --set zero_optimization.consistency_check_interval=2 > "$tmp/perturbed.log" 2>&1
rc=$?
[[ $rc -eq 4 ]] && ok || bad "perturbed replica: exit code $rc, expected 4"
grep -q "consistency check at step 4: parameter 'wte' differs between data-parallel ranks 0 and 1" "$tmp/perturbed.log" \
  && ok || { bad "perturbed replica: message"; cat "$tmp/perturbed.log"; }

# 3. a rank that never joins the gradient reduction: the watchdog aborts within the timeout
start=$(date +%s)
ZERO3D_FAULT=hang:1:3 train 2 --run-dir "$tmp/hang" --set comm_timeout_s=5 > "$tmp/hang.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
[[ $rc -eq 3 ]] && ok || bad "watchdog: exit code $rc, expected 3 (124 = the test's own timeout fired)"
# One line for the job, naming where every rank is: rank 1 is the one not in the collective.
[[ $(grep -c "zero3d: watchdog:" "$tmp/hang.log") -eq 1 ]] && ok || { bad "watchdog: not one line"; cat "$tmp/hang.log"; }
grep -q "zero3d: watchdog: at step 3, rank 0's training thread passed its limit of 5 s in all-reduce #[0-9]* on the dp group\. Where every rank is: rank 0 ([^)]*): training thread in all-reduce #[0-9]* on the dp group for [0-9]* s; rank 1 ([^)]*): training thread computing, in no collective or I/O, for [0-9]* s\." \
  "$tmp/hang.log" && ok || { bad "watchdog: message"; cat "$tmp/hang.log"; }
(( elapsed < 60 )) && ok || bad "watchdog: took ${elapsed}s"
echo "safety: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
