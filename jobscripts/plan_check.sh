#!/usr/bin/env bash
# jobscripts/plan_check.sh: zero3d plan's step time against runs, on this machine (issue #31). Measures
# the machine (zero3d bench machine, RANKS at once), plans CONFIG on RANKS ranks with it, then trains
# a grid of its valid layouts: every (tp, pp) x ZeRO stage 0-3 at the largest micro-batch the global
# batch allows it, and a quarter of it and activation checkpointing at stage 1; each for STEPS steps, the measured
# step time being the median from step 3 on. With NVME_DIR, the swap files' rates there too, and
# stages 1-3 of data parallelism alone at the largest micro-batch with the optimizer's state
# offloaded to NVME_DIR. Prints
# predicted vs measured per layout (the plan's parts: compute, comm, bubble, step end) and the
# median and worst error.
# usage: jobscripts/plan_check.sh [DIR [RANKS [CONFIG [STEPS [NVME_DIR]]]]]
#        defaults: runs/plan-check, 2, input/bench-cpu.json, 6, none
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/plan-check}
ranks=${2:-2}
config=${3:-input/bench-cpu.json}
steps=${4:-6}
nvme=()  # with NVME_DIR: bench machine's and the plan's option
if [[ -n ${5:-} ]]; then
  mkdir -p "$5"
  nvme=(--set zero_optimization.offload_optimizer.nvme_path="$(realpath "$5")")
fi
rm -rf "$dir"
mkdir -p "$dir"
bench_run "$dir/machine.log" "${mpirun[@]}" -np "$ranks" "$z3d" bench machine --out "$dir/machine.json" \
  ${5:+--nvme-path "$5"}
tail -n 1 "$dir/machine.log"
bench_run "$dir/plan.log" "$z3d" plan "$config" --ranks "$ranks" --machine "$dir/machine.json" --json "${nvme[@]}"
cp "$dir/plan.log" "$dir/plan.jsonl"
# The grid: NAME TP PP STAGE MICRO GAS CKPT OFFLOAD, from the plan's valid layouts.
"$PY" - "$dir/plan.jsonl" > "$dir/grid.txt" <<'PY'
import json, sys
plan = [p for p in map(json.loads, (l for l in open(sys.argv[1]) if l.startswith("{"))) if "time" in p]
largest = {}  # (tp, pp) -> the largest micro-batch the plan has for it
for p in plan:
    largest[(p["tp"], p["pp"])] = max(largest.get((p["tp"], p["pp"]), 0), p["micro"])
picked = []
for p in plan:
    top = largest[(p["tp"], p["pp"])]
    base = p["micro"] == top and not p["activation_checkpointing"] and (
        p["offload_optimizer"] == "none" or (p["tp"], p["pp"]) == (1, 1))  # nvme: data parallel only
    variant = p["stage"] == 1 and p["offload_optimizer"] == "none" and (
        (p["micro"] == max(1, top // 4) and not p["activation_checkpointing"]) or
        (p["micro"] == top and p["activation_checkpointing"]))
    if base or variant:
        picked.append(p)
for p in picked:
    name = f"t{p['tp']}p{p['pp']}d{p['dp']}-s{p['stage']}-m{p['micro']}g{p['gas']}" + ("-ckpt" if p["activation_checkpointing"] else "")
    name += "" if p["offload_optimizer"] == "none" else "-" + p["offload_optimizer"]
    print(name, p["tp"], p["pp"], p["stage"], p["micro"], p["gas"], "true" if p["activation_checkpointing"] else "false",
          p["offload_optimizer"])
PY
# A warm-up run first, not recorded: the grid's first run was 16-18% slower than the same layout later.
read -r name tp pp stage micro gas ckpt offload < "$dir/grid.txt"
bench_run "$dir/warmup.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --run-dir "$dir/warmup" \
  --set data.val= --set train_steps="$steps" --set tensor_parallel.tp_size="$tp" --set pipeline_parallel.pp_size="$pp" \
  --set train_micro_batch_size_per_gpu="$micro" --set gradient_accumulation_steps="$gas"
while read -r name tp pp stage micro gas ckpt offload <&3; do  # mpirun reads stdin: the grid comes on fd 3
  swap=()
  [[ $offload == none ]] || swap=(--set zero_optimization.offload_optimizer.device="$offload" "${nvme[@]}")
  bench_run "$dir/$name.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --run-dir "$dir/$name" \
    --set data.val= --set train_steps="$steps" --set steps_per_print=1 --set tensor_parallel.tp_size="$tp" \
    --set pipeline_parallel.pp_size="$pp" --set zero_optimization.stage="$stage" \
    --set train_micro_batch_size_per_gpu="$micro" --set gradient_accumulation_steps="$gas" \
    --set activation_checkpointing.enabled="$ckpt" "${swap[@]}"
done 3< "$dir/grid.txt"
"$PY" - "$dir" <<'PY'
import json, statistics, sys
sys.path.insert(0, "postprocess")
from bench_stats import records
d = sys.argv[1]
plan = {(p["tp"], p["pp"], p["stage"], p["micro"], p["gas"], p["activation_checkpointing"], p["offload_optimizer"]): p
        for p in map(json.loads, (l for l in open(f"{d}/plan.jsonl") if l.startswith("{"))) if "time" in p}
print(f"machine: {json.load(open(f'{d}/machine.json'))['name']}")
print("| layout | predicted step s | compute | comm | bubble | step end | measured step s (median) | error |")
print("|---|---|---|---|---|---|---|---|")
errors = []
for line in open(f"{d}/grid.txt"):
    name, tp, pp, stage, micro, gas, ckpt, offload = line.split()
    p = plan[(int(tp), int(pp), int(stage), int(micro), int(gas), ckpt == "true", offload)]
    t = p["time"]
    steps = [r["step_time_s"] for r in records(f"{d}/{name}", "train") if r["step"] >= 3]
    measured = statistics.median(steps)
    err = t["step_s"] / measured - 1
    errors.append(abs(err))
    print(f"| {name} | {t['step_s']:.3f} | {t['compute_s']:.3f} | {t['comm_s']:.3f} | {t['bubble_s']:.3f} | "
          f"{t['step_end_s']:.3f} | {measured:.3f} | {err:+.1%} |")
print(f"{len(errors)} layouts: median error {statistics.median(errors):.1%}, worst {max(errors):.1%} "
      f"(target: median 15%, worst 30%)")
PY
