# jobscripts/deps.sh: sourced by quickstart.sh and tests/run.sh. Installs the Debian 12 packages
# zero3d builds and tests with, only those missing (apt-get as root, else sudo).
# On a cluster, load your site's modules instead and set ZERO3D_SKIP_APT=1.
zero3d_packages=(
  build-essential cmake pkg-config       # compiler, CMake
  libopenmpi-dev openmpi-bin             # MPI
  libhdf5-openmpi-dev hdf5-tools         # parallel HDF5 (checkpoints), h5dump
  libdnnl-dev                            # oneDNN: host GEMM (fp32, bf16), ISA picked at run time
  libopenblas-dev                        # a CBLAS (compute.gemm=cblas; a site's tuned BLAS instead)
  nlohmann-json3-dev                     # config and metrics JSON
  libpcre2-dev libunistring-dev          # tokenizer.json: split regexes (PCRE2 JIT), NFC
  libsentencepiece-dev                   # tokenizer.model (SentencePiece)
  libgtest-dev libgmock-dev              # unit tests (test_ckpt_dir uses gmock matchers)
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev  # the Kokkos backend (Serial only in Debian)
  python3 python3-matplotlib python3-pandas python3-h5py  # postprocess/ and test checks
)
# tests/run.sh only: tests/slurm starts a private single-node Slurm (sbatch, srun --mpi=pmix);
# tests/cli/test_faults.sh fails I/O calls in running ranks with libfiu (fiu-run, fiu-ctrl);
# tests/cli/test_hf.sh compares against PyTorch (python3-torch); tests/fuzz needs clang's libFuzzer;
# tests/cli/test_tokenizers.sh trains and runs SentencePiece models (sentencepiece: spm_train,
# spm_encode), and compares with npm packages where node and npm are on PATH (not installed here:
# any recent node, the site's or NodeSource's; tests/run.sh installs the packages, the test skips
# without them); tests/cli/test_install.sh loads the installed modulefiles through Lmod (lmod, which
# reads Environment Modules' Tcl files too; Debian's environment-modules conflicts with it).
zero3d_test_packages=(slurm-wlm slurm-wlm-basic-plugins munge fiu-utils python3-torch clang-14 libclang-rt-14-dev
                      sentencepiece lmod)

# zero3d_install_deps [EXTRA_PACKAGE...]
zero3d_install_deps() {
  [[ "${ZERO3D_SKIP_APT:-0}" == 1 ]] && return 0
  local missing=() p
  for p in "${zero3d_packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  echo "zero3d: installing ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# As root, OpenMPI refuses to start unless told it is on purpose (containers, CI).
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
