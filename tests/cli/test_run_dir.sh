#!/usr/bin/env bash
# Run directories of any length, the same on every rank:
#  - a --run-dir of about 300 characters (three nested folders, each under NAME_MAX) trains on 2
#    ranks and saves; a second run resumes it (checkpoint.load=auto) to the very losses of one run
#    straight through;
#  - without --run-dir, in a Slurm job whose id is 200 characters, every rank takes runs/<the whole
#    id> (rank 0's name, broadcast): the metrics and the checkpoint land there, and nowhere else.
# usage: test_run_dir.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"

base=(--peak-flops 1e11 --set data.val= --set train_batch_size=8 --set train_micro_batch_size_per_gpu=4
      --set gradient_accumulation_steps=1 --set zero_optimization.stage=2 --set comm_timeout_s=60)
run() {  # run LOG ARGS...: zero3d train on 2 ranks, which must succeed
  local log=$1; shift
  timeout 300 $MPIRUN -np 2 "$@" > "$log" 2>&1 || { echo "run failed:"; tail -20 "$log"; exit 1; }
}

# ---- a 300-character run dir: train, save, resume ----
name() { printf "$1%.0s" $(seq 95); }
long=$tmp/$(name a)/$(name b)/$(name c)
(( ${#long} >= 290 )) || fail "the long run dir has ${#long} characters, not about 300"
run "$tmp/straight.log" "$z3d" train input/gpt-tiny.json --run-dir "$tmp/straight" "${base[@]}" --set train_steps=12
run "$tmp/first.log" "$z3d" train input/gpt-tiny.json --run-dir "$long" "${base[@]}" --set train_steps=6 \
  --set checkpoint.save_interval=6
[[ -f $long/checkpoints/step_00000006.h5 ]] || fail "no checkpoint in the ${#long}-character run dir"
run "$tmp/resumed.log" "$z3d" train input/gpt-tiny.json --run-dir "$long" "${base[@]}" --set train_steps=12 \
  --set checkpoint.load=auto
grep -qF "resumed from $long/checkpoints/step_00000006.h5" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; fail "the run in the ${#long}-character run dir did not resume its checkpoint"; }
/usr/bin/python3 - "$tmp/straight" "$long" <<'PY' || fail "the resumed run's losses differ from the straight run's"
import sys
from z3dcheck import by_step
straight, resumed = by_step(sys.argv[1], "loss"), by_step(sys.argv[2], "loss")
assert sorted(resumed) == list(range(1, 13)), sorted(resumed)
assert resumed == straight, [(s, straight[s], resumed[s]) for s in straight if straight[s] != resumed.get(s)]
PY
echo "ok   a ${#long}-character run dir trains, saves and resumes to the same losses"

# ---- the default run dir of a Slurm job with a 200-character id ----
# The id reaches the ranks only (mpirun -x): mpirun itself must not think it runs inside Slurm.
job=$(name j)$(name k | cut -c1-10)$(name l | cut -c1-95)
(( ${#job} == 200 )) || fail "the job id has ${#job} characters, not 200"
mkdir "$tmp/cwd"
ln -s "$PWD/input" "$tmp/cwd/input"
(cd "$tmp/cwd" && run "$tmp/slurm.log" -x SLURM_JOB_ID="$job" "$z3d" train input/gpt-tiny.json "${base[@]}" \
  --set train_steps=4 --set checkpoint.save_interval=4)
[[ -f $tmp/cwd/runs/$job/metrics.jsonl && -f $tmp/cwd/runs/$job/checkpoints/step_00000004.h5 ]] ||
  { ls -R "$tmp/cwd/runs" | head; fail "the run of job id ${#job} characters is not in runs/<the whole id>"; }
[[ $(ls "$tmp/cwd/runs") == "$job" ]] || { ls "$tmp/cwd/runs"; fail "the ranks wrote to more than one run dir"; }
echo "ok   without --run-dir, a 200-character Slurm job id names runs/<id> on every rank"
