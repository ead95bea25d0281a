# tests/cli/common.sh: sourced by every tests/cli/test_*.sh as `source common.sh "$@"`; also defines
# fail, expect_exit, expect_rc, has, train_layout, opened and wait_opened.
# Arguments: ZERO3D_BINARY SOURCE_DIR. Sets z3d, MPIRUN (the launcher CMake found, more ranks
# than cores allowed) and tmp (a scratch directory removed on exit); works in the source dir.
z3d=$1
MPIRUN="${MPIEXEC:-mpirun} --oversubscribe"
cd "$2"
# The checks' Python imports what they share from tests/cli/z3dcheck.py.
export PYTHONPATH=$PWD/tests/cli${PYTHONPATH:+:$PYTHONPATH}
tmp=$(mktemp -d)
# stop_jobs: the test's background runs (a case that failed left them) die with it; their ranks
# die with their launcher (PR_SET_PDEATHSIG). Otherwise they train on and slow every later test.
stop_jobs() { local j; for j in $(jobs -p); do pkill -9 -P "$j" 2>/dev/null; kill -9 "$j" 2>/dev/null; done; return 0; }
trap 'stop_jobs; rm -rf "$tmp"' EXIT

# opened PID NAME: process PID has a file whose path contains NAME open or mapped.
opened() { ls -l "/proc/$1/fd" 2>/dev/null | grep -qF -- "$2" || grep -qF -- "$2" "/proc/$1/maps" 2>/dev/null; }
# wait_opened PID NAME LOG: until PID has NAME open (at most 30 s), else the test fails showing LOG.
wait_opened() {
  for _ in $(seq 300); do opened "$1" "$2" && return; sleep 0.1; done
  fail "pid $1 never opened $2: $(tail -5 "$3")"
}
# fail MESSAGE: the test fails, saying why.
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_exit CODE NAME PATTERN CMD...: CMD exits with CODE and its output matches PATTERN (grep -E).
expect_exit() {
  local code=$1 name=$2 pattern=$3 rc=0
  shift 3
  timeout 60 "$@" > "$tmp/$name.log" 2>&1 || rc=$?
  expect_rc "$name" "$code"
  has "$name" "$pattern"
  echo "ok $name"
}

# For a test's own `run NAME ...` that leaves its exit code in $rc and its output in $tmp/NAME.log:
# expect_rc NAME CODE: that code was CODE; has NAME PATTERN: the output matches PATTERN (grep -E).
# Either fails the test with the log.
expect_rc() {
  [[ $rc -eq $2 ]] || { cat "$tmp/$1.log"; fail "$1: exit code $rc, expected $2"; }
}
has() {
  grep -qE -- "$2" "$tmp/$1.log" || { cat "$tmp/$1.log"; fail "$1: no /$2/ in its output"; }
}

# train_layout CONFIG NAME TP PP DP GAS [ARGS...]: CONFIG for 20 steps on tp x pp x dp ranks, the
# global batch of 8 sequences in micro-batches of 8 / DP / GAS, into $tmp/NAME (log $tmp/NAME.log);
# the test fails with the log's tail when the run does. For the per-layout comparisons.
train_layout() {
  local config=$1 name=$2 tp=$3 pp=$4 dp=$5 gas=$6
  shift 6
  timeout 300 $MPIRUN -np $((tp * pp * dp)) "$z3d" train "$config" --run-dir "$tmp/$name" \
    --peak-flops 1e11 --set train_steps=20 --set data.val="" --set train_batch_size=8 \
    --set gradient_accumulation_steps=$gas --set train_micro_batch_size_per_gpu=$((8 / dp / gas)) \
    --set tensor_parallel.tp_size=$tp --set pipeline_parallel.pp_size=$pp --set comm_timeout_s=60 "$@" \
    > "$tmp/$name.log" 2>&1 || { echo "run $name failed:"; tail -20 "$tmp/$name.log"; exit 1; }
}
