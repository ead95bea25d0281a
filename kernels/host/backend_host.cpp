// Host backend: kernels/math launched with Kokkos on the host execution space, GEMM through CBLAS
// (OpenBLAS here, MKL/BLIS/LibSci on sites). Memory is 64-byte aligned RAM, zeroed on alloc.
// Column reductions (bias and LayerNorm weight gradients) loop rows outermost so the inner loop
// streams contiguous memory.
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/backend.h"
#include "kernels/math/crossentropy.h"
#include "kernels/math/dtype.h"
#include "kernels/math/gelu.h"
#include "kernels/math/layernorm.h"
#include "kernels/math/softmax.h"

namespace zero3d {
namespace {

using HostSpace = Kokkos::DefaultHostExecutionSpace;
using Range = Kokkos::RangePolicy<HostSpace, size_t>;

template <typename F>
void for_each(size_t n, F&& f) {
  Kokkos::parallel_for("zero3d", Range(0, n), f);
}

CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

class HostBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::host; }
  std::string describe() const override { return std::string("host (Kokkos ") + HostSpace::name() + " + CBLAS)"; }

  void* alloc_bytes(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw UserError(strprintf("out of host memory allocating %zu bytes", bytes));
    std::memset(p, 0, rounded);
    return p;
  }
  void free_bytes(void* p) override { std::free(p); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void synchronize() override { HostSpace().fence(); }

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc) override {
    cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_strided_batched(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda,
                            long strideA, const float* B, int ldb, long strideB, float beta, float* C, int ldc,
                            long strideC, int batch) override {
    for (int i = 0; i < batch; ++i)
      cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), m, n, k, alpha, A + i * strideA, lda, B + i * strideB, ldb, beta,
                  C + i * strideC, ldc);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    for_each(N, [=](size_t n) {
      const int row = tokens[n] - vocab_start;
      const bool here = row >= 0 && row < vocab_rows;
      const float* e = wte + static_cast<size_t>(here ? row : 0) * C;
      const float* p = wpe ? wpe + (n % T) * C : nullptr;
      float* o = out + n * C;
      for (int c = 0; c < C; ++c) o[c] = (here ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
    });
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    // Serial over rows: two rows may share a token (and every T-th row a position).
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<size_t>(n) * C;
      const int row = tokens[n] - vocab_start;
      float* p = dwpe + static_cast<size_t>(n % T) * C;
      for (int c = 0; c < C; ++c) p[c] += d[c];
      if (row < 0 || row >= vocab_rows) continue;
      float* e = dwte + static_cast<size_t>(row) * C;
      for (int c = 0; c < C; ++c) e[c] += d[c];
    }
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C) override {
    for_each(N, [=](size_t n) { math::layernorm_row_forward(out + n * C, mean + n, rstd + n, x + n * C, w, b, C); });
  }
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    for_each(N, [=](size_t n) {
      math::layernorm_row_backward_input(dx + n * C, dy + n * C, x + n * C, w, mean[n], rstd[n], C);
    });
    for (int n = 0; n < N; ++n) {
      const float* dyr = dy + static_cast<size_t>(n) * C;
      const float* xr = x + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) {
        dw[c] += dyr[c] * math::layernorm_xhat(xr[c], mean[n], rstd[n]);
        db[c] += dyr[c];
      }
    }
  }
  void add_bias(float* out, const float* bias, int N, int C) override {
    for_each(N, [=](size_t n) {
      float* o = out + n * C;
      for (int c = 0; c < C; ++c) o[c] += bias[c];
    });
  }
  void bias_backward(float* dbias, const float* dout, int N, int C) override {
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<size_t>(n) * C;
      for (int c = 0; c < C; ++c) dbias[c] += d[c];
    }
  }
  void gelu_forward(float* out, const float* x, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = math::gelu_forward(x[i]); });
  }
  void gelu_backward(float* dx, const float* x, const float* dout, size_t n) override {
    for_each(n, [=](size_t i) { dx[i] = math::gelu_backward(x[i], dout[i]); });
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = a[i] + b[i]; });
  }
  void accumulate(float* out, const float* a, size_t n) override {
    for_each(n, [=](size_t i) { out[i] += a[i]; });
  }
  void softmax_causal_forward(float* p, const float* pre, int rows, int T) override {
    for_each(rows, [=](size_t r) { math::softmax_causal_row_forward(p + r * T, pre + r * T, r % T, T); });
  }
  void softmax_causal_backward(float* dpre, const float* dp, const float* p, int rows, int T) override {
    for_each(rows, [=](size_t r) {
      math::softmax_causal_row_backward(dpre + r * T, dp + r * T, p + r * T, r % T, T);
    });
  }
  void crossentropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                    float dloss) override {
    for_each(N, [=](size_t n) {
      const float* z = logits + n * V;
      losses[n] = dlogits ? math::crossentropy_row_forward_backward(dlogits + n * V, z, targets[n], V, dloss)
                          : math::crossentropy_row_forward(z, targets[n], V);
    });
  }
  void vocab_row_max(float* row_max, const float* logits, int N, int V) override {
    for_each(N, [=](size_t n) { row_max[n] = math::row_max(logits + n * V, V); });
  }
  void vocab_sumexp(float* sumexp, float* target_logit, const float* logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V) override {
    for_each(N, [=](size_t n) {
      const float* z = logits + n * V;
      sumexp[n] = math::row_sumexp(z, V, row_max[n]);
      const int t = targets[n] - vocab_start;
      target_logit[n] = t >= 0 && t < V ? z[t] : 0.0f;
    });
  }
  void vocab_crossentropy_grad(float* dlogits, const float* logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, float dloss) override {
    for_each(N, [=](size_t n) {
      const int t = targets[n] - vocab_start;
      math::crossentropy_row_grad(dlogits + n * V, logits + n * V, V, row_max[n], sumexp[n], t >= 0 && t < V ? t : -1,
                                  dloss);
    });
  }
  void adam_step(float* p, float* m, float* v, const float* g, size_t n, const math::AdamParams& a) override {
    math::AdamParams params = a;
    for_each(n, [=](size_t i) { math::adam_element(p + i, m + i, v + i, g[i], params); });
  }
  void scale(float* x, float s, size_t n) override {
    for_each(n, [=](size_t i) { x[i] *= s; });
  }
  void cast_to_bf16(uint16_t* out, const float* x, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = math::bf16_from_float(x[i]); });
  }
  void cast_from_bf16(float* out, const uint16_t* x, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = math::float_from_bf16(x[i]); });
  }
  void cast_to_fp16(uint16_t* out, const float* x, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = math::fp16_from_float(x[i]); });
  }
  void cast_from_fp16(float* out, const uint16_t* x, size_t n) override {
    for_each(n, [=](size_t i) { out[i] = math::float_from_fp16(x[i]); });
  }

  void accumulate_bf16(uint16_t* acc, const float* x, size_t n) override {
    for_each(n, [=](size_t i) { acc[i] = math::bf16_from_float(math::float_from_bf16(acc[i]) + x[i]); });
  }
  void accumulate_fp16(uint16_t* acc, const float* x, size_t n) override {
    for_each(n, [=](size_t i) { acc[i] = math::fp16_from_float(math::float_from_fp16(acc[i]) + x[i]); });
  }

  double sum_squares(const float* x, size_t n) override {
    double s = 0.0;
    Kokkos::parallel_reduce("zero3d_sumsq", Range(0, n), [=](size_t i, double& acc) {
      acc += static_cast<double>(x[i]) * x[i];
    }, s);
    return s;
  }
  size_t count_nonfinite(const float* x, size_t n) override {
    size_t c = 0;
    Kokkos::parallel_reduce("zero3d_nonfinite", Range(0, n), [=](size_t i, size_t& acc) {
      acc += std::isfinite(x[i]) ? 0 : 1;
    }, c);
    return c;
  }
  double sum(const float* x, size_t n) override {
    double s = 0.0;
    Kokkos::parallel_reduce("zero3d_sum", Range(0, n), [=](size_t i, double& acc) { acc += x[i]; }, s);
    return s;
  }
};

}  // namespace

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace zero3d
