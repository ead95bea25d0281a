#!/usr/bin/env bash
# tests/cross/aarch64.sh: the host build for aarch64, built here with Debian's cross compiler and
# its tests run under qemu-user. It checks that the default build assumes no x86 (intrinsics,
# cpuid, -march): on aarch64 the host loops compile once, at the "generic" ISA level.
#   tests/cross/aarch64.sh    sysroot (once), configure, build, run the unit and MPI tests
# Environment: ZERO3D_ARM64_SYSROOT (default /opt/arm64-sysroot), BUILD_DIR (default build-aarch64),
# JOBS (default nproc).
#
# The arm64 libraries live in a sysroot, not in the system's multiarch paths: Debian 12's
# libopenmpi-dev:arm64 pulls libevent-dev:arm64 and gfortran:arm64, which are not Multi-Arch:
# same, so installing them removes the amd64 MPI, HDF5 and Slurm. The sysroot is the closure of
# the arm64 packages, resolved by a private apt (its own lists and an empty dpkg status) and
# unpacked; nothing is installed system-wide but the cross compiler and qemu.
# The MPI tests run at 1 and 2 ranks: this machine's mpiexec starts qemu per rank (the same Open
# MPI version on both sides). Not run: the CLI and Slurm tests, which start the zero3d binary
# themselves and so would need binfmt_misc to hand it to qemu.
#
# Too long for tests/run.sh (CI's budget): at JOBS=1 on 2 shared cores of an AMD EPYC,
# 2026-12-04, the sysroot took 50 s (once: 177 packages, 605 MB), configure and build 5.5 min,
# the 164 unit tests 156 s (one qemu start each; 161 passed, 3 skipped: no CUDA, and oneDNN
# has no bf16 GEMM for the emulated CPU), the MPI tests at 1 and 2 ranks 107 s: 10.5 min in all.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source jobscripts/deps.sh
zero3d_install_deps g++-aarch64-linux-gnu qemu-user

sysroot=${ZERO3D_ARM64_SYSROOT:-/opt/arm64-sysroot}
build=${BUILD_DIR:-build-aarch64}
jobs=${JOBS:-$(nproc)}
# What zero3d links (CMakeLists.txt's dependencies), and the C/C++ runtime for the sysroot.
packages=(libc6-dev libstdc++-12-dev libgcc-12-dev
          libopenmpi-dev libhdf5-openmpi-dev libdnnl-dev libopenblas-dev nlohmann-json3-dev libgtest-dev libgmock-dev
          libpcre2-dev libunistring-dev libsentencepiece-dev)

# make_sysroot DIR: the arm64 closure of $packages, unpacked under DIR with a merged /usr.
make_sysroot() {
  local dir=$1 apt=$1/.apt
  local stamp="${packages[*]}"
  [[ -f $dir/.packages && $(cat "$dir/.packages") == "$stamp" ]] && return 0
  echo "cross/aarch64: building the arm64 sysroot in $dir"
  rm -rf "$dir"
  mkdir -p "$apt"/{etc,lists/partial,archives/partial} "$dir"/usr/{bin,sbin,lib}
  ln -s usr/bin "$dir/bin"; ln -s usr/sbin "$dir/sbin"; ln -s usr/lib "$dir/lib"
  local codename
  codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
  cat > "$apt/etc/debian.sources" <<EOF
Types: deb
URIs: ${ZERO3D_DEBIAN_MIRROR:-http://deb.debian.org/debian}
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${ZERO3D_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
Suites: $codename-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  : > "$apt/status"
  local opts=(-q -o APT::Architecture=arm64 -o APT::Architectures=arm64
    -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt/etc"
    -o Dir::State::Lists="$apt/lists" -o Dir::State::status="$apt/status"
    -o Dir::Cache::Archives="$apt/archives" -o Dir::Cache="$apt"
    -o Debug::NoLocking=1 -o APT::Install-Recommends=false)
  apt-get "${opts[@]}" update >/dev/null
  apt-get "${opts[@]}" -y --download-only install "${packages[@]}" >/dev/null
  local deb
  for deb in "$apt"/archives/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$dir"
  done
  # What the alternatives system would link (the maintainer scripts do not run here): OpenBLAS
  # as the BLAS, Open MPI as the MPI (its pkg-config files are how CMake finds it here).
  local lib=$dir/usr/lib/aarch64-linux-gnu f
  for f in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3; do
    ln -sfn "openblas-pthread/$f" "$lib/$f"
  done
  ln -sfn openmpi/lib/libmpi.so "$lib/libmpi.so"
  for f in mpi mpi-c mpi-cxx; do ln -sfn "o$f.pc" "$lib/pkgconfig/$f.pc"; done
  ln -sfn ../../lib/aarch64-linux-gnu/openmpi/include "$dir/usr/include/aarch64-linux-gnu/mpi"
  # Links that name an absolute path mean the sysroot's file, not this machine's: make them
  # relative, so the cross linker and qemu both land inside the sysroot.
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    [[ $target == /* ]] || continue
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir$target")" "$link"
  done < <(find "$dir" -path "$apt" -prune -o -type l -print0)
  echo "cross/aarch64: sysroot of $(ls "$apt"/archives/*.deb | wc -l) packages, $(du -sh --exclude=.apt "$dir" | cut -f1)"
  rm -f "$apt"/archives/*.deb
  echo "$stamp" > "$dir/.packages"
}

make_sysroot "$sysroot"

# Configure and build everything the host build has (CUDA off: no cross CUDA toolkit).
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=tests/cross/aarch64.cmake -DZERO3D_ARM64_SYSROOT="$sysroot" \
  -DCMAKE_BUILD_TYPE=Release -DZERO3D_CUDA=OFF
cmake --build "$build" -j "$jobs"

# Every unit test and the MPI tests at 1 and 2 ranks, each through qemu-aarch64 (the toolchain's
# CMAKE_CROSSCOMPILING_EMULATOR). qemu-user has no process_vm_readv (ENOSYS), which Open MPI's
# shared-memory transport uses for single-copy messages: copy through its buffers instead.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# Left out: Model.SizingBackendCountsWithoutMemory, which checks that 64 GiB of counted allocations
# (address space only, PROT_NONE) leave the resident size alone: qemu-user keeps flags for every page
# a guest maps, 24 bytes each on the host, and that is the 400 MB /proc/self/statm then shows.
qemu-aarch64 -L "$sysroot" "$build/bin/zero3d" --version
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L unit -E '^Model[.]SizingBackendCountsWithoutMemory$'
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L mpi -R '_np[12]$'
