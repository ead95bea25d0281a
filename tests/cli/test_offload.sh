#!/usr/bin/env bash
# Offload to nvme (zero_optimization.offload_optimizer / offload_param): gpt-tiny logs bitwise
# the same losses and gradient norms with its optimizer state (and stage 3's parameter slices) in
# swap files as in memory, in fp32 and bf16 at stages 1-3 and on a tp 2 x pp 2 x dp 2 grid. A
# checkpoint of an offloaded run resumes bitwise, with or without offload, and reshards onto 4
# ranks. The swap files are gone after a run, a killed run's are removed by the next start, a
# swap file truncated under a run stops the job (exit 8) naming the file, and bad settings are
# refused at start (exit 2).
# usage: test_offload.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
nvme="$tmp/nvme"
mkdir -p "$nvme"
tiny=(input/gpt-tiny.json --peak-flops 1e11 --set data.val="" --set train_batch_size=8 --set train_steps=6)
off_opt=(--set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$nvme"
         --set zero_optimization.sub_group_size=100000 --set zero_optimization.offload_optimizer.buffer_count=3)
off_param=(--set zero_optimization.offload_param.device=nvme --set zero_optimization.offload_param.nvme_path="$nvme")
run() {  # run NAME NP ARGS...: must succeed
  local name=$1 np=$2
  shift 2
  timeout 120 $MPIRUN -np "$np" "$z3d" train "${tiny[@]}" --run-dir "$tmp/$name" \
    --set train_micro_batch_size_per_gpu=$((8 * $(tp_pp "$@") / np)) "$@" > "$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "$name failed"; }
  no_swap_left "$name"
}
tp_pp() {  # the tp x pp product in the arguments
  local tp=1 pp=1 a
  for a in "$@"; do
    case $a in tensor_parallel.tp_size=*) tp=${a#*=} ;; pipeline_parallel.pp_size=*) pp=${a#*=} ;; esac
  done
  echo $((tp * pp))
}
no_swap_left() {
  local left
  left=$(find "$nvme" -mindepth 1 2>/dev/null)
  [[ -z $left ]] || fail "$1: swap files left behind: $left"
}
same() {  # same A B [FROM]: train records A and B have bitwise equal loss and grad_norm (steps >= FROM)
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "${3:-1}" <<'PY' || fail "$1 vs $2 differ"
import sys
from z3dcheck import by_step
a, b, first = by_step(sys.argv[1], "loss", "grad_norm"), by_step(sys.argv[2], "loss", "grad_norm"), int(sys.argv[3])
steps = [s for s in b if s >= first]
bad = [s for s in steps if a.get(s) != b[s]]
if not steps or bad: print("differ at steps", bad, [(a.get(s), b[s]) for s in bad]); sys.exit(1)
PY
}
swapped() {  # swapped NAME: the run record says something is swapped, and step records count swap bytes
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" <<'PY' || fail "$1: nothing swapped"
import sys
from z3dcheck import run_and_train
run, train = run_and_train(sys.argv[1])
assert run["mem_swapped_bytes"] > 0 and run["offload_optimizer"].startswith("nvme"), run
# Step 1 reads nothing of its own (every record is fresh: served as zeros); whether the read-ahead
# of step 2 lands in step 1's count depends on timing. Every step writes; every later step reads.
assert all(r["swap_written_bytes"] > 0 and (r["step"] == 1 or r["swap_read_bytes"] > 0) for r in train), \
    [(r["step"], r["swap_read_bytes"], r["swap_written_bytes"]) for r in train]
PY
}

# ---- bitwise: in memory vs swapped, fp32 and bf16, stages 1-3 (stage 3: the parameters too) ----
for prec in fp32 bf16; do
  p=(); [[ $prec == bf16 ]] && p=(--set bf16.enabled=true)
  for stage in 1 2 3; do
    extra=(); [[ $stage == 3 ]] && extra=("${off_param[@]}" --set zero_optimization.stage3_param_persistence_threshold=1000)
    run "mem_${prec}_s$stage" 2 "${p[@]}" --set zero_optimization.stage=$stage \
      --set zero_optimization.stage3_param_persistence_threshold=1000
    run "nvme_${prec}_s$stage" 2 "${p[@]}" --set zero_optimization.stage=$stage "${off_opt[@]}" "${extra[@]}"
    same "mem_${prec}_s$stage" "nvme_${prec}_s$stage"
    swapped "nvme_${prec}_s$stage"
    echo "ok   $prec stage $stage: swapped run bitwise equal to the in-memory run"
  done
done
grid=(--set tensor_parallel.tp_size=2 --set pipeline_parallel.pp_size=2 --set bf16.enabled=true --set zero_optimization.stage=2)
run mem_grid 8 "${grid[@]}"
run nvme_grid 8 "${grid[@]}" "${off_opt[@]}" --set zero_optimization.offload_optimizer.ratio=0.5
same mem_grid nvme_grid
echo "ok   tp 2 x pp 2 x dp 2, bf16 stage 2, half the state swapped: bitwise equal"

