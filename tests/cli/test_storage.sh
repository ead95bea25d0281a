#!/usr/bin/env bash
# Storage that misbehaves, and saves in the background (issue: checkpoints that never cost a run).
# Real failures where the machine allows: a read-only bind mount and small tmpfs mounts (root);
# the fault hooks place them in time (fill_disk/free_disk fill and free the checkpoint file
# system before a given save; stall_save hangs one rank's writer). Every case checks that no
# job hangs, that `latest` names the last good checkpoint, that no .tmp or lock is left behind,
# and that a resume picks up from the last good checkpoint.
# usage: test_storage.sh ZERO3D_BINARY SOURCE_DIR   (exit 77 = skipped: mounts not permitted)
set -u
source "$(dirname "$0")/common.sh" "$@"
mnt="$tmp/mnt"
mkdir -p "$mnt/ro_src" "$mnt/ro" "$mnt/small" "$mnt/mid" "$mnt/swap"
cleanup() {
  stop_jobs
  for m in "$mnt/ro" "$mnt/small" "$mnt/mid" "$mnt/swap"; do mountpoint -q "$m" && umount "$m"; done
  rm -rf "$tmp"
}
trap cleanup EXIT
if ! mount --bind "$mnt/ro_src" "$mnt/ro" 2>/dev/null || ! mount -o remount,bind,ro "$mnt/ro" 2>/dev/null ||
   ! mount -t tmpfs -o size=12m tmpfs "$mnt/small" 2>/dev/null || ! mount -t tmpfs -o size=40m tmpfs "$mnt/mid" ||
   ! mount -t tmpfs -o size=4m tmpfs "$mnt/swap"; then
  echo "SKIP: this machine does not let the test mount file systems (needs root)"
  exit 77
fi

tiny=(input/gpt-tiny.json --peak-flops 1e11 --set data.val="" --set train_micro_batch_size_per_gpu=4)
run() {  # run NAME NP ARGS...: the exit code in $rc, the output in $tmp/NAME.log
  local name=$1 np=$2
  shift 2
  rc=0
  timeout 120 $MPIRUN -np "$np" "$z3d" train "${tiny[@]}" "$@" > "$tmp/$name.log" 2>&1 || rc=$?
}
no_leftovers() {  # no_leftovers NAME DIR...: no .tmp checkpoint, no lock, no probe file
  local name=$1 left
  shift
  left=$(find "$@" \( -name '*.h5.tmp' -o -name '.lock' -o -name '.probe.*' \) 2>/dev/null)
  [[ -z $left ]] || fail "$name: left behind: $left"
}
train_steps() {  # train_steps METRICS: the step numbers of the train records, space-separated
  /usr/bin/python3 -c 'import sys; from z3dcheck import train; print(" ".join(str(r["step"]) for r in train(sys.argv[1])))' "$1"
}

# ---- 1. a checkpoint directory that exists but cannot be written: exit 2 before training ----
run ro 2 --run-dir "$tmp/ro_run" --set checkpoint.dir="$mnt/ro" --set checkpoint.save_interval=5 --set train_steps=10
expect_rc ro 2
has ro "^zero3d: error: checkpoint directory \(checkpoint.dir\) is not writable from rank 0: cannot create a file in '$mnt/ro': Read-only file system$"
[[ ! -e $tmp/ro_run ]] || fail "ro: the run dir was created by a run that never started"
! grep -q "^step " "$tmp/ro.log" || fail "ro: it trained"
echo "ok   read-only checkpoint.dir: exit 2 before training, nothing written"

# ---- 2. too little free space for what the run keeps: exit 2 with the numbers ----
run full 2 --run-dir "$tmp/full_run" --set checkpoint.dir="$mnt/small/ck" --set checkpoint.save_interval=3 --set train_steps=8
expect_rc full 2
has full "^zero3d: error: checkpoint directory '$mnt/small/ck' has 1[0-9]\.[0-9] MB free, but this run needs 30\.0 MB more there \(3 saves of 10\.0 MB, checkpoint.keep_last 0, 0 checkpoints there now\)"
[[ ! -e $tmp/full_run && ! -e $mnt/small/ck ]] || fail "full: directories left behind"
echo "ok   free space checked at start: exit 2 naming the numbers"

