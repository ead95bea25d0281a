#!/usr/bin/env bash
# The fault sweep (issue #33): the POSIX calls a checkpoint save or load makes fail in turn, as
# SQLite tests its I/O. A fault hook pauses the run at a point of its save (or before its load)
# and names the paused rank's pid (ZERO3D_FAULT=pause_save_start|pause_save_middle|pause_load,
# train/fault.h); libfiu's fiu-ctrl then arms one failure point in that process (the ranks run
# under libfiu's POSIX preload). For every case:
#   - no crash and no hang (the watchdog is at 30 s, the case's limit at 90 s);
#   - a documented exit code: 0 (the failure was absorbed: a short write completed, a transient
#     read retried, or the call was not on the path), 7 (the save failed), 8 (an offload swap
#     file failed), 10 (a checkpoint could not be read); short reads and writes and a failed
#     read armed once must end with 0;
#   - when it fails: one "zero3d: error" line naming the system's errno text and the file;
#   - no .h5.tmp and no lock left; the last committed checkpoint verifies (zero3d ckpt verify);
#   - the run resumed from it (or the run itself) logs losses and gradient norms bitwise equal to
#     the uninterrupted run.
# Then the copy of the run's tokenizer beside the checkpoints (a pause before it: pause_tokenizer_copy)
# fails at two saves: a warning, once, and the saves go on.
# usage: test_faults.sh ZERO3D_BINARY SOURCE_DIR
#   FAULTS_FULL=1: the whole grid (every point x errno x failing ranks x position x async x offload;
#   about 40 minutes here); default: a sample that covers every point, errno, position and mode.
#   FAULTS_TABLE=FILE: also write the cases and their outcomes there (markdown rows).
set -u
source "$(dirname "$0")/common.sh" "$@"
command -v fiu-ctrl >/dev/null || fail "fiu-ctrl is missing: jobscripts/deps.sh installs fiu-utils with the test packages"
[[ -n ${ZERO3D_FIU_SHIM:-} && -f $ZERO3D_FIU_SHIM ]] || fail "ZERO3D_FIU_SHIM (the built tests/support/fiu_shim.cpp) is not set"
fiu_lib=/usr/lib/fiu
fiu=(env FIU_ENABLE= FIU_CTRL_FIFO="$tmp/fiu" LD_PRELOAD="$ZERO3D_FIU_SHIM:$fiu_lib/fiu_run_preload.so:$fiu_lib/fiu_posix_preload.so")

base=(input/gpt-tiny.json --peak-flops 1e11 --set data.val="" --set train_micro_batch_size_per_gpu=4
      --set zero_optimization.stage=1 --set checkpoint.save_interval=4 --set steps_per_print=1000 --set comm_timeout_s=30)
offload_args() {  # offload_args none|nvme DIR
  [[ $1 == nvme ]] && mkdir -p "$2/swap" &&
    echo "--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path=$2/swap"
}
# The train records' step, loss and grad norm, as written (17 significant digits).
records() {
  /usr/bin/python3 -c 'import sys; from z3dcheck import train
for r in train(sys.argv[1]): print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"
}
declare -A errtext=([5]="Input/output error" [28]="No space left on device" [30]="Read-only file system" [0]="")
declare -A errname=([5]=EIO [28]=ENOSPC [30]=EROFS [0]=-)

# The uninterrupted run (8 steps, checkpoints at 4 and 8), and a run that stopped at step 4 (the
# load cases resume it). Offloaded runs log bitwise the same losses (tests/cli/test_offload.sh).
timeout 120 $MPIRUN -np 2 "$z3d" train "${base[@]}" --set train_steps=8 --run-dir "$tmp/ref" > "$tmp/ref.log" 2>&1 ||
  { cat "$tmp/ref.log"; fail "the uninterrupted run failed"; }
records "$tmp/ref/metrics.jsonl" > "$tmp/ref.records"
[[ $(wc -l < "$tmp/ref.records") -eq 8 ]] || fail "the uninterrupted run logged $(wc -l < "$tmp/ref.records") steps"
timeout 120 $MPIRUN -np 2 "$z3d" train "${base[@]}" --set train_steps=4 --run-dir "$tmp/half" > "$tmp/half.log" 2>&1 ||
  { cat "$tmp/half.log"; fail "the 4-step run failed"; }

