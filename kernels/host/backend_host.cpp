// Host backend: the loops of kernels/host/cpu_kernels.h at the best ISA level this CPU runs, on
// the rank's OpenMP threads, and GEMM through oneDNN or a CBLAS (kernels/host/gemm.h). Memory is
// RAM, zeroed (so touched) on allocation, and counted: 64-byte aligned, a page or more on page
// boundaries (swap files move the optimizer's records with O_DIRECT: storage/swap_file.h).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/shared_memory.h"
#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"

namespace zero3d {
namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(const HostOptions& o, const cpu::Kernels& k)
      : k_(k), gemm_(make_gemm_plan(o.gemm, o.bf16_gemm)), count_(o.count_only) {
    prof_.on = count_;  // counting is all it does
  }

  BackendKind kind() const override { return BackendKind::host; }
  std::string describe() const override {
    return strprintf("host (%s loops, %d threads; GEMM %s)", k_.isa, cpu::threads(), describe_gemm().c_str());
  }
  bool bf16_gemm() const override { return gemm_.plan().bf16; }
  uint64_t launch_count() const override { return prof_.issued; }
  std::string describe_gemm() const override {  // the plan and the libraries it uses
    const GemmPlan& p = gemm_.plan();
    std::vector<std::string> libs;
    for (GemmLibrary l : {GemmLibrary::onednn, GemmLibrary::cblas})
      if (p.bf16 ? l == GemmLibrary::onednn : p.forward == l || p.input_grad == l || p.weight_grad == l)
        libs.push_back(l == GemmLibrary::onednn ? onednn_version() + " " + onednn_isa() : cblas_name());
    std::string s = p.describe() + " (" + libs[0];
    if (libs.size() > 1) s += "; " + libs[1];
    return s + ")";
  }