# ---- 3. the disk fills during the run: exit 7, one clear line, latest untouched, resume works ----
ck="$mnt/mid/ck"
ZERO3D_FAULT=fill_disk:0:6 run enospc 2 --run-dir "$tmp/enospc" --set checkpoint.dir="$ck" \
  --set checkpoint.save_interval=3 --set checkpoint.keep_last=1 --set train_steps=12
expect_rc enospc 7
has enospc "^zero3d: error: checkpoint of step 6 failed: rank [01] \([^)]*\): writing '$ck/step_00000006.h5.tmp': No space left on device; the partial file is removed and 'latest' still names step_00000003.h5; stopping"
[[ $(grep -c "No space left" "$tmp/enospc.log") -eq 1 ]] || { cat "$tmp/enospc.log"; fail "enospc: not one line"; }
! grep -q "HDF5-DIAG" "$tmp/enospc.log" || fail "enospc: HDF5's error stack reached the terminal"
[[ $(cat "$ck/latest") == step_00000003.h5 ]] || fail "enospc: latest is $(cat "$ck/latest")"
no_leftovers enospc "$ck" "$tmp/enospc"
rm "$ck/.fill"
run enospc_resume 2 --run-dir "$tmp/enospc" --set checkpoint.dir="$ck" --set checkpoint.save_interval=3 \
  --set checkpoint.keep_last=1 --set train_steps=12 --set checkpoint.load=auto
expect_rc enospc_resume 0
has enospc_resume "resumed from $ck/step_00000003.h5 at step 3"
[[ $(train_steps "$tmp/enospc/metrics.jsonl") == "1 2 3 4 5 6 7 8 9 10 11 12" ]] ||
  fail "enospc: the resumed run's metrics hold steps $(train_steps "$tmp/enospc/metrics.jsonl")"
[[ $(cat "$ck/latest") == step_00000012.h5 ]] || fail "enospc: resume did not reach step 12"
no_leftovers enospc_resume "$ck" "$tmp/enospc"
echo "ok   disk full mid-run: exit 7, one line, latest untouched, resume from step 3"

# ---- 4. checkpoint.on_failure = continue: the run goes on and the next save succeeds ----
rm -rf "$ck"
ZERO3D_FAULT=fill_disk:0:6,free_disk:0:9 run continue 2 --run-dir "$tmp/continue" --set checkpoint.dir="$ck" \
  --set checkpoint.save_interval=3 --set checkpoint.keep_last=1 --set train_steps=12 --set checkpoint.on_failure=continue
expect_rc continue 0
has continue "checkpoint of step 6 failed: .*No space left on device.*training goes on"
has continue "step +9 \| checkpoint $ck/step_00000009.h5"
[[ $(cat "$ck/latest") == step_00000012.h5 ]] || fail "continue: latest is $(cat "$ck/latest")"
grep -q '"step": 6, "action": "save".*"error": "checkpoint of step 6 failed' "$tmp/continue/metrics.jsonl" ||
  fail "continue: no error in the checkpoint record of step 6"
no_leftovers continue "$ck" "$tmp/continue"
echo "ok   on_failure=continue: training went on, the step 9 save committed"

