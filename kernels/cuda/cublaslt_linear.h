// kernels/cuda/cublaslt_linear.h: a linear layer's forward as one cuBLASLt matmul,
// y = x W^T + bias + residual. The bias is added in the GEMM's epilogue and the residual enters as
// beta * C (C = residual, D = y), so neither costs a pass over y as separate kernels would. The
// MLP's first layer also takes its GELU there (GELU_AUX_BIAS: the pre-activation is written as
// the auxiliary output that backward reads).
//
// A plan (the descriptors and the heuristic's algorithm) is made once per shape, operand and output
// type and pointer alignment, then reused. A shape cuBLASLt has no algorithm for is remembered as
// such and forward() returns false: the caller then runs its GEMM and the passes, with the same
// results to fp32 rounding. Operands are fp32 (plain fp32 compute, no TF32) or bf16 with fp32
// accumulation; the output fp32 or bf16 (rounded once, in the epilogue), the bias fp32 either way
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: a cuBLASLt without that combination has no algorithm for
// it, and the caller's fallback runs). With the GELU and a bf16 output, y is the GELU of the fp32
// pre-activation, as on the host (and in the caller's unfused fallback).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/tensor.h"

namespace zero3d {

class LtLinear {
 public:
  LtLinear();
  ~LtLinear();
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;

  // Row-major x (N x in) and W (out x in), both fp32 or both bf16 (`bf16`); y (N x out) fp32 or
  // bf16; bias (out, fp32) or null; residual (N x out, y's type, not aliasing y) or null. With
  // `gelu_pre` (y's type; then no residual): gelu_pre = x W^T + bias and y = gelu(gelu_pre), the
  // GELU in the epilogue too. Enqueued on `stream`. False: no cuBLASLt algorithm for this case,
  // nothing was enqueued.
  bool forward(cudaStream_t stream, View y, const void* x, const void* w, bool bf16, const float* bias,
               ConstView residual, int N, int in, int out, View gelu_pre = nullptr);

 private:
  struct Plan;
  // N, in, out, bf16 operands, bf16 output, bias, residual, gelu, and the alignments of W, x, C, y,
  // bias and the auxiliary output (0: none), in bytes up to 256: the heuristic picks kernels by them.
  using Key = std::tuple<int, int, int, bool, bool, bool, bool, bool, std::array<uint32_t, 6>>;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory the algorithms may use
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace zero3d
