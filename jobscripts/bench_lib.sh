# jobscripts/bench_lib.sh: what the benchmark scripts share (bench_peer, ckpt_bandwidth,
# ckpt_overlap, offload_bench, overlap_bench). Sourced after `set -euo pipefail`; defines:
#   bench_init   cd to the repository root; z3d (ZERO3D_BIN, default build/bin/zero3d, checked);
#                mpirun, an array (MPIRUN: a command line, default "mpirun --oversubscribe"; under
#                Slurm MPIRUN="srun --mpi=pmix"); PY (PYTHON, default /usr/bin/python3: Debian's
#                pandas, h5py and torch); Open MPI's consent to run as root
#   bench_run LOG CMD...   echoes CMD with a leading "+", runs it with its output in LOG; on failure
#                prints the last lines of LOG and exits 1
# Medians, spreads and the records of a run: postprocess/bench_stats.py (import it from the
# scripts' Python: sys.path.insert(0, "postprocess")).

bench_init() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  z3d=${ZERO3D_BIN:-build/bin/zero3d}
  [[ -x $z3d ]] || { echo "$(basename "$0"): $z3d not found: build it first (tests/run.sh, or cmake -S . -B build && cmake --build build)" >&2; exit 2; }
  read -r -a mpirun <<< "${MPIRUN:-mpirun --oversubscribe}"
  PY=${PYTHON:-/usr/bin/python3}
  if [[ $(id -u) == 0 ]]; then  # Open MPI refuses root without these
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

bench_run() {
  local log=$1; shift
  printf '+'; printf ' %q' "$@"; printf '\n'
  "$@" > "$log" 2>&1 || { local rc=$?; echo "$(basename "$0"): failed (exit $rc); last lines of $log:" >&2; tail -n 20 "$log" >&2; exit 1; }
}
