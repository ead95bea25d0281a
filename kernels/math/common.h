// kernels/math/common.h: what makes one function usable from host launchers and CUDA kernels alike.
// Z3D_HD marks per-element / per-row math in kernels/math/*.h; nothing here allocates or loops
// over more than one row, so the launchers (kernels/host, kernels/cuda) own all parallelism.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define Z3D_HD __host__ __device__ __forceinline__
#else
#define Z3D_HD inline
#endif
