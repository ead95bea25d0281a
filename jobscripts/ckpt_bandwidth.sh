#!/usr/bin/env bash
# jobscripts/ckpt_bandwidth.sh: checkpoint write and read bandwidth of zero3d against two baselines
# on the same file system, measured in the same run, alternating, ROUNDS times (each after `sync`):
#   dd        one writer: dd conv=fsync of the checkpoint's byte count
#   bench io  the same ranks writing the same bytes with raw collective MPI-IO + sync (zero3d bench io)
#   save      zero3d train for one step with checkpoint.save_interval=1, written in place
#             (checkpoint.async=false: the whole save, staging to commit; the "checkpoint" record)
#   load      a second zero3d train resuming that checkpoint (read, verified, resharded to ZeRO-3)
# usage: jobscripts/ckpt_bandwidth.sh [DIR [RANKS [CONFIG [ROUNDS]]]]
#        defaults: runs/ckpt-bandwidth, 4, input/gpt2-124m.json (fp32: weights + Adam m, v = 1.49 GB), 3
# Under Slurm run it inside an allocation with MPIRUN="srun --mpi=pmix". Prints one line per
# measurement and the median ratios save/dd and save/bench io.
set -euo pipefail
source "$(dirname "$0")/bench_lib.sh"
bench_init
dir=${1:-runs/ckpt-bandwidth}
ranks=${2:-4}
config=${3:-input/gpt2-124m.json}
rounds=${4:-3}
rm -rf "$dir"
mkdir -p "$dir"
train() {  # train NAME ARGS...: one step of CONFIG on RANKS ranks, micro-batch 1, no validation
  local name=$1; shift
  bench_run "$dir/$name.log" "${mpirun[@]}" -np "$ranks" "$z3d" train "$config" --peak-flops 1e11 --run-dir "$dir/$name" \
    --set train_steps=1 --set data.val= --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=1 "$@"
}
record() {  # record RUN FIELD: FIELD of RUN's checkpoint record
  "$PY" -c 'import sys; sys.path.insert(0, "postprocess"); from bench_stats import records
print(records(sys.argv[1], "checkpoint")[0][sys.argv[2]])' "$dir/$1" "$2"
}
for round in $(seq "$rounds"); do
  sync; sleep 1
  train "save$round" --set zero_optimization.stage=1 --set checkpoint.save_interval=1 --set checkpoint.async=false
  bytes=$(record "save$round" bytes)
  save=$(record "save$round" bytes_per_s)
  sync; sleep 1
  train "load$round" --set zero_optimization.stage=3 --set checkpoint.load=\""$dir/save$round/checkpoints"\"
  load=$(record "load$round" bytes_per_s)
  rm -rf "$dir/save$round/checkpoints"
  sync; sleep 1
  # dd's last line: "N bytes (...) copied, S s, R GB/s"
  dd=$(dd if=/dev/zero of="$dir/dd.bin" bs=1M count=$((bytes >> 20)) conv=fsync 2>&1 | tail -1 |
       "$PY" -c 'import re, sys; m = re.match(r"(\d+) bytes.*copied, ([0-9.e+-]+) s", sys.stdin.read()); print(int(m[1]) / float(m[2]))')
  rm -f "$dir/dd.bin"
  sync; sleep 1
  io=$("${mpirun[@]}" -np "$ranks" "$z3d" bench io --dir "$dir" --bytes "$bytes" | tail -1 | sed -E 's/.*s: ([0-9.]+) MB\/s/\1/')
  io=$("$PY" -c "print($io * 1e6)")
  echo "$save $load $dd $io" >> "$dir/rates.txt"
  "$PY" -c "import sys; b, *r = map(float, sys.argv[1:]); print('round $round: %d bytes; MB/s: save %.0f, load %.0f, dd %.0f, bench io %.0f' % (b, *(x / 1e6 for x in r)))" \
    "$bytes" "$save" "$load" "$dd" "$io"
done
"$PY" - "$dir/rates.txt" <<'PY'
import sys
sys.path.insert(0, "postprocess")
from bench_stats import med
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
print(f"median of {len(rows)} rounds: save / dd = {med([r[0] / r[2] for r in rows]):.2f}, "
      f"save / bench io = {med([r[0] / r[3] for r in rows]):.2f}, load / dd = {med([r[1] / r[2] for r in rows]):.2f}")
PY
