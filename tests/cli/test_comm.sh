#!/usr/bin/env bash
# Collectives in training and in `zero3d bench comm`:
# - gpt-tiny on 2 ranks logs bitwise the same losses and gradient norms with MPI's collectives,
#   with shared memory for every message, and with the default (auto), at stages 0-3, fp32 and
#   bf16, with and without overlap_comm: on 2 ranks every sum is one addition, whoever makes it,
#   and overlap changes when a reduction runs, not what it adds.
# - on 4 ranks (tp 2 x dp 2, and dp 4 with nodes of 2 ranks made up: the hierarchical path) the
#   shared-memory runs stay within 1e-5 of MPI's (the order of a sum over 4 ranks differs);
# - the run record names the path; wall_clock_breakdown's comm_s, comm_exposed_s, comm_hidden_s and
#   comm_skew_s are consistent;
# - reduce_bucket_size and allgather_bucket_size size the messages apart (stage 1 with overlap_comm,
#   stage 2 in bf16 without): a larger one gives fewer calls of its collective in the comms log,
#   the same calls of the other, and bitwise the same losses and norms;
# - pp 2: sends on the send thread (with CMA and without) give the same bits as without it;
# - bench comm checks every result (exit 0, no wrong element) on 2 and 3 ranks, and refuses an
#   unknown collective (exit 2).
# usage: test_comm.sh ZERO3D_BINARY SOURCE_DIR
set -eu
source "$(dirname "$0")/common.sh" "$@"
tiny=(input/gpt-tiny.json --peak-flops 1e11 --set data.val="" --set train_batch_size=16 --set train_steps=4
      --set gradient_accumulation_steps=2 --set train_micro_batch_size_per_gpu=4 --set zero_optimization.reduce_bucket_size=20000
      --set zero_optimization.allgather_bucket_size=20000)
run() {  # run NAME NP ARGS...: must succeed
  local name=$1 np=$2
  shift 2
  timeout 120 $MPIRUN -np "$np" "$z3d" train "${tiny[@]}" --run-dir "$tmp/$name" "$@" > "$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "$name failed"; }
}
compare() {  # compare A B TOLERANCE: train records' loss and grad_norm equal (0: bitwise) or within
  /usr/bin/python3 - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'PY' || fail "$1 vs $2 differ"
import sys
from z3dcheck import by_step
a, b, tol = by_step(sys.argv[1], "loss", "grad_norm"), by_step(sys.argv[2], "loss", "grad_norm"), float(sys.argv[3])
ok = a.keys() == b.keys() and all(abs(x - y) <= tol * abs(y) if tol else x == y
                                  for s in a for x, y in zip(a[s], b[s]))
if not ok: print(a, b); sys.exit(1)
PY
}
record() {  # record NAME KEY: the run record's value
  /usr/bin/python3 -c "import sys; from z3dcheck import run_record; print(run_record(sys.argv[1])[sys.argv[2]])" \
    "$tmp/$1/metrics.jsonl" "$2"
}

# ---- 2 ranks: every path and overlap, bitwise ----
for prec in fp32 bf16; do
  p=(); [[ $prec == bf16 ]] && p=(--set bf16.enabled=true)
  for stage in 0 1 2 3; do
    base="mpi_${prec}_s$stage"
    run "$base" 2 "${p[@]}" --set zero_optimization.stage=$stage --set comm.collectives=mpi
    for variant in shm auto; do
      for overlap in false true; do
        name="${variant}_${prec}_s${stage}_$overlap"
        run "$name" 2 "${p[@]}" --set zero_optimization.stage=$stage --set comm.collectives=$variant \
          --set zero_optimization.overlap_comm=$overlap --set wall_clock_breakdown=$overlap
        compare "$base" "$name" 0
      done
    done
    echo "ok   $prec stage $stage: shared memory and auto, with and without overlap_comm, bitwise equal to MPI"
  done
done
[[ $(record shm_fp32_s1_true comm_collectives) == "shared memory" ]] || fail "run record: $(record shm_fp32_s1_true comm_collectives)"
[[ $(record mpi_fp32_s1 comm_collectives) == "MPI" ]] || fail "run record: $(record mpi_fp32_s1 comm_collectives)"
/usr/bin/python3 - "$tmp/auto_fp32_s2_true/metrics.jsonl" <<'PY' || fail "comm time missing or inconsistent"
import sys, z3dcheck
train = z3dcheck.train(sys.argv[1])
assert all(r["comm_s"] > 0 and 0 <= r["comm_exposed_s"] and r["comm_hidden_s"] >= 0 and r["comm_skew_s"] >= 0
           for r in train), train
assert all(abs(r["comm_hidden_s"] - max(0, r["comm_s"] - r["comm_exposed_s"])) < 1e-9 for r in train), train
PY
echo "ok   the run record names the path; comm_s, comm_exposed_s, comm_hidden_s are consistent"

