#!/usr/bin/env bash
# jobscripts/offload_bench.sh: what offload to nvme costs and saves, per ZeRO stage, measured in
# one session: for each stage, the state in memory, the optimizer state swapped, and (stage 3) the
# parameters swapped too, runs alternating ROUNDS times:
#   step      median step time from step 3 on (warm-up left out), and its ratio to the in-memory run
#   peak RSS  the largest VmHWM over the ranks (memory_breakdown), and how much it saves against
#             the in-memory run, as a share of the model-state bytes that left memory (the run
#             records' mem_params/grads/optimizer_bytes; the swap files also hold a master copy
#             where the in-memory run had none: fp32 with offload_param)
#   swap      bytes read and written per step over all ranks, the slowest rank's I/O-thread time
#             and the part of it the step waited for
# and dd on the swap directory (4 KiB-aligned direct I/O, as the swap files use) for the disk's rate.
# Host-backend note: offload_optimizer.device=cpu changes nothing there (its memory is host
# memory), so the in-memory column is also the cpu column.
# usage: jobscripts/offload_bench.sh [DIR [RANKS [CONFIG [STEPS [MICRO [SUB_GROUP [ROUNDS]]]]]]]
#        defaults: runs/offload-bench, 2, input/gpt2-124m.json, 6, 2, 4000000, 1
#        STAGES="1 2 3" (the default) in the environment picks the stages
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/offload-bench}
ranks=${2:-2}
config=${3:-input/gpt2-124m.json}
steps=${4:-6}
micro=${5:-2}
sub_group=${6:-4000000}
rounds=${7:-1}
rm -rf "$dir"
mkdir -p "$dir/nvme"
# Stage 3 prefetches the next unit (a gpt2-124m block is 7.1M elements), in memory and swapped
# alike: that is what lets swapped parameters be read while the unit before is computed on.
common=(--peak-flops 1e11 --set data.val= --set train_steps="$steps" --set train_micro_batch_size_per_gpu="$micro"
        --set memory_breakdown=true --set steps_per_print="$steps" --set zero_optimization.stage3_prefetch_bucket_size=1e7)
opt=(--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$dir/nvme"
     --set zero_optimization.sub_group_size="$sub_group")
param=(--set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path="$dir/nvme")
for round in $(seq "$rounds"); do
  for stage in ${STAGES:-1 2 3}; do
    for mode in memory nvme nvme_param; do
      [[ $mode == nvme_param && $stage != 3 ]] && continue
      args=(); [[ $mode != memory ]] && args+=("${opt[@]}"); [[ $mode == nvme_param ]] && args+=("${param[@]}")
      name=s${stage}_${mode}_$round
      bench_run "$dir/$name.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --run-dir "$dir/$name" \
        "${common[@]}" --set zero_optimization.stage=$stage "${args[@]}"
    done
  done
done
# The disk, as the swap files use it: 1 GiB written and read back with 4 KiB-aligned direct I/O.
dd if=/dev/zero of="$dir/nvme/dd" bs=4M count=256 oflag=direct conv=fsync 2> "$dir/dd_write.txt"
dd if="$dir/nvme/dd" of=/dev/null bs=4M iflag=direct 2> "$dir/dd_read.txt"
rm -f "$dir/nvme/dd"
"$PY" - "$dir" "$rounds" <<'PY'
import os, re, sys
sys.path.insert(0, "postprocess")
from bench_stats import med, records, spread
d, rounds = sys.argv[1], int(sys.argv[2])
def dd(f):
    m = re.search(r"([0-9.]+) (GB|MB)/s", open(f"{d}/{f}").read())
    return float(m.group(1)) * (1e9 if m.group(2) == "GB" else 1e6)
rows = {}
for r in range(1, rounds + 1):
    for stage in (1, 2, 3):
        for mode in ("memory", "nvme", "nvme_param"):
            run_dir = f"{d}/s{stage}_{mode}_{r}"
            if not os.path.isfile(f"{run_dir}/metrics.jsonl"):
                continue  # that case was not run
            recs = records(run_dir)
            row = rows.setdefault((stage, mode), {"step": [], "peak": [], "swapped": 0, "states": 0, "rd": [], "wr": [], "io": [], "wait": []})
            run = recs[0]
            row["swapped"] = max(row["swapped"], run["mem_swapped_bytes"])
            row["states"] = run["mem_params_bytes"] + run["mem_grads_bytes"] + run["mem_optimizer_bytes"]
            train = [x for x in recs if x["kind"] == "train" and x["step"] >= 3]
            row["step"] += [x["step_time_s"] for x in train]
            row["peak"].append(max(x["rss_peak_bytes"] for x in recs if x["kind"] == "memory"))
            for x in train:
                if "swap_io_s" in x:
                    row["rd"].append(x["swap_read_bytes"]); row["wr"].append(x["swap_written_bytes"])
                    row["io"].append(x["swap_io_s"]); row["wait"].append(x["swap_wait_s"])
print(f"dd with direct I/O on {d}/nvme: write {dd('dd_write.txt') / 1e9:.2f} GB/s, read {dd('dd_read.txt') / 1e9:.2f} GB/s")
print("| stage | state | step s (median) | vs memory | peak RSS / rank | RSS saved / state bytes moved out of memory | swap files / rank | swap read+write per step | swap I/O s | step waited s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (stage, mode), row in sorted(rows.items()):
    base = rows[(stage, "memory")]
    step, bstep = med(row["step"]), med(base["step"])
    peak, bpeak = max(row["peak"]), max(base["peak"])
    moved = base["states"] - row["states"]
    saved = f"{(bpeak - peak) / 1e6:.0f} MB / {moved / 1e6:.0f} MB ({(bpeak - peak) / moved:.0%})" if moved else "-"
    files = f"{row['swapped'] / 1e6:.0f} MB" if row["swapped"] else "-"
    swap = f"{(med(row['rd']) + med(row['wr'])) / 1e9:.2f} GB" if row["rd"] else "-"
    io = f"{med(row['io']):.2f}" if row["io"] else "-"
    wait = f"{med(row['wait']):.2f}" if row["wait"] else "-"
    print(f"| {stage} | {mode} | {spread(row['step'])} | {step / bstep:.3f}x | "
          f"{peak / 1e6:.0f} MB | {saved} | {files} | {swap} | {io} | {wait} |")
PY
