#!/usr/bin/env bash
# The job scripts under a real Slurm: a private single-node cluster (slurm_up.sh: munge, slurmctld,
# slurmd, srun --mpi=pmix) runs gpt-tiny (global batch 8) on 4 overcommitted ranks (dp 4):
#  a. requeue: train.sbatch gets `scancel --signal=USR1 --batch` after a few steps; the ranks
#     checkpoint and exit 6, the script requeues the job, the requeued job resumes that checkpoint
#     and finishes (COMPLETED, 1 restart); its train records (every field but the timings) equal an
#     uninterrupted run's bit for bit, and hold every step once;
#  b. time limit: a job with --time=1 and --signal=B:USR1@50 gets USR1 from Slurm, checkpoints,
#     requeues, resumes, and after the next USR1 stops with a checkpoint without requeueing again
#     (ZERO3D_MAX_REQUEUES=1): FAILED with exit code 6, 1 restart;
#  e. cancel: `scancel` (SIGTERM to every process) still leaves a checkpoint, and the job ends
#     CANCELLED without a requeue;
#  c. chain: chain.sh submits 3 dependent jobs that each stop on run.max_minutes; jobs 2 and 3 resume
#     the previous one's checkpoint, none requeues itself, the merged metrics hold steps 1..K once
#     each and equal an uninterrupted run's first K steps bit for bit;
#  d. sweep: sweep.sh runs 6 layouts (dp 1/2/4 strong scaling, tp 2, pp 2, a weak-scaling run),
#     writes study.json, and postprocess/scaling.py turns the study into a table with one row per
#     run in study.json and PNG plots that are images with content.
# The node has 2 CPUs and each -O job takes one, so jobs queue behind each other: every wait allows
# for that. On failure prints the job outputs and the daemon logs. Needs root (slurmd). About 2 min.
# usage: test_slurm.sh ZERO3D_BINARY SOURCE_DIR
set -eu
z3d=$(realpath "$1")
cd "$2"
py=/usr/bin/python3
# The checks' Python imports what they share from tests/cli/z3dcheck.py (tests/cli/common.sh sets the same).
export PYTHONPATH=$PWD/tests/cli${PYTHONPATH:+:$PYTHONPATH}
tmp=$(mktemp -d)
t_start=$SECONDS
# A Slurm job around this test (CI inside an allocation) must not leak into the jobs it submits.
for v in $(compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_|SALLOC_)' || true); do unset "$v"; done
# ZERO3D_KEEP_TMP=1 keeps the scratch directory (job outputs, run dirs, daemon logs) for a look.
cleanup() {
  tests/slurm/slurm_down.sh "$tmp/slurm"
  if [[ ${ZERO3D_KEEP_TMP:-0} == 1 ]]; then echo "test_slurm: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
dump() {
  for f in "$tmp"/*.out "$tmp"/study/*.out; do
    [[ -f $f ]] && { echo "===== $f"; cat "$f"; }
  done
  timeout 10 squeue 2>&1 || true
  tests/slurm/slurm_down.sh --logs "$tmp/slurm"
}
fail() { echo "FAIL: $*"; dump; exit 1; }
ok() { echo "ok   $* ($((SECONDS - t_start)) s)"; }

tests/slurm/slurm_up.sh "$tmp/slurm" || fail "could not start the test cluster"
source "$tmp/slurm/env.sh"
export ZERO3D_BIN=$z3d ZERO3D_ROOT=$PWD
timeout 20 srun --mpi=list 2>&1 | grep -q pmix || fail "srun has no pmix plugin (slurm-wlm-basic-plugins)"

base=(input/gpt-tiny.json --peak-flops 1e11 --set data.val= --set train_batch_size=8
      --set gradient_accumulation_steps=1 --set train_micro_batch_size_per_gpu=2)
submit() {  # submit NAME [SBATCH_ARGS...] -- TRAIN_ARGS...: train.sbatch on 4 ranks into $tmp/NAME
  local name=$1 sb=()
  shift
  while [[ $1 != -- ]]; do sb+=("$1"); shift; done
  shift
  RUN_DIR=$tmp/$name timeout 60 sbatch --parsable -n 4 -O --output="$tmp/$name.out" "${sb[@]}" jobscripts/train.sbatch "$@" ||
    fail "sbatch $name"
}
field() { timeout 20 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }  # field JOB KEY
wait_done() {  # wait_done JOB TIMEOUT_S: until the job has ended (a requeued job is pending, not ended)
  local j=$1 deadline=$((SECONDS + $2)) s
  while :; do
    s=$(field "$j" JobState)
    case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) return 0 ;; esac
    ((SECONDS < deadline)) || fail "job $j still '$s' after $2 s"
    sleep 0.5
  done
}
expect_job() {  # expect_job JOB STATE EXITCODE RESTARTS (EXITCODE '*': any)
  local s e r
  s=$(field "$1" JobState) e=$(field "$1" ExitCode) r=$(field "$1" Restarts)
  # shellcheck disable=SC2053  # $3 is a pattern on purpose
  [[ $s == "$2" && $e == $3 && $r == "$4" ]] ||
    fail "job $1: state $s, exit code $e, restarts $r; expected $2, $3, $4"
}
wait_steps() {  # wait_steps DIR N JOB: until DIR/metrics.jsonl has N train records (the job must run on)
  local deadline=$((SECONDS + 180)) n
  while :; do
    n=$(grep -c '"kind": "train"' "$1/metrics.jsonl" 2>/dev/null || true)
    ((${n:-0} >= $2)) && return 0
    ((SECONDS < deadline)) || fail "$1: $n train records after 180 s"
    [[ $(field "$3" JobState) == @(RUNNING|PENDING) ]] || fail "job $3 ended before $2 steps"
    sleep 0.2
  done
}
has() { grep -qE -- "$2" "$1" || fail "$1 lacks /$2/"; }
hasnt() { ! grep -qE -- "$2" "$1" || fail "$1 has /$2/"; }
# same_metrics RUN REF [STEPS]: RUN's train records hold steps 1..K once each (K = STEPS, or RUN's
# last) and equal REF's steps 1..K in every field but the timings, bit for bit. Prints K.
same_metrics() {
  "$py" - "$@" <<'EOF'
import sys
from z3dcheck import MEASURED, train as run_train, without
def train(run): return [without(r, MEASURED) for r in run_train(run)]
run, ref = train(sys.argv[1]), train(sys.argv[2])
steps = [r["step"] for r in run]
k = int(sys.argv[3]) if len(sys.argv) > 3 else steps[-1]
if steps != list(range(1, k + 1)):
    sys.exit(f"{sys.argv[1]}: train steps are not 1..{k} once each: {steps}")
for a, b in zip(run, ref[:k]):
    if a != b:
        sys.exit(f"step {a['step']} differs from the uninterrupted run:\n  {a}\n  {b}")
if len(ref) < k:
    sys.exit(f"{sys.argv[2]} has only {len(ref)} steps, fewer than {k}")
print(k)
EOF
}

# ---- b (submitted first, checked later: it runs on Slurm's clock) ----
# At most one requeue (ZERO3D_MAX_REQUEUES=1): the restarted job stops on the next USR1 and ends.
tl=$(submit timelimit --time=1 --signal=B:USR1@50 --export=ALL,ZERO3D_MAX_REQUEUES=1 -- "${base[@]}" \
       --set train_steps=100000)

# ---- a. SIGUSR1 to the batch shell: checkpoint, exit 6, requeue, resume, finish ----
steps=(--set train_steps=100)  # enough that a few steps in, it is far from done even on a fast machine
ref=$(submit ref -- "${base[@]}" "${steps[@]}")
rq=$(submit requeue -- "${base[@]}" "${steps[@]}")
wait_steps "$tmp/requeue" 3 "$rq"
timeout 20 scancel --signal=USR1 --batch "$rq" || fail "scancel --signal=USR1 --batch $rq"
wait_done "$rq" 240
wait_done "$ref" 120
out=$tmp/requeue.out
expect_job "$rq" COMPLETED 0:0 1
expect_job "$ref" COMPLETED 0:0 0
has "$out" "got SIGUSR1"
has "$out" "stopping after step [0-9]+ on SIGUSR1"
k=$(sed -n 's/.*stopping after step \([0-9]*\) on SIGUSR1.*/\1/p' "$out" | head -1)
((k < 100)) || fail "the run finished (step $k) before it was signalled"
ckpt=$(printf '%s/requeue/checkpoints/step_%08d.h5' "$tmp" "$k")
[[ -f $ckpt ]] || fail "no checkpoint $ckpt"
has "$out" "zero3d exited with code 6"
has "$out" "requeueing job $rq"
has "$out" "job $rq \(restart 1\)"
has "$out" "resumed from $ckpt at step $k"
has "$out" "zero3d exited with code 0"
has "$tmp/ref.out" "zero3d exited with code 0"
# the arithmetic of the run (zero3d train --dry-run) before each start: the resume at its checkpoint
has "$tmp/ref.out" "train.sbatch: model +[0-9,]+ parameters"
has "$tmp/ref.out" "train.sbatch: compute .* x 4 ranks"
has "$out" "train.sbatch: resume +from $ckpt: $k steps done"
same_metrics "$tmp/requeue" "$tmp/ref" 100 >/dev/null || fail "requeued run against the uninterrupted run"
ok "requeue: USR1 at step $k, checkpoint, exit 6, requeued, resumed $ckpt, finished; 100 steps equal the uninterrupted run"

# ---- e. scancel (SIGTERM to every process of the job): a checkpoint, no requeue ----
cj=$(submit cancel -- "${base[@]}" --set train_steps=100000)
wait_steps "$tmp/cancel" 3 "$cj"
timeout 20 scancel "$cj" || fail "scancel $cj"
wait_done "$cj" 60
sleep 3  # a requeue would show by now
expect_job "$cj" CANCELLED "*" 0
has "$tmp/cancel.out" "got SIGTERM"
has "$tmp/cancel.out" "stopping after step [0-9]+ on SIG(TERM|USR1)"
kc=$(sed -n 's/.*stopping after step \([0-9]*\) on SIG.*/\1/p' "$tmp/cancel.out" | head -1)
[[ -f $(printf '%s/cancel/checkpoints/step_%08d.h5' "$tmp" "$kc") ]] || fail "scancel: no checkpoint at step $kc"
hasnt "$tmp/cancel.out" "requeueing job"
ok "scancel: checkpoint at step $kc, job CANCELLED, not requeued"

# ---- c. chain.sh: 3 jobs, each stopping on its run.max_minutes budget, continue one run ----
# run.max_minutes=0.02: a 1.2 s budget per job, a few steps here, far from 200 even on a 10x faster machine
chain_args=("${base[@]}" --set train_steps=200 --set checkpoint.save_interval=25)
cref=$(submit chainref -- "${chain_args[@]}")
mapfile -t ids < <(RUN_DIR=$tmp/chain timeout 120 jobscripts/chain.sh 3 -n 4 -O --output="$tmp/chain-%j.out" -- \
                     "${chain_args[@]}" --set run.max_minutes=0.02)
((${#ids[@]} == 3)) || fail "chain.sh printed ${#ids[@]} job ids, not 3"
[[ $(field "${ids[1]}" Dependency) == *afterany:${ids[0]}* ]] || fail "job ${ids[1]}: dependency $(field "${ids[1]}" Dependency)"
for j in "${ids[@]}"; do wait_done "$j" 180; done
wait_done "$cref" 180
expect_job "$cref" COMPLETED 0:0 0
for i in 0 1 2; do
  j=${ids[i]} out=$tmp/chain-${ids[i]}.out
  ((i < 2)) && expect_job "$j" FAILED 6:0 0  # stopped early with a checkpoint (exit 6), not requeued
  hasnt "$out" "requeueing job"
  if ((i == 0)); then hasnt "$out" "resumed from"; else has "$out" "resumed from $tmp/chain/checkpoints/step_"; fi
  ((i < 2)) && has "$out" "stopping after step [0-9]+: another step .* would overrun the time budget"
  ((i < 2)) && has "$out" "ZERO3D_REQUEUE=0: not requeueing"
done
j3=${ids[2]}
[[ $(field "$j3" JobState) == @(COMPLETED|FAILED) ]] || fail "job $j3: $(field "$j3" JobState)"
kchain=$(same_metrics "$tmp/chain" "$tmp/chainref") || fail "chained run against the uninterrupted run"
ok "chain: jobs ${ids[*]} ran one after another; 2 and 3 resumed; steps 1..$kchain once each, equal to the uninterrupted run"

# ---- b. the time limit's USR1 (--signal=B:USR1@50): checkpoint, requeue, resume, and once more ----
out=$tmp/timelimit.out
wait_done "$tl" 300
expect_job "$tl" FAILED 6:0 1
has "$out" "got SIGUSR1"
has "$out" "stopping after step [0-9]+ on SIGUSR1"
kt=$(sed -n 's/.*stopping after step \([0-9]*\) on SIGUSR1.*/\1/p' "$out" | head -1)
has "$out" "requeueing job $tl"
has "$out" "resumed from $(printf '%s/timelimit/checkpoints/step_%08d.h5' "$tmp" "$kt") at step $kt"
kt2=$(sed -n 's/.*stopping after step \([0-9]*\).*/\1/p' "$out" | sort -n | tail -1)
((kt2 > kt)) || fail "$out: the restarted job did not stop with a checkpoint after step $kt"
[[ -f $(printf '%s/timelimit/checkpoints/step_%08d.h5' "$tmp" "$kt2") ]] || fail "no checkpoint at step $kt2"
has "$out" "already restarted 1 times \(ZERO3D_MAX_REQUEUES=1\): not requeueing"
(($(grep -c "requeueing job" "$out") == 1)) || fail "$out: requeued more than once"
ok "time limit: Slurm's USR1 at step $kt, checkpoint, requeued, resumed; stopped again at step $kt2, not requeued (ZERO3D_MAX_REQUEUES=1)"

# ---- d. sweep.sh: a small scaling study under Slurm, then postprocess/scaling.py ----
cat > "$tmp/layouts.txt" <<'EOF'
# name  mode         nodes tp pp dp stage micro gas
dp1     strong,weak  1     1  1  1  1     8
dp2     strong       1     1  1  2  1     4
dp4     strong       1     1  1  4  1     2
tp2     strong       1     2  1  2  2     4
pp2     strong       1     1  2  2  2     2     2
wdp2    weak         1     1  1  2  1     8
EOF
study=$tmp/study
timeout 120 jobscripts/sweep.sh "$study" "$tmp/layouts.txt" -O -- input/gpt-tiny.json --peak-flops 1e11 --set data.val= \
  --set train_steps=6 > "$tmp/sweep.log" 2> "$tmp/sweep.err" || { cat "$tmp/sweep.err"; fail "sweep.sh"; }
has "$tmp/sweep.err" "postprocess/scaling.py $study"
mapfile -t sweep < "$tmp/sweep.log"
((${#sweep[@]} == 6)) || fail "sweep.sh printed ${#sweep[@]} runs, not 6"
for line in "${sweep[@]}"; do
  read -r name j <<< "$line"
  wait_done "$j" 120
  expect_job "$j" COMPLETED 0:0 0
done
"$py" - "$study/study.json" <<'EOF' || fail "study.json"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
got = sorted((r["run"], r["mode"], r["nodes"]) for r in runs)
want = sorted([("dp1", "strong", 1), ("dp1", "weak", 1), ("dp2", "strong", 1), ("dp4", "strong", 1),
               ("tp2", "strong", 1), ("pp2", "strong", 1), ("wdp2", "weak", 1)])
if got != want: sys.exit(f"study.json runs {got}, expected {want}")
EOF
timeout 120 "$py" postprocess/scaling.py "$study" --out "$tmp/post" > "$tmp/scaling.log" 2>&1 ||
  { cat "$tmp/scaling.log"; fail "postprocess/scaling.py"; }
"$py" - "$tmp/post" "$study/study.json" <<'EOF' || { cat "$tmp/scaling.log"; fail "scaling.py outputs"; }
import csv, json, sys
from pathlib import Path
import matplotlib.image
import numpy as np
out = Path(sys.argv[1])
entries = json.load(open(sys.argv[2]))["runs"]
rows = list(csv.DictReader(open(out / "scaling.csv")))
table = sorted((r["run"], r["mode"]) for r in rows)
want = sorted((e["run"], e["mode"]) for e in entries)
if table != want: sys.exit(f"scaling.csv rows (run, mode) {table}, expected one per study.json entry {want}")
layouts = {r["run"]: (r["tp"], r["pp"], r["dp"]) for r in rows}
if layouts != {"dp1": ("1", "1", "1"), "dp2": ("1", "1", "2"), "dp4": ("1", "1", "4"), "tp2": ("2", "1", "2"),
               "pp2": ("1", "2", "2"), "wdp2": ("1", "1", "2")}: sys.exit(f"layouts in scaling.csv: {layouts}")
md = (out / "scaling.md").read_text()
for run in layouts:
    if run not in md: sys.exit(f"scaling.md has no row for {run}")
pngs = sorted(out.glob("*.png"))
if not pngs: sys.exit(f"no PNG in {out}")
for p in pngs:
    img = matplotlib.image.imread(p)
    if img.ndim != 3 or min(img.shape[:2]) < 100 or float(np.std(img)) <= 0:
        sys.exit(f"{p}: not an image with content: shape {img.shape}, std {np.std(img)}")
print(f"{len(rows)} rows, {len(pngs)} PNGs")
EOF
# non-empty axes: scaling.py reports the points it drew on each of its four axes
grep -qE "points per axis: [a-z_]+ [1-9][0-9]*(, [a-z_]+ [1-9][0-9]*){3}\)" "$tmp/scaling.log" ||
  { cat "$tmp/scaling.log"; fail "scaling.png has an empty axis"; }
ok "sweep: 6 layouts under Slurm; study.json; scaling.py: a row per study.json entry, no empty axis, $(ls "$tmp/post"/*.png | wc -l) PNG(s)"
echo "test_slurm: all checks passed in $((SECONDS - t_start)) s"