cases=0 failed=0 n=0
table() { [[ -n ${FAULTS_TABLE:-} ]] && echo "$*" >> "$FAULTS_TABLE"; return 0; }
bad() { echo "FAIL case $n ($what): $*"; sed 's/^/    | /' "$log" | grep -v "^    | step " | tail -15; failed=$((failed + 1)); }

# arm POINT ERRNO ONCE PAUSES: waits for PAUSES pause lines in $log and arms POINT in each paused pid.
arm() {
  local point=$1 err=$2 once=$3 want=$4 pids=() i
  for i in $(seq 1000); do
    mapfile -t pids < <(sed -n 's/^zero3d: fault injection: pid \([0-9]*\) pauses.*/\1/p' "$log" 2>/dev/null)
    ((${#pids[@]} >= want)) && break
    sleep 0.01
  done
  ((${#pids[@]} >= want)) || return 1
  local cmd="enable name=$point"
  ((err > 0)) && cmd+=",failinfo=$err"
  [[ $once == once ]] && cmd+=",onetime"
  for p in "${pids[@]}"; do fiu-ctrl -f "$tmp/fiu" -c "$cmd" "$p" || return 1; done
}

# check RC ALLOWED... : the invariants of every case; then resume and compare with the reference.
check() {
  local rc=$1 ok=0 a
  shift
  for a in "$@"; do [[ $rc == "$a" ]] && ok=1; done
  ((ok)) || { bad "exit code $rc, expected one of $*"; return 1; }
  if grep -qE "Segmentation fault|signal 11|signal 6|HDF5-DIAG|infinite loop|ORTE_ERROR_LOG" "$log"; then bad "a crash or a library's noise"; return 1; fi
  if ((rc != 0)); then
    [[ $(grep -c "^zero3d: error" "$log") -eq 1 ]] || { bad "not one error line"; return 1; }
    local line
    line=$(grep "^zero3d: error" "$log")
    [[ -z ${errtext[$err]} || $line == *"${errtext[$err]}"* ]] || { bad "the error line does not say '${errtext[$err]}'"; return 1; }
    [[ $line == *"'$dir/"* ]] || { bad "the error line names no file under the run dir"; return 1; }
  fi
  local left
  left=$(find "$dir" \( -name '*.h5.tmp' -o -name '.lock' \) 2>/dev/null)
  [[ -z $left ]] || { bad "left behind: $left"; return 1; }
  timeout 60 "$z3d" ckpt verify "$dir/checkpoints" > "$log.verify" 2>&1 || { log=$log.verify bad "the last checkpoint does not verify"; return 1; }
  if ((rc != 0)); then  # resume from the last committed checkpoint, without faults
    timeout 120 $MPIRUN -np 2 "$z3d" train "${base[@]}" --set train_steps=8 --run-dir "$dir" --set checkpoint.load=auto \
      $(offload_args "$offload" "$dir") > "$log.resume" 2>&1 || { log=$log.resume bad "the resume failed"; return 1; }
  fi
  records "$dir/metrics.jsonl" | cmp -s - "$tmp/ref.records" || { bad "the losses differ from the uninterrupted run"; return 1; }
  return 0
}

# save_case POINT ERRNO RANKS(0|1|all) POS(start|middle) ASYNC OFFLOAD
save_case() {
  local point=$1 err=$2 ranks=$3 pos=$4 async=$5 offload=$6 faults="" r want=1
  n=$((n + 1)) cases=$((cases + 1))
  what="save: $point ${errname[$err]} on rank $ranks at the $pos, async $async, offload $offload"
  dir=$tmp/c$n log=$tmp/c$n.log
  for r in 0 1; do [[ $ranks == all || $ranks == "$r" ]] && faults+="${faults:+,}pause_save_$pos:$r:8"; done
  [[ $ranks == all ]] && want=2
  ZERO3D_FAULT=$faults timeout 90 $MPIRUN -np 2 "${fiu[@]}" "$z3d" train "${base[@]}" --set train_steps=8 --run-dir "$dir" \
    --set checkpoint.async="$async" $(offload_args "$offload" "$dir") > "$log" 2>&1 &
  local launcher=$! rc=0
  local armed=1
  arm "$point" "$err" once "$want" || armed=0
  wait $launcher || rc=$?
  ((armed)) || { bad "no paused rank to arm (the pause hook did not fire)"; return; }
  local allowed=(0 7 8)
  [[ $point == */reduce ]] && allowed=(0)  # a short write is completed, never an error
  if check $rc "${allowed[@]}"; then
    echo "ok   case $n ($what): exit $rc"
    table "| $point | ${errname[$err]} | $ranks | $pos | $async | $offload | $rc |"
  fi
}

# load_case POINT ERRNO RANKS(0|1|all) ONCE(once|always) OFFLOAD: resumes the 4-step run.
load_case() {
  local point=$1 err=$2 ranks=$3 once=$4 offload=$5 faults="" r want=1
  n=$((n + 1)) cases=$((cases + 1))
  what="load: $point ${errname[$err]} $once on rank $ranks, offload $offload"
  dir=$tmp/c$n log=$tmp/c$n.log
  cp -a "$tmp/half" "$dir"
  for r in 0 1; do [[ $ranks == all || $ranks == "$r" ]] && faults+="${faults:+,}pause_load:$r:0"; done
  [[ $ranks == all ]] && want=2
  ZERO3D_FAULT=$faults timeout 90 $MPIRUN -np 2 "${fiu[@]}" "$z3d" train "${base[@]}" --set train_steps=8 --run-dir "$dir" \
    --set checkpoint.load=auto $(offload_args "$offload" "$dir") > "$log" 2>&1 &
  local launcher=$! rc=0
  local armed=1
  arm "$point" "$err" "$once" "$want" || armed=0
  wait $launcher || rc=$?
  ((armed)) || { bad "no paused rank to arm (the pause hook did not fire)"; return; }
  local allowed=(0 10)
  [[ $once == once || $point == */reduce ]] && allowed=(0)  # one failed read is retried; a short one completed
  if check $rc "${allowed[@]}"; then
    if ((rc == 10)) && grep -q "trying an older one" "$log"; then bad "an I/O error fell back to an older checkpoint"; return; fi
    echo "ok   case $n ($what): exit $rc"
    table "| $point | ${errname[$err]} ($once) | $ranks | load | - | $offload | $rc |"
  fi
}

# The calls a save makes. Not write(): no save calls it (data and metadata go by pwrite, `latest`
# by stdio, whose own write libfiu does not see), so an armed write() fails the next one the
# process makes, OpenMPI's own at MPI_Finalize, and mpirun waits forever.
save_points=(posix/io/rw/pwrite posix/io/rw/pwrite/reduce posix/io/sync/fsync posix/io/oc/open posix/io/dir/rename
             posix/io/rw/ftruncate)
errs=(5 28 30)
rank_sets=(0 1 all)
[[ -n ${FAULTS_TABLE:-} ]] && printf '| failure point | errno | ranks | where | async | offload | exit |\n|---|---|---|---|---|---|---|\n' > "$FAULTS_TABLE"
if [[ ${FAULTS_FULL:-0} == 1 ]]; then
  for point in "${save_points[@]}"; do
    for err in "${errs[@]}"; do
      [[ $point == */reduce ]] && { [[ $err == 5 ]] || continue; err=0; }
      for ranks in "${rank_sets[@]}"; do
        for pos in start middle; do
          for async in true false; do
            for offload in none nvme; do save_case "$point" "$err" "$ranks" "$pos" "$async" "$offload"; done
          done
        done
      done
    done
  done
  for ranks in "${rank_sets[@]}"; do
    for offload in none nvme; do
      load_case posix/io/rw/pread 5 "$ranks" once "$offload"
      load_case posix/io/rw/pread 5 "$ranks" always "$offload"
      load_case posix/io/rw/pread/reduce 0 "$ranks" always "$offload"
      load_case posix/io/oc/open 5 "$ranks" always "$offload"
    done
  done
else
  # The sample: each save point three times, the errno, the failing ranks, the position, async and
  # offload each turning at its own pace, so every value of each meets several points.
  i=0
  for point in "${save_points[@]}"; do
    for k in 0 1 2; do
      err=${errs[$(((i + k) % 3))]}
      [[ $point == */reduce ]] && err=0
      pos=(start middle); async=(true false); offload=(none nvme none)
      save_case "$point" "$err" "${rank_sets[$(((i + 2 * k) % 3))]}" "${pos[$(((i + k) % 2))]}" "${async[$((i % 2))]}" \
        "${offload[$(((i + k) % 3))]}"
    done
    i=$((i + 1))
  done
  load_case posix/io/rw/pread 5 all once none
  load_case posix/io/rw/pread 5 1 always none
  load_case posix/io/rw/pread 5 0 always nvme
  load_case posix/io/rw/pread/reduce 0 all always none
  load_case posix/io/oc/open 5 0 always none
fi

# The tokenizer copy: a run with a tokenizer file copies it beside its checkpoints before each save
# until the copy is there (ckpt/tokenizer_record.h). Rank 0 pauses before each copy (saves at 4 and
# 8) and its fsync is armed to fail once (ENOSPC): each copy fails, the run warns once, and the
# saves go on: exit 0, the checkpoints verify, the losses are the uninterrupted run's, no part of a
# copy is left; a resume from step 4 trains steps 5-8 to the same losses (and makes its own copy).
n=$((n + 1)) cases=$((cases + 1))
what="the tokenizer copy: fsync ENOSPC at both saves"
dir=$tmp/c$n log=$tmp/c$n.log err=28 offload=none
if timeout 60 "$z3d" ckpt export "$tmp/ref/checkpoints" --format hf --out "$tmp/hf" > "$log" 2>&1; then
  tok=(--set data.tokenizer="$tmp/hf/tokenizer.json")  # the byte tokenizer as a tokenizer.json: a file to copy
  ZERO3D_FAULT=pause_tokenizer_copy:0:4,pause_tokenizer_copy:0:8 timeout 90 $MPIRUN -np 2 "${fiu[@]}" "$z3d" train \
    "${base[@]}" "${tok[@]}" --set train_steps=8 --run-dir "$dir" > "$log" 2>&1 &
  launcher=$! rc=0 armed=1
  arm posix/io/sync/fsync 28 once 1 && arm posix/io/sync/fsync 28 once 2 || armed=0
  wait $launcher || rc=$?
  if ((!armed)); then
    bad "no paused rank to arm before a tokenizer copy"
  elif check $rc 0; then
    warned=$(grep -c "cannot write tokenizer copy '$dir/checkpoints/tokenizer-[0-9a-f]*\.json\.tmp': No space left" "$log")
    if [[ $warned != 1 || $(grep -c "tokenizer copy" "$log") != 1 ]]; then
      bad "$warned warnings of the failed copy, want 1"
    elif compgen -G "$dir/checkpoints/tokenizer-*" > /dev/null; then
      bad "a failed copy left $(ls "$dir/checkpoints" | grep tokenizer-)"
    elif ! timeout 120 $MPIRUN -np 2 "$z3d" train "${base[@]}" "${tok[@]}" --set train_steps=8 --run-dir "$dir.resumed" \
           --set checkpoint.load=\""$dir/checkpoints/step_00000004.h5"\" > "$log.resume" 2>&1; then
      log=$log.resume bad "the resume from step 4 failed"
    elif ! records "$dir.resumed/metrics.jsonl" | cmp -s - <(tail -4 "$tmp/ref.records"); then
      log=$log.resume bad "the resume from step 4 trained other losses than the uninterrupted run"
    elif ! compgen -G "$dir.resumed/checkpoints/tokenizer-*.json" > /dev/null; then
      log=$log.resume bad "the resumed run made no tokenizer copy"
    else
      echo "ok   case $n ($what): exit 0, one warning, the checkpoints verify, resumed"
      table "| posix/io/sync/fsync (the tokenizer copy) | ENOSPC | 0 | before the save | true | none | 0 |"
    fi
  fi
else
  bad "ckpt export (the tokenizer file) failed"
fi
echo "faults: $((cases - failed)) passed, $failed failed"
((failed == 0))