# ---- bucket sizes: the layout's buckets are the smaller of the two; the other collective's
#      messages are runs of them, up to its own size ----
calls() {  # calls NAME OP: the comms log's calls of OP on the dp group
  /usr/bin/python3 -c "import sys; from z3dcheck import records; print(sum(r['calls'] for r in records(sys.argv[1], 'comms')
    if r['group'] == 'dp' and r['op'] == sys.argv[2]))" "$tmp/$1/metrics.jsonl" "$2"
}
for case in "1 fp32 true" "2 bf16 false"; do
  read -r stage prec overlap <<< "$case"
  b=(--set zero_optimization.stage=$stage --set zero_optimization.overlap_comm=$overlap --set comms_logger.enabled=true)
  [[ $prec == bf16 ]] && b+=(--set bf16.enabled=true)
  run "bk_$stage" 2 "${b[@]}"
  run "bk_${stage}_rs" 2 "${b[@]}" --set zero_optimization.reduce_bucket_size=200000
  run "bk_${stage}_ag" 2 "${b[@]}" --set zero_optimization.allgather_bucket_size=200000
  compare "bk_$stage" "bk_${stage}_rs" 0
  compare "bk_$stage" "bk_${stage}_ag" 0
  rs=$(calls "bk_$stage" reduce_scatter) ag=$(calls "bk_$stage" all_gather)
  rs_rs=$(calls "bk_${stage}_rs" reduce_scatter) rs_ag=$(calls "bk_${stage}_rs" all_gather)
  ag_rs=$(calls "bk_${stage}_ag" reduce_scatter) ag_ag=$(calls "bk_${stage}_ag" all_gather)
  (( rs > 0 && rs_rs < rs && rs_ag == ag && ag_ag < ag && ag_rs == rs )) ||
    fail "stage $stage calls (reduce-scatter, all-gather): 20000 both: $rs, $ag; reduce 200000: $rs_rs, $rs_ag;" \
      "allgather 200000: $ag_rs, $ag_ag"
  echo "ok   $prec stage $stage (overlap_comm $overlap): reduce-scatters $rs -> $rs_rs with reduce_bucket_size," \
    "all-gathers $ag -> $ag_ag with allgather_bucket_size, bitwise equal"
done

# ---- 4 ranks: tp 2 x dp 2, and dp 4 across made-up nodes of 2 (shared memory inside, MPI across) ----
run mpi_grid 4 --set tensor_parallel.tp_size=2 --set zero_optimization.stage=2 --set comm.collectives=mpi
run shm_grid 4 --set tensor_parallel.tp_size=2 --set zero_optimization.stage=2 --set comm.collectives=shm \
  --set zero_optimization.overlap_comm=true
compare mpi_grid shm_grid 1e-5
run mpi_dp4 4 --set zero_optimization.stage=1 --set comm.collectives=mpi --set train_micro_batch_size_per_gpu=2
ZERO3D_RANKS_PER_NODE=2 run hier_dp4 4 --set zero_optimization.stage=1 --set comm.collectives=shm \
  --set train_micro_batch_size_per_gpu=2 \
  --set zero_optimization.overlap_comm=true
compare mpi_dp4 hier_dp4 1e-5
[[ $(record hier_dp4 comm_collectives) == "shared memory in each node (2 ranks), MPI across the 2 nodes" ]] ||
  fail "run record: $(record hier_dp4 comm_collectives)"
echo "ok   4 ranks: shared memory (tp 2 x dp 2) and the node hierarchy (dp 4) within 1e-5 of MPI"

# ---- pipeline sends: polled by the group's send thread (default) or only inside MPI calls ----
# Without CMA, OpenMPI moves a large message only while the sender is inside MPI: the thread's case.
pp=(--set pipeline_parallel.pp_size=2 --set zero_optimization.stage=1 --set gradient_accumulation_steps=4)
run pp_nothread 2 "${pp[@]}" --set comm.send_thread=false
run pp_thread 2 "${pp[@]}"
OMPI_MCA_btl_vader_single_copy_mechanism=none run pp_thread_nocma 2 "${pp[@]}" --set wall_clock_breakdown=true
compare pp_nothread pp_thread 0
compare pp_nothread pp_thread_nocma 0
echo "ok   pipeline sends on the send thread (with and without CMA) bitwise equal to sends without it"

# ---- bench comm ----
for np in 2 3; do
  timeout 300 $MPIRUN -np $np "$z3d" bench comm --max-bytes 1048576 --factor 32 --iters 5 --types float,bf16,half \
    > "$tmp/bench$np.log" 2>&1 || { cat "$tmp/bench$np.log"; fail "bench comm on $np ranks failed"; }
  grep -q "wrong elements in all: 0" "$tmp/bench$np.log" || { cat "$tmp/bench$np.log"; fail "bench comm $np: wrong"; }
  [[ $(grep -c "reduce_scatter |" "$tmp/bench$np.log") -ge 3 ]] || { cat "$tmp/bench$np.log"; fail "bench comm rows"; }
done
echo "ok   bench comm on 2 and 3 ranks: every result exact"
expect_exit 2 bench_bad "unknown collective 'all_to_all'" $MPIRUN -np 2 "$z3d" bench comm --ops all_to_all
expect_exit 2 bench_iters "--iters" $MPIRUN -np 2 "$z3d" bench comm --iters 0
echo "ok   bench comm refuses an unknown collective"
