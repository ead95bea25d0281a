// kernels/cuda/cublaslt_linear.h: a linear layer's forward as one cuBLASLt matmul,
// y = x W^T + bias + residual. The bias is added in the GEMM's epilogue and the residual enters as
// beta * C (C = residual, D = y), so neither costs a pass over y as separate kernels would. The
// MLP's first layer also takes its GELU there (GELU_AUX_BIAS: the pre-activation is written as
// the auxiliary output that backward reads).
//
// A plan (the descriptors and the heuristic's algorithm) is made once per shape, operand type and
// pointer alignment, then reused. A shape cuBLASLt has no algorithm for is remembered as such and
// forward() returns false: the caller then runs its GEMM and the passes, with the same results to
// fp32 rounding. Operands are fp32 (plain fp32 compute, no TF32) or bf16 with fp32 accumulation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace zero3d {

class LtLinear {
 public:
  LtLinear();
  ~LtLinear();
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;

  // Row-major x (N x in) and W (out x in), both fp32 or both bf16 (`bf16`); y (N x out) fp32;
  // bias (out) and residual (N x out, not aliasing y) fp32 or null. With `gelu_pre` (then no
  // residual): gelu_pre = x W^T + bias and y = gelu(gelu_pre), the GELU in the epilogue too.
  // Enqueued on `stream`. False: no cuBLASLt algorithm for this case, nothing was enqueued.
  bool forward(cudaStream_t stream, float* y, const void* x, const void* w, bool bf16, const float* bias,
               const float* residual, int N, int in, int out, float* gelu_pre = nullptr);

 private:
  struct Plan;
  // N, in, out, bf16, bias, residual, gelu, and whether every pointer is 16-byte aligned (the
  // heuristic picks kernels by alignment).
  using Key = std::tuple<int, int, int, bool, bool, bool, bool, bool>;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory the algorithms may use
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace zero3d
