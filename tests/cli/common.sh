# tests/cli/common.sh: sourced by every tests/cli/test_*.sh as `source common.sh "$@"`; also defines
# fail and expect_exit.
# Arguments: ZERO3D_BINARY SOURCE_DIR. Sets z3d, MPIRUN (the launcher CMake found, more ranks
# than cores allowed) and tmp (a scratch directory removed on exit); works in the source dir.
z3d=$1
MPIRUN="${MPIEXEC:-mpirun} --oversubscribe"
cd "$2"
tmp=$(mktemp -d)
# stop_jobs: the test's background runs (a case that failed left them) die with it; their ranks
# die with their launcher (PR_SET_PDEATHSIG). Otherwise they train on and slow every later test.
stop_jobs() { local j; for j in $(jobs -p); do pkill -9 -P "$j" 2>/dev/null; kill -9 "$j" 2>/dev/null; done; return 0; }
trap 'stop_jobs; rm -rf "$tmp"' EXIT

# fail MESSAGE: the test fails, saying why.
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_exit CODE NAME PATTERN CMD...: CMD exits with CODE and its output matches PATTERN (grep -E).
expect_exit() {
  local code=$1 name=$2 pattern=$3 rc=0
  shift 3
  timeout 60 "$@" > "$tmp/$name.log" 2>&1 || rc=$?
  [[ $rc -eq $code ]] || { cat "$tmp/$name.log"; fail "$name: exit code $rc, expected $code"; }
  grep -qE -- "$pattern" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: output lacks /$pattern/"; }
  echo "ok $name"
}