# ---- 5. a rank hangs inside a save: the watchdog aborts the job (exit 3) naming it ----
for mode in true false; do
  name=stall_$mode
  start=$(date +%s)
  ZERO3D_FAULT=stall_save:1:10 run $name 2 --run-dir "$tmp/$name" --set checkpoint.save_interval=5 \
    --set train_steps=40 --set comm_timeout_s=8 --set checkpoint.async=$mode
  expect_rc $name 3
  (($(date +%s) - start < 60)) || fail "$name: took $(($(date +%s) - start)) s"
  [[ $(grep -c "^zero3d: watchdog:" "$tmp/$name.log") -eq 1 ]] || { cat "$tmp/$name.log"; fail "$name: not one line"; }
  has $name "^zero3d: watchdog: at step [0-9]+, rank [01]'s .* passed its limit of ([89]|[1-9][0-9]+) s .*checkpoint save of step 10.* rank 1 \([^)]*\): .*thread in checkpoint save of step 10 \(writing its pieces: dataset [0-9]+ of 156\)"
  [[ $(cat "$tmp/$name/checkpoints/latest") == step_00000005.h5 ]] || fail "$name: latest moved"
  run ${name}_resume 2 --run-dir "$tmp/$name" --set checkpoint.save_interval=5 --set train_steps=12 \
    --set checkpoint.load=auto
  expect_rc ${name}_resume 0
  has ${name}_resume "resumed from $tmp/$name/checkpoints/step_00000005.h5 at step 5"
  no_leftovers ${name}_resume "$tmp/$name"
done
echo "ok   a rank hung in a save (async and in place): exit 3 in one line naming rank 1; resume from step 5"

# ---- 6. one run per run dir: a second is refused naming the holder; a dead run's lock is taken over ----
$MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/locked" --set train_steps=100000 > "$tmp/holder.log" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/holder.log" && break; sleep 0.1; done
run second 2 --run-dir "$tmp/locked" --set train_steps=4
expect_rc second 2
has second "^zero3d: error: run directory '$tmp/locked' is in use by another zero3d run \(host [^ ]+ pid [0-9]+ since [0-9T:-]+; lock file $tmp/locked/.lock\)"
kill -USR1 $holder
wait $holder
holder_rc=$?
[[ $holder_rc -eq 6 ]] || { cat "$tmp/holder.log"; fail "the first run ended with $holder_rc after SIGUSR1, expected 6"; }
echo "host gone pid 999999 since 2026-01-01T00:00:00" > "$tmp/locked/.lock"  # a dead run's lock
run takeover 2 --run-dir "$tmp/locked" --set train_steps=4
expect_rc takeover 0
has takeover "run directory '$tmp/locked' was locked by a run that is gone \(host gone pid 999999 since 2026-01-01T00:00:00\); taking it over"
no_leftovers takeover "$tmp/locked"
echo "ok   a second run on a run dir: exit 2 naming the holder; a dead run's lock taken over; no lock left"

# ---- 7. SIGTERM to mpirun: every rank checkpoints and says exit 6; OpenMPI's mpirun returns 1 ----
# OpenMPI's mpirun passes SIGTERM on 1 s after it got it and SIGKILLs 1 s later (odls_base_sigkill_timeout,
# default 1): on a loaded machine a rank's checkpoint can need more; src/ckpt/README.md says to raise it.
OMPI_MCA_odls_base_sigkill_timeout=10 $MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/term" --set train_steps=100000 > "$tmp/term.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/term.log" && break; sleep 0.1; done
kill -TERM $launcher
wait $launcher
term_rc=$?
[[ $(grep -c "stopping after step [0-9]* on SIGTERM: the checkpoint is committed" "$tmp/term.log") -eq 2 ]] ||
  { cat "$tmp/term.log"; fail "term: not every rank stopped with a committed checkpoint"; }
step=$(sed -n 's/.*stopping after step \([0-9]*\) on SIGTERM.*/\1/p' "$tmp/term.log" | head -1)
[[ $(cat "$tmp/term/checkpoints/latest") == $(printf step_%08d.h5 "$step") ]] || fail "term: latest is not step $step"
[[ $term_rc -eq 1 ]] || fail "term: mpirun returned $term_rc; the README says OpenMPI's mpirun returns 1 on SIGTERM"
echo "ok   SIGTERM to mpirun: checkpoint at step $step, every rank says exit 6, mpirun returns 1 (README)"

