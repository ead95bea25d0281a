// kernels/cuda/check.cuh: status checks for CUDA runtime and cuBLAS calls (NCCL's are in
// nccl_collectives.cpp, the one file that may see NCCL), all built from the one generator in
// core/check.h so a failure prints statement, rank, host, file and line and aborts every rank
// through MPI_Abort. Kernel launches return no status: follow each with
// CUDA_CHECK(cudaGetLastError()) to catch bad launch configurations at the launch site.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(stmt) Z3D_CHECK_GEN("CUDA", stmt, status == cudaSuccess, cudaGetErrorString(status))
#define CUBLAS_CHECK(stmt) \
  Z3D_CHECK_GEN("cuBLAS", stmt, status == CUBLAS_STATUS_SUCCESS, cublasGetStatusString(status))