# ---- checkpoints: save from a swapped run, resume swapped, in memory, and on 4 ranks ----
s3=(--set zero_optimization.stage=3 --set checkpoint.save_interval=3 "${off_opt[@]}" "${off_param[@]}")
run full 2 "${s3[@]}"
ck="$tmp/full/checkpoints/step_00000003.h5"
run resume_nvme 2 "${s3[@]}" --set checkpoint.load=\""$ck"\"
same full resume_nvme 4
run resume_mem 2 --set zero_optimization.stage=3 --set checkpoint.load=\""$ck"\"
same full resume_mem 4
run reshard 4 --set zero_optimization.stage=2 "${off_opt[@]}" --set checkpoint.load=\""$ck"\"
/usr/bin/python3 - "$tmp/full/metrics.jsonl" "$tmp/reshard/metrics.jsonl" <<'PY' || fail "reshard: losses differ"
import sys
from z3dcheck import by_step, rel
a, b = by_step(sys.argv[1], "loss"), by_step(sys.argv[2], "loss")
assert sorted(b) == [4, 5, 6], sorted(b)
worst = max(rel(b[s][0], a[s][0]) for s in b)
assert worst < 1e-5, worst
PY
echo "ok   checkpoint of a swapped run: resumes bitwise (swapped or not), reshards onto 4 ranks"

# ---- a killed run's swap files are removed by the next start ----
rc=0
ZERO3D_FAULT=hang:1:3 timeout 120 $MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/killed" --set comm_timeout_s=3 \
  --set train_micro_batch_size_per_gpu=4 --set zero_optimization.stage=1 "${off_opt[@]}" > "$tmp/killed.log" 2>&1 || rc=$?
[[ $rc -eq 3 ]] || { cat "$tmp/killed.log"; fail "killed: exit $rc, expected the watchdog's 3"; }
[[ $(find "$nvme" -type f | wc -l) -eq 2 ]] || fail "killed: expected its 2 swap files left, found: $(find "$nvme")"
run after_kill 2 --set zero_optimization.stage=1 "${off_opt[@]}"
grep -qE "removed [12] swap files \(0\.0[0-9] GB\) under $nvme left by runs that died" "$tmp/after_kill.log" ||
  { cat "$tmp/after_kill.log"; fail "after_kill: no clean-up line"; }
echo "ok   a killed run's swap files are removed at the next start; none left after a run"

# ---- a swap file truncated under the run: exit 8 with the file named, on both kinds of swap file ----
# (Depending on timing the read finds the end of the file, or a hole that later writes re-extended
# the file over: the checksum catches that.)
expect_exit 8 truncated "zero3d: error \(rank 1, [^)]*\): swap file '$nvme/zero3d-[0-9a-f]{8}/rank1\.[0-9]+\.optimizer': (read of [0-9]+ bytes at offset [0-9]+ failed after 4 tries: end of file|sub-group [0-9]+ \([0-9]+ bytes at offset [0-9]+\) does not read back what was written)" \
  env ZERO3D_FAULT=truncate_swap:1:4 $MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/truncated" \
  --set train_micro_batch_size_per_gpu=4 --set zero_optimization.stage=2 "${off_opt[@]}"
grep -q "last committed checkpoint is intact" "$tmp/truncated.log" || fail "truncated: no word on the checkpoint"
expect_exit 8 truncated_param "zero3d: error \(rank 0, [^)]*\): swap file '$nvme/zero3d-[0-9a-f]{8}/rank0\.[0-9]+\.(param|optimizer)': " \
  env ZERO3D_FAULT=truncate_swap:0:3 $MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/truncated_param" \
  --set train_micro_batch_size_per_gpu=4 --set zero_optimization.stage=3 "${off_opt[@]}" "${off_param[@]}"
rm -rf "${nvme:?}"/*  # what the aborted runs left (the next start would remove it too)

# ---- settings refused at start ----
bad() {  # bad NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  expect_exit 2 "$name" "$pattern" $MPIRUN -np 2 "$z3d" train "${tiny[@]}" --run-dir "$tmp/$name" \
    --set train_micro_batch_size_per_gpu=4 "$@"
  [[ ! -e $tmp/$name ]] || fail "$name: a run dir was created"
}
bad no_dir "zero_optimization.offload_optimizer.nvme_path '$tmp/absent' is not a directory" \
  --set zero_optimization.stage=1 --set zero_optimization.offload_optimizer.device=nvme \
  --set zero_optimization.offload_optimizer.nvme_path="$tmp/absent"
bad no_path "offload_optimizer.device = \"nvme\" needs zero_optimization.offload_optimizer.nvme_path" \
  --set zero_optimization.stage=2 --set zero_optimization.offload_optimizer.device=nvme
bad param_stage2 "offload_param.device = \"nvme\" needs zero_optimization.stage 3" \
  --set zero_optimization.stage=2 "${off_param[@]}"
bad opt_stage0 "offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3" \
  --set zero_optimization.offload_optimizer.device=cpu
no_swap_left refused
echo "PASS"
