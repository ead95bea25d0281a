# shellcheck shell=bash
# jobscripts/cluster_env.sh: the environment a zero3d job needs on a cluster, sourced by
# train.sbatch in the batch shell before srun (srun passes it on to every rank).
#
# Rules: a variable already set (in your shell at sbatch time, or through --export) is never
# changed; a default is exported only where it is safe everywhere, this CPU-only test machine
# included; site-specific values are left as commented examples: copy them into your shell,
# your site module, or a copy of this file, with your machine's interface and adapter names
# (`ip -br link`, `ibv_devinfo -l`, `ucx_info -d`, `nvidia-smi topo -m` tell you which).
#
# Today zero3d's collectives go through MPI (OpenMPI over UCX on InfiniBand/RoCE, shared memory
# inside a node); the NCCL variables matter once the CUDA backend's collectives use NCCL, and
# cost nothing before.

# ---- threads per rank ----
# One thread per core Slurm gave the rank (--cpus-per-task, default 1) for zero3d's host loops and
# GEMMs (OpenMP; zero3d would take the CPUs of its affinity mask anyway, this makes it explicit):
# more threads than cores oversubscribe them and every rank waits for the slowest.
# OPENBLAS_NUM_THREADS only matters with compute.gemm="cblas" (zero3d sets OpenBLAS's pool to the
# same count itself).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}

# ---- OpenMPI and UCX ----
# More ranks than cores (sbatch -O / --overcommit): an MPI rank waiting in a collective must give its
# core to the rank it waits for instead of spinning (mpirun --oversubscribe does this by itself,
# srun does not: collective MPI-IO checkpoint writes took 10 s instead of 0.06 s without it).
if [[ ${SLURM_OVERCOMMIT:-0} == 1 ]]; then
  export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
fi
# With an InfiniBand/RoCE adapter, OpenMPI's UCX point-to-point layer (pml ucx) is the fast path
# across nodes; the old openib transport is switched off so it does not warn or get picked. Without
# one (this machine, Ethernet-only clusters) OpenMPI's default (ob1 over shared memory and TCP) stays.
if compgen -G "/sys/class/infiniband/*" >/dev/null; then
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ucx}
  export OMPI_MCA_btl=${OMPI_MCA_btl:-^openib}
fi
# Which transports UCX may use: rc (reliable connection, InfiniBand verbs) or dc (scales to more
# nodes), sm (shared memory inside a node), self; add cuda_copy,cuda_ipc,gdr_copy for GPU buffers.
# Unset, UCX picks from what it finds; set it when UCX picks TCP on a machine that has InfiniBand.
# export UCX_TLS=${UCX_TLS:-rc,sm,self}
# Which adapter:port UCX uses: the one next to the GPU/CPU socket, from `ucx_info -d` / `ibv_devinfo -l`.
# export UCX_NET_DEVICES=${UCX_NET_DEVICES:-mlx5_0:1}

# ---- NCCL (GPU collectives) ----
# WARN: only problems. Set INFO for the first multi-node run: it prints the transport it chose per
# peer (NET/IB with GDRDMA is what you want across nodes; NET/Socket means InfiniBand was not found).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# The network interface NCCL's bootstrap (and its socket transport) uses. Unset, NCCL takes the
# first that is not lo or docker*; set it when that is a management network: e.g. ib0, or ^eth1.
# export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}
# The InfiniBand adapters (and ports) NCCL may use, e.g. mlx5_0:1,mlx5_1:1, or =mlx5_0 for exactly
# that one; exclude storage-only adapters here.
# export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5}
# GPUDirect RDMA: the farthest PCIe distance between GPU and adapter at which the adapter reads GPU
# memory directly (LOC, PIX, PXB, PHB, SYS). Unset, NCCL decides from the topology; set PHB or SYS
# only where the GPUDirect kernel module (nvidia-peermem) is loaded and the site says it is supported.
# export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}

# ---- CUDA ----
# 1 makes a GPU run kernels in the order they were issued across streams: Megatron sets it so its
# communication kernels start before the compute they overlap. zero3d's CUDA backend computes on one
# stream, so it changes nothing today; set it if you profile and see collectives queued behind compute.
# export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

# ---- parallel HDF5 (checkpoints) ----
# HDF5 locks files it opens; Lustre mounted without flock and some NFS setups refuse the lock, and
# checkpoint saves then fail with "unable to lock file". FALSE turns HDF5's locking off (zero3d
# commits a checkpoint by rename, so nothing relies on the lock).
# export HDF5_USE_FILE_LOCKING=${HDF5_USE_FILE_LOCKING:-FALSE}