# ---- 8. the training file truncated under the run: one clear line, exit 2, no SIGBUS ----
cp input/data/train.bin "$tmp/train.bin"
$MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/trunc" --set data.train="$tmp/train.bin" \
  --set train_steps=100000 > "$tmp/trunc.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/trunc.log" && break; sleep 0.1; done
truncate -s 4096 "$tmp/train.bin"
wait $launcher
rc=$?
expect_rc trunc 2
has trunc "^zero3d: error \(rank [01], [^)]*\): token file '$tmp/train.bin' changed under the run: tokens [0-9]+-[0-9]+ can no longer be read \(end of file\)"
! grep -qiE "bus error|signal 7" "$tmp/trunc.log" || fail "trunc: a SIGBUS"
# Both ranks read the file: one line for the job, and no OpenMPI noise from two aborts at once.
[[ $(grep -c "^zero3d: error" "$tmp/trunc.log") -eq 1 ]] || { cat "$tmp/trunc.log"; fail "trunc: not one error line"; }
! grep -q "ORTE_ERROR_LOG" "$tmp/trunc.log" || { cat "$tmp/trunc.log"; fail "trunc: OpenMPI's ORTE_ERROR_LOG"; }
echo "ok   training file truncated mid-run: exit 2 naming it, no SIGBUS"

# ---- 9. background saves change nothing: the same metrics and files as saves in place ----
for mode in true false; do
  run same_$mode 4 --run-dir "$tmp/same_$mode" --set zero_optimization.stage=3 --set tensor_parallel.tp_size=2 \
    --set bf16.enabled=true --set checkpoint.save_interval=2 --set train_steps=6 --set checkpoint.async=$mode
  expect_rc same_$mode 0
done
grep -q '"checkpoint_writes": "background' "$tmp/same_true/metrics.jsonl" || fail "async: the run record says no background writes"
grep -q '"checkpoint_writes": "in place (checkpoint.async is false)"' "$tmp/same_false/metrics.jsonl" || fail "sync: run record"
/usr/bin/python3 - "$tmp/same_true" "$tmp/same_false" <<'PY' || fail "async and in-place saves differ"
import h5py, sys
from z3dcheck import MEASURED, dataset_names, train as run_train
def train(d):  # less what is measured (every *_s among it) and backend_allocs
    return [{k: v for k, v in r.items() if not (k.endswith("_s") or k in MEASURED | {"backend_allocs"})} for r in run_train(d)]
a, b = sys.argv[1:3]
assert train(a) == train(b), "train records differ"
for step in (2, 4, 6):
    f = "/checkpoints/step_%08d.h5" % step
    with h5py.File(a + f) as x, h5py.File(b + f) as y:
        names = dataset_names(x)
        assert len(names) == 208, len(names)
        for n in names:
            assert x[n].attrs["checksum"] == y[n].attrs["checksum"], n
            assert (x[n][()] == y[n][()]).all(), n
print("same metrics and 3 x 208 identical datasets")
PY
echo "ok   background and in-place saves: the same metrics and the same checkpoint files"

# ---- 10. offload to nvme on storage that cannot take it: exit 2 at start, nothing left behind ----
swap_opt=(--set zero_optimization.stage=1 --set zero_optimization.offload_optimizer.device=nvme)
run swap_ro 2 --run-dir "$tmp/swap_ro" --set train_steps=4 "${swap_opt[@]}" \
  --set zero_optimization.offload_optimizer.nvme_path="$mnt/ro"
expect_rc swap_ro 2
has swap_ro "^zero3d: error: zero_optimization.offload_optimizer.nvme_path is not writable from rank 0: cannot create a file in '$mnt/ro': Read-only file system$"
# 2 ranks x 3.3 MB of Adam moments on a 4 MiB tmpfs: the second reservation fails.
run swap_full 2 --run-dir "$tmp/swap_full" --set train_steps=4 "${swap_opt[@]}" \
  --set zero_optimization.offload_optimizer.nvme_path="$mnt/swap"
