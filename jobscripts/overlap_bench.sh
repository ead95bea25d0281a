#!/usr/bin/env bash
# jobscripts/overlap_bench.sh: what communication costs a training step, per ZeRO stage, measured
# side by side in one session: for each stage, each comm.collectives (mpi, auto) and overlap_comm
# (false, true), runs alternating ROUNDS times (even rounds take the stages in reverse order, so
# a steady drift of the machine's speed does not show as a stage ratio; use an even ROUNDS), and
# per run
#   step      median step time from step 3 on (warm-up left out), and its ratio to stage 0's
#             step with the same collectives and overlap
#   comm      median per step of the data collectives' running time (comm_s), the part the step
#             waited for while they ran (comm_exposed_s) and its share of comm_s, and the waits for
#             the slower rank to join (comm_skew_s; shared memory only, MPI's count as exposed)
#             (wall_clock_breakdown; each the slowest rank's)
# usage: jobscripts/overlap_bench.sh [DIR [RANKS [CONFIG [STEPS [ROUNDS]]]]]
#        defaults: runs/overlap-bench, 2, input/bench-cpu.json, 8, 1
#        STAGES="0 1 2 3", IMPLS="mpi auto", OVERLAPS="false true" in the environment pick the runs
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/overlap-bench}
ranks=${2:-2}
config=${3:-input/bench-cpu.json}
steps=${4:-8}
rounds=${5:-1}
rm -rf "$dir"
mkdir -p "$dir"
stages=(${STAGES:-0 1 2 3})
for round in $(seq "$rounds"); do
  # even rounds run the stages backwards, so a drift of the machine's speed cancels over two rounds
  order=("${stages[@]}")
  if (( round % 2 == 0 )); then mapfile -t order < <(printf '%s\n' "${stages[@]}" | tac); fi
  for stage in "${order[@]}"; do
    for impl in ${IMPLS:-mpi auto}; do
      for overlap in ${OVERLAPS:-false true}; do
        run="$dir/r$round-z$stage-$impl-overlap_$overlap"
        bench_run "$run.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --run-dir "$run" --peak-flops 1e11 \
          --set data.val= --set train_steps="$steps" --set steps_per_print="$steps" --set wall_clock_breakdown=true \
          --set zero_optimization.stage="$stage" --set zero_optimization.overlap_comm="$overlap" \
          --set comm.collectives="$impl"
      done
    done
  done
done
"$PY" - "$dir" <<'EOF'
import glob, os, re, sys
sys.path.insert(0, "postprocess")
from bench_stats import med as median, step_medians
root = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(root, "r*-z*"))):
    if not os.path.isdir(path):
        continue
    m = re.match(r"r(\d+)-z(\d)-(\w+)-overlap_(\w+)$", os.path.basename(path))
    key = (int(m.group(2)), m.group(3), m.group(4))
    rows.setdefault(key, []).append(step_medians(path, ("step_time_s", "comm_s", "comm_exposed_s", "comm_skew_s")))
def med(key, k):
    return median(r[k] for r in rows[key])
print(f"# {root}: median over steps >= 3 and over rounds; comm: data collectives per step, slowest rank")
print(f"{'stage':>5} {'collectives':>11} {'overlap':>7} | {'step s':>8} {'x stage 0':>9} | {'comm s':>8} {'exposed s':>9} "
      f"{'exposed %':>9} {'skew s':>8}")
for key in sorted(rows):
    stage, impl, overlap = key
    base = (0, impl, overlap)
    ratio = med(key, "step_time_s") / med(base, "step_time_s") if base in rows else float("nan")
    comm, exp = med(key, "comm_s"), med(key, "comm_exposed_s")
    print(f"{stage:>5} {impl:>11} {overlap:>7} | {med(key, 'step_time_s'):8.3f} {ratio:9.2f} | {comm:8.3f} {exp:9.3f} "
          f"{100 * exp / comm if comm else 0:8.0f}% {med(key, 'comm_skew_s'):8.3f}")
EOF