  void* alloc_bytes(size_t bytes) override {
    const size_t align = bytes >= 4096 ? 4096 : 64, rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) throw UserError(strprintf("out of host memory allocating %zu bytes", bytes));
    std::memset(p, 0, rounded);
    ++allocs_;
    return p;
  }
  void* alloc_comm_bytes(size_t bytes) override {
    void* p = alloc_shared(bytes);
    if (!p) return alloc_bytes(bytes);  // no memfd here: the collectives copy through their segment
    ++allocs_;
    return p;
  }
  size_t alloc_count() const override { return allocs_; }
  OpProfile* profile() override { return &prof_; }
  void free_bytes(void* p) override {
    if (!free_shared(p)) std::free(p);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    OpProfile::Scope op(&prof_, "copy", 2.0 * bytes, 0);
    if (!count_) std::memmove(dst, src, bytes);
  }
  void zero(void* p, size_t bytes) override {
    OpProfile::Scope op(&prof_, "zero", 1.0 * bytes, 0);
    if (!count_) std::memset(p, 0, bytes);
  }
  void synchronize() override {}

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, GemmWeight B, int ldb,
            float beta, float* C, int ldc) override {
    OpProfile::Scope op(&prof_, ta ? "gemm_weight_grad" : tb ? "gemm_forward" : "gemm_input_grad", 4.0 * (double(m) * k + double(k) * n + double(m) * n * (beta != 0 ? 2 : 1)), 2.0 * m * n * k);
    if (!count_) gemm_.gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void linear_forward(float* y, const float* x, GemmWeight w, const float* bias, const float* residual, int N,
                      int in, int out) override {
    OpProfile::Scope op(&prof_, "linear_forward", 4.0 * (double(N) * in + double(in) * out + double(N) * out * (residual ? 2 : 1)), 2.0 * N * in * out);
    if (!count_) gemm_.linear(y, x, w, bias, residual, N, in, out);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    OpProfile::Scope op(&prof_, "embedding_forward", 12.0 * N * C, 0);
    k_.embedding_forward(out, tokens, wte, wpe, N, T, C, vocab_start, vocab_rows);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    OpProfile::Scope op(&prof_, "embedding_backward", 20.0 * N * C, 0);
    k_.embedding_backward(dwte, dwpe, dout, tokens, N, T, C, vocab_start, vocab_rows);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                         int C) override {
    OpProfile::Scope op(&prof_, "layernorm_forward", 8.0 * N * C, 0);
    k_.layernorm_forward(out, mean, rstd, x, w, b, N, C);
  }
  void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    OpProfile::Scope op(&prof_, "layernorm_backward", 24.0 * N * C, 0);
    k_.layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
  }
  void bias_backward(float* dbias, const float* dout, int N, int C) override {
    OpProfile::Scope op(&prof_, "bias_backward", 4.0 * N * C, 0);
    k_.bias_backward(dbias, dout, N, C);
  }
  void gelu_forward(float* out, const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "gelu_forward", 8.0 * n, 0);
    k_.gelu_forward(out, x, n);
  }
  void gelu_backward(float* dx, float* dbias, const float* x, const float* y, const float* dout, int N, int C) override {
    OpProfile::Scope op(&prof_, "gelu_backward", 16.0 * N * C, 0);
    k_.gelu_backward(dx, dbias, x, y, dout, N, C);
  }
  void accumulate(float* out, const float* a, size_t n) override {
    OpProfile::Scope op(&prof_, "accumulate", 12.0 * n, 0);
    k_.accumulate(out, a, n);
  }

  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int Hkv, int A) override {
    OpProfile::Scope op(&prof_, "attention_forward", 16.0 * B * T * A, 4.0 * B * A * (T * (T + 1.0) / 2));
    k_.attention_forward(out, lse, qkv, B, T, H, Hkv, A, attention_work(T, A / H));
  }
  void attention_backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv, int B,
                          int T, int H, int Hkv, int A) override {
    OpProfile::Scope op(&prof_, "attention_backward", 36.0 * B * T * A, 8.0 * B * A * (T * (T + 1.0) / 2));
    k_.attention_backward(dqkv, dout, out, lse, qkv, B, T, H, Hkv, A, attention_work(T, A / H));
  }
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps) override {
    OpProfile::Scope op(&prof_, "rmsnorm_forward", 12.0 * N * C, 0);
    k_.rmsnorm_forward(out, rstd, x, w, N, C, eps);
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                        int C) override {
    OpProfile::Scope op(&prof_, "rmsnorm_backward", 20.0 * N * C, 0);
    k_.rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
  }
  void rope(float* x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) override {
    OpProfile::Scope op(&prof_, backward ? "rope_backward" : "rope_forward", 8.0 * N * heads * hd, 0);
    k_.rope(x, cs, N, T, heads, hd, ld, backward);
  }
  void swiglu_forward(float* out, const float* h, int N, int F) override {
    OpProfile::Scope op(&prof_, "swiglu_forward", 12.0 * N * F, 0);
    k_.swiglu_forward(out, h, N, F);
  }
  void swiglu_backward(float* dh, const float* h, const float* dout, int N, int F) override {
    OpProfile::Scope op(&prof_, "swiglu_backward", 20.0 * N * F, 0);
    k_.swiglu_backward(dh, h, dout, N, F);
  }

  void crossentropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                    float dloss) override {
    OpProfile::Scope op(&prof_, "crossentropy", (dlogits ? 8.0 : 4.0) * N * V, 0);
    k_.crossentropy(losses, dlogits, logits, targets, N, V, dloss);
  }
  void vocab_row_max(float* row_max, const float* logits, int N, int V) override {
    OpProfile::Scope op(&prof_, "vocab_row_max", 4.0 * N * V, 0);
    k_.vocab_row_max(row_max, logits, N, V);
  }
  void vocab_sumexp(float* sumexp, float* target_logit, const float* logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V) override {
    OpProfile::Scope op(&prof_, "vocab_sumexp", 4.0 * N * V, 0);
    k_.vocab_sumexp(sumexp, target_logit, logits, row_max, targets, vocab_start, N, V);
  }
  void vocab_crossentropy_grad(float* dlogits, const float* logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, float dloss) override {
    OpProfile::Scope op(&prof_, "vocab_crossentropy_grad", 8.0 * N * V, 0);
    k_.vocab_crossentropy_grad(dlogits, logits, row_max, sumexp, targets, vocab_start, N, V, dloss);
  }
  void adam_step(float* p, float* m, float* v, const float* g, size_t n, const math::AdamParams& a,
                 Weights16 w16) override {
    OpProfile::Scope op(&prof_, "adam_step", (math::kAdamBytesPerElement + (w16.p ? 2 : 0)) * n, 0);
    k_.adam_step(p, m, v, g, n, a, w16.p, w16.fp16);
  }
  void scale(float* x, float s, size_t n) override {
    OpProfile::Scope op(&prof_, "scale", 8.0 * n, 0);
    k_.scale(x, s, n);
  }
  void cast_to_bf16(uint16_t* out, const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "cast_16", 6.0 * n, 0);
    k_.cast_to_bf16(out, x, n);
  }
  void cast_from_bf16(float* out, const uint16_t* x, size_t n) override {
    OpProfile::Scope op(&prof_, "cast_16", 6.0 * n, 0);
    k_.cast_from_bf16(out, x, n);
  }
  void cast_to_fp16(uint16_t* out, const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "cast_16", 6.0 * n, 0);
    k_.cast_to_fp16(out, x, n);
  }
  void cast_from_fp16(float* out, const uint16_t* x, size_t n) override {
    OpProfile::Scope op(&prof_, "cast_16", 6.0 * n, 0);
    k_.cast_from_fp16(out, x, n);
  }
  void accumulate_bf16(uint16_t* acc, const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "accumulate_16", 8.0 * n, 0);
    k_.accumulate_bf16(acc, x, n);
  }
  void accumulate_fp16(uint16_t* acc, const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "accumulate_16", 8.0 * n, 0);
    k_.accumulate_fp16(acc, x, n);
  }

  double sum_squares(const float* x, size_t n) override {
    OpProfile::Scope op(&prof_, "reductions", 4.0 * n, 0);
    return k_.sum_squares(x, n);
  }

 private:
  // Attention's per-thread panels: one buffer, grown to the largest shape seen (the first step's).
  float* attention_work(int T, int head_dim) {
    if (count_) return nullptr;
    const size_t need = cpu::attention_work_floats(T, head_dim) * static_cast<size_t>(cpu::threads());
    if (attn_work_.size() < need) attn_work_ = DeviceBuffer<float>(*this, need);
    return attn_work_.data();
  }

  const cpu::Kernels& k_;
  HostGemm gemm_;
  size_t allocs_ = 0;
  OpProfile prof_;
  DeviceBuffer<float> attn_work_;
  const bool count_;  // HostOptions::count_only: k_ is cpu::counting(), and no GEMM or copy runs
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(const HostOptions& options) {
  const cpu::Kernels* k = options.count_only    ? &cpu::counting()
                          : options.isa.empty() ? &cpu::select()
                                                : cpu::by_name(options.isa);
  if (!k) throw UserError(strprintf("host kernels for ISA level '%s' are not built in or do not run on this CPU",
                                    options.isa.c_str()));
  return std::make_unique<HostBackend>(options, *k);
}

}  // namespace zero3d