expect_rc swap_full 2
has swap_full "^zero3d: error: offload to nvme: cannot reserve 3\.[0-9] MB for swap file '$mnt/swap/zero3d-[0-9a-f]{8}/rank[01]\.[0-9]+\.optimizer': No space left on device \([0-9.]+ MB free there\)$"
[[ ! -e $tmp/swap_ro && ! -e $tmp/swap_full ]] || fail "swap: a run dir was created by a run that never started"
[[ -z $(find "$mnt/swap" -mindepth 1) ]] || fail "swap_full: left behind: $(find "$mnt/swap" -mindepth 1)"
echo "ok   offload to nvme: a read-only or too small nvme_path is refused at start (exit 2), nothing left"
# ---- 11. two runs, their own run dirs, one checkpoint.dir: the second is refused naming the holder ----
shared="$tmp/shared_ck"
$MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/writer1" --set checkpoint.dir="$shared" \
  --set checkpoint.save_interval=5 --set checkpoint.keep_last=2 --set train_steps=100000 > "$tmp/writer1.log" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/writer1.log" && break; sleep 0.1; done
run writer2 2 --run-dir "$tmp/writer2" --set checkpoint.dir="$shared" --set checkpoint.save_interval=7 \
  --set checkpoint.keep_last=2 --set train_steps=14 --set seed=99
expect_rc writer2 2
has writer2 "^zero3d: error: checkpoint directory \(checkpoint.dir\) '$shared' is in use by another zero3d run \(host [^ ]+ pid [0-9]+ since [0-9T:-]+; lock file $shared/.lock\)"
[[ ! -e $tmp/writer2 ]] || fail "writer2: the refused run left its run dir"
# A reader (no saves, so no lock) racing the writer's pruning (keep_last 1, a save every step)
# re-reads 'latest' instead of calling the pruned file corrupt.
kill -USR1 $holder; wait $holder
$MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/writer1" --set checkpoint.dir="$shared" --set checkpoint.load=auto \
  --set checkpoint.save_interval=1 --set checkpoint.keep_last=1 --set train_steps=100000 > "$tmp/writer1b.log" 2>&1 &
holder=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/writer1b.log" && break; sleep 0.1; done
for k in 1 2 3 4 5 6; do
  run reader$k 1 --run-dir "$tmp/reader$k" --set checkpoint.dir="$shared" --set checkpoint.load=auto \
    --set checkpoint.save_interval=0 --set train_steps=1
  expect_rc reader$k 0
  has reader$k "resumed from $shared/step_[0-9]+.h5"
  ! grep -qiE "corrupt|truncated" "$tmp/reader$k.log" || { cat "$tmp/reader$k.log"; fail "reader$k: a pruned file was called bad"; }
done
kill -USR1 $holder; wait $holder
no_leftovers lock "$shared" "$tmp/writer1"
echo "ok   one checkpoint.dir, two runs: the second is refused naming the holder; readers racing the pruning load"
# ---- 12. the run dir removed under the run: not "done", exit 7 naming what is gone ----
$MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/removed" --set checkpoint.save_interval=0 \
  --set train_steps=300 > "$tmp/removed.log" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -q "^step " "$tmp/removed.log" && break; sleep 0.1; done
rm -rf "$tmp/removed"
rc=0; wait $launcher || rc=$?
expect_rc removed 7
has removed "^zero3d: error: the run directory '$tmp/removed' was removed while the run went on: its metrics.jsonl, its checkpoints and its lock are gone"
! grep -q "zero3d: done" "$tmp/removed.log" || fail "removed: it said done"
echo "ok   the run dir removed mid-run: exit 7, not done"
echo "storage: all passed"
