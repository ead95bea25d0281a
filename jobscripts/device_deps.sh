#!/usr/bin/env bash
# jobscripts/device_deps.sh: the Debian 12 libraries zero3d builds against (MPI, parallel HDF5,
# oneDNN, OpenBLAS, nlohmann-json, PCRE2, libunistring, SentencePiece, GoogleTest), carried to a
# machine that has a compiler, CMake and CUDA but none of these and no network (a lent GPU
# machine: jobscripts/device_check.sh).
#   device_deps.sh fetch DIR           here, with apt: the .deb files into DIR (about 40 MB)
#   device_deps.sh unpack DIR PREFIX   there: unpacked under PREFIX (dpkg -x: nothing installed
#                                      system-wide, no root needed), with the links and paths
#                                      Debian's maintainer scripts would make, and PREFIX/env.sh
#                                      to source (PATH, LD_LIBRARY_PATH, Open MPI's relocation)
# The list is what a bare Debian 12 with build-essential and python3 lacks (and, below, what a newer
# distribution names differently), without the Fortran
# compiler, the autotools, X11 (hwloc's optional plugins) and -dev packages nothing here includes;
# any newer glibc runs these libraries.
set -euo pipefail

packages=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-2.1-7
  libevent-core-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7 libevent-pthreads-2.1-7 libfabric1
  libucx0 libibverbs1 ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200
  libnl-route-3-200 libnuma1 libmunge2 libltdl7 libgfortran5 zlib1g
  libhdf5-openmpi-dev libhdf5-openmpi-103-1 libhdf5-openmpi-cpp-103-1 libhdf5-openmpi-hl-100
  libhdf5-openmpi-hl-cpp-100 libsz2 libaec0 libcurl4 libnghttp2-14 libpsl5 librtmp1 libssh2-1
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libbrotli1
  libdnnl-dev libdnnl2 ocl-icd-libopencl1
  libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread
  nlohmann-json3-dev libgtest-dev googletest
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libunistring-dev
  libsentencepiece-dev libsentencepiece0
  # What Debian's libcurl (linked by its HDF5) needs: on a newer distribution some are gone under
  # these sonames (Ubuntu 24.04 has libunistring.so.5, not .2), so the whole set travels.
  libunistring2 libidn2-0 libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libtasn1-6 libffi8
  libgssapi-krb5-2 libkrb5-3 libkrb5support0 libk5crypto3 libcom-err2 libkeyutils1 libssl3 libzstd1
  libquadmath0 libudev1
)

fetch() {
  local dir=$1
  mkdir -p "$dir"
  rm -f "$dir"/*.deb  # only this list's versions
  (cd "$dir" && apt-get download -q "${packages[@]}" >/dev/null)
  local n
  n=$(ls "$dir"/*.deb | wc -l)
  ((n == ${#packages[@]})) || { echo "device_deps: $n of ${#packages[@]} packages in $dir" >&2; exit 1; }
  echo "device_deps: ${#packages[@]} packages, $(du -sh "$dir" | cut -f1), in $dir"
}

unpack() {
  local dir=$1 prefix=$2 deb
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  for deb in "$dir"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  local u=$prefix/usr lib=$prefix/usr/lib/x86_64-linux-gnu
  # What the alternatives system would link.
  for t in mpicc mpicxx mpic++ mpirun mpiexec ompi_info; do
    [[ -e $u/bin/$t.openmpi ]] && ln -sf "$t.openmpi" "$u/bin/$t"
  done
  ln -sf h5pcc.openmpi "$u/bin/h5pcc"
  ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
  ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
  ln -sf openblas-pthread/libblas.so.3 "$lib/libblas.so.3"
  ln -sf openmpi/lib/libmpi.so "$lib/libmpi.so"
  ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$lib/libpsm_infinipath.so.1"
  # HDF5's compiler wrapper names its install prefix literally, and links what its -dev
  # dependencies would provide unversioned: link those to the versioned libraries, carried or the
  # machine's own.
  sed -i "s|^prefix=\"/usr\"|prefix=\"$u\"|" "$u/bin/h5pcc.openmpi"
  local name found
  for name in crypto.so.3 curl.so.4 sz.so.2 z.so.1; do
    found=$(ls "$lib/lib$name" "$prefix/lib/x86_64-linux-gnu/lib$name" 2>/dev/null | head -1 || true)
    [[ -n $found ]] || found=$(/sbin/ldconfig -p | awk -v n="lib$name" '$1 == n && /x86-64/ && !f {print $NF; f = 1}')
    [[ -n $found ]] || { echo "device_deps: lib$name is neither carried nor on this machine" >&2; exit 1; }
    ln -sf "$found" "$lib/lib${name%.so.*}.so"
  done
  cat > "$prefix/env.sh" <<EOF
# Source before building or running zero3d with the libraries under $prefix.
export PATH="$u/bin:\$PATH"
export LD_LIBRARY_PATH="$lib:$prefix/lib/x86_64-linux-gnu:$lib/openmpi/lib:$lib/openblas-pthread:\\
$lib/hdf5/openmpi\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}"  # the link step of HDF5's wrapper
export CMAKE_PREFIX_PATH="$u\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export OPAL_PREFIX="$u" OPAL_SYSCONFDIR="$prefix/etc/openmpi" PMIX_INSTALL_PREFIX="$lib/pmix2"
export OMPI_MCA_plm_rsh_agent=false  # one node: Open MPI need not look for ssh
EOF
  echo "device_deps: unpacked under $prefix; source $prefix/env.sh"
}

case "${1:-}" in
  fetch) fetch "${2:?usage: device_deps.sh fetch DIR}" ;;
  unpack) unpack "${2:?usage: device_deps.sh unpack DIR PREFIX}" "${3:?usage: device_deps.sh unpack DIR PREFIX}" ;;
  *) echo "usage: device_deps.sh fetch DIR | unpack DIR PREFIX" >&2; exit 2 ;;
esac
