# tests/cli/common.sh: sourced by every tests/cli/test_*.sh as `source common.sh "$@"`.
# Arguments: ZERO3D_BINARY SOURCE_DIR. Sets z3d, MPIRUN (the launcher CMake found, more ranks
# than cores allowed) and tmp (a scratch directory removed on exit); works in the source dir.
z3d=$1
MPIRUN="${MPIEXEC:-mpirun} --oversubscribe"
cd "$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
