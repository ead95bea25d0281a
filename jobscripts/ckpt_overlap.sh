#!/usr/bin/env bash
# jobscripts/ckpt_overlap.sh: what a checkpoint costs training, saves in the background against
# saves in place, measured in the same session, alternating, ROUNDS times:
#   stall     the training thread's time per save (checkpoint record stall_s): staging only in the
#             background; the whole save in place. The last step's save is left out of the background
#             figure: the end of a run waits for its save to commit, by design
#   overlap   the steps that ran while a background write was in flight, against the other steps
#             of the same run (the first two steps, warm-up, left out)
# usage: jobscripts/ckpt_overlap.sh [DIR [RANKS [CONFIG [STEPS [INTERVAL [ROUNDS]]]]]]
#        defaults: runs/ckpt-overlap, 4, input/gpt2-124m.json (fp32 ZeRO-1: 1.49 GB a save), 12, 4, 2
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/ckpt-overlap}
ranks=${2:-4}
config=${3:-input/gpt2-124m.json}
steps=${4:-12}
interval=${5:-4}
rounds=${6:-2}
rm -rf "$dir"
mkdir -p "$dir"
for round in $(seq "$rounds"); do
  for mode in true false; do
    name=$mode$round
    bench_run "$dir/$name.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --peak-flops 1e11 --run-dir "$dir/$name" \
      --set data.val= --set train_steps="$steps" --set checkpoint.save_interval="$interval" \
      --set train_micro_batch_size_per_gpu=1 --set zero_optimization.stage=1 --set checkpoint.async=$mode
  done
done
"$PY" - "$dir" "$rounds" <<'PY'
import sys
sys.path.insert(0, "postprocess")
from bench_stats import med, records, spread
d, rounds = sys.argv[1], int(sys.argv[2])
def runs(mode):
    for r in range(1, rounds + 1):
        yield records(f"{d}/{mode}{r}")
sync_save, async_stall, inflight, normal = [], [], [], []
for recs in runs("false"):
    sync_save += [r["seconds"] for r in recs if r["kind"] == "checkpoint"]
for recs in runs("true"):
    last_step = max(r["step"] for r in recs if r["kind"] == "train")
    async_stall += [r["stall_s"] for r in recs if r["kind"] == "checkpoint" and r["step"] != last_step]
    pending = False  # a save was staged at the last boundary and its record has not come yet
    saved = {r["step"] for r in recs if r["kind"] == "checkpoint"}
    for r in recs:
        if r["kind"] == "checkpoint":
            pending = False
        elif r["kind"] == "train":
            if r["step"] > 2 and r["step"] != last_step:
                (inflight if pending else normal).append(r["step_time_s"])
            if r["step"] in saved:
                pending = True
print(f"in-place save: median {med(sync_save):.2f} s over {len(sync_save)} saves")
print(f"background save: training waited median {spread(async_stall, '{:.3f}')} s per save "
      f"over {len(async_stall)} mid-run saves "
      f"({med(async_stall) / med(sync_save):.1%} of the in-place save)")
print(f"steps with a write in flight: median {med(inflight):.2f} s over {len(inflight)}; other steps "
      f"{med(normal):.2f} s over {len(normal)}: ratio {med(inflight) / med(normal):.2f}")
PY
