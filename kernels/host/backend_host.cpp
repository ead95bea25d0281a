// Host backend: the loops of kernels/host/cpu_kernels.h at the best ISA level this CPU runs, on
// the rank's OpenMP threads, and GEMM through oneDNN or a CBLAS (kernels/host/gemm.h). Memory is
// RAM, zeroed (so touched) on allocation, and counted: 64-byte aligned, a page or more on page
// boundaries (swap files move the optimizer's records with O_DIRECT: storage/swap_file.h).
// The loops are fp32: an op on bf16 views (kernels/tensor.h) widens its bf16 operands into fp32
// staging buffers, runs the fp32 loop and rounds its outputs back once (kernels/staging.h), which is
// exactly the storage semantics the CUDA backend's bf16 kernels implement in registers.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/shared_memory.h"
#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"
#include "kernels/staging.h"

namespace zero3d {
namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(const HostOptions& o, const cpu::Kernels& k)
      : k_(k), gemm_(make_gemm_plan(o.gemm, o.bf16_gemm)), count_(o.count_only),
        stage_(*this, "host", k.cast_from_bf16, k.cast_to_bf16, !o.count_only) {
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

  // A bf16 A or C is staged; a B with only its bf16 values is widened where the GEMMs run in fp32.
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, ConstView A, int lda, GemmWeight B, int ldb,
            float beta, View C, int ldc) override {
    OpProfile::Scope op(&prof_, ta ? "gemm_weight_grad" : tb ? "gemm_forward" : "gemm_input_grad", 4.0 * (double(m) * k + double(k) * n + double(m) * n * (beta != 0 ? 2 : 1)), 2.0 * m * n * k);
    if (count_) return;
    Staging s(stage_);
    if (!B.f32 && !bf16_gemm()) {
      const size_t nb = strided_extent(tb ? n : k, tb ? k : n, ldb);
      B.f32 = s.in(ConstView(B.bf16, nb), nb);
    }
    gemm_.gemm(ta, tb, m, n, k, alpha, s.in(A, strided_extent(ta ? k : m, ta ? m : k, lda)), lda, B, ldb, beta,
               s.out(C, strided_extent(m, n, ldc), beta != 0.0f), ldc);
    s.store();
  }
  void linear_forward(View y, ConstView x, GemmWeight w, const float* bias, ConstView residual, int N, int in,
                      int out) override {
    OpProfile::Scope op(&prof_, "linear_forward", 4.0 * (double(N) * in + double(in) * out + double(N) * out * (residual ? 2 : 1)), 2.0 * N * in * out);
    if (count_) return;
    Staging s(stage_);
    const size_t ny = rows(N) * rows(out);
    gemm_.linear(s.out(y, ny, false), s.in(x, rows(N) * rows(in)), w, bias, residual ? s.in(residual, ny) : nullptr,
                 N, in, out);
    s.store();
  }

  // The GELU reads the fp32 pre-activation (as a GPU's epilogue does); both outputs are rounded once.
  void linear_gelu_forward(View out, View pre, ConstView x, GemmWeight w, const float* bias, int N, int in,
                           int F) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(F);
    float* p = s.out(pre, n, false);
    {
      OpProfile::Scope op(&prof_, "linear_forward", 4.0 * (double(N) * in + double(in) * F + double(N) * F), 2.0 * N * in * F);
      if (!count_) gemm_.linear(p, s.in(x, rows(N) * rows(in)), w, bias, nullptr, N, in, F);
    }
    OpProfile::Scope op(&prof_, "gelu_forward", 8.0 * n, 0);
    k_.gelu_forward(s.out(out, n, false), p, n);
    s.store();
  }
  void embedding_forward(View out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    OpProfile::Scope op(&prof_, "embedding_forward", 12.0 * N * C, 0);
    Staging s(stage_);
    k_.embedding_forward(s.out(out, rows(N) * rows(C), false), tokens, wte, wpe, N, T, C, vocab_start, vocab_rows);
    s.store();
  }
  void embedding_backward(float* dwte, float* dwpe, ConstView dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    OpProfile::Scope op(&prof_, "embedding_backward", 20.0 * N * C, 0);
    Staging s(stage_);
    k_.embedding_backward(dwte, dwpe, s.in(dout, rows(N) * rows(C)), tokens, N, T, C, vocab_start, vocab_rows);
  }
  void layernorm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b, int N,
                         int C) override {
    OpProfile::Scope op(&prof_, "layernorm_forward", 8.0 * N * C, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    k_.layernorm_forward(s.out(out, n, false), mean, rstd, s.in(x, n), w, b, N, C);
    s.store();
  }
  void layernorm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    OpProfile::Scope op(&prof_, "layernorm_backward", 24.0 * N * C, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    k_.layernorm_backward(s.out(dx, n, true), dw, db, s.in(dy, n), s.in(x, n), w, mean, rstd, N, C);
    s.store();
  }
  void bias_backward(float* dbias, ConstView dout, int N, int C) override {
    OpProfile::Scope op(&prof_, "bias_backward", 4.0 * N * C, 0);
    Staging s(stage_);
    k_.bias_backward(dbias, s.in(dout, rows(N) * rows(C)), N, C);
  }
  void gelu_forward(View out, ConstView x, size_t n) override {
    OpProfile::Scope op(&prof_, "gelu_forward", 8.0 * n, 0);
    Staging s(stage_);
    k_.gelu_forward(s.out(out, n, false), s.in(x, n), n);
    s.store();
  }
  void gelu_backward(View dx, float* dbias, ConstView x, ConstView y, ConstView dout, int N, int C) override {
    OpProfile::Scope op(&prof_, "gelu_backward", 16.0 * N * C, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    const float *xs = s.in(x, n), *ys = s.in(y, n), *ds = s.in(dout, n);  // staged before dx, which may alias dout
    k_.gelu_backward(s.out(dx, n, false), dbias, xs, ys, ds, N, C);
    s.store();
  }
  void accumulate(float* out, const float* a, size_t n) override {
    OpProfile::Scope op(&prof_, "accumulate", 12.0 * n, 0);
    k_.accumulate(out, a, n);
  }

  void attention_forward(View out, float* lse, ConstView qkv, int B, int T, int H, int Hkv, int A) override {
    OpProfile::Scope op(&prof_, "attention_forward", 16.0 * B * T * A, 4.0 * B * A * (T * (T + 1.0) / 2));
    Staging s(stage_);
    const size_t n = rows(B) * rows(T);
    k_.attention_forward(s.out(out, n * rows(A), false), lse, s.in(qkv, n * qkv_width(H, Hkv, A)), B, T, H, Hkv, A,
                         attention_work(T, A / H));
    s.store();
  }
  void attention_backward(View dqkv, ConstView dout, ConstView out, const float* lse, ConstView qkv, int B, int T,
                          int H, int Hkv, int A) override {
    OpProfile::Scope op(&prof_, "attention_backward", 36.0 * B * T * A, 8.0 * B * A * (T * (T + 1.0) / 2));
    Staging s(stage_);
    const size_t n = rows(B) * rows(T), nqkv = n * qkv_width(H, Hkv, A);
    const float *ds = s.in(dout, n * rows(A)), *os = s.in(out, n * rows(A)), *qs = s.in(qkv, nqkv);
    k_.attention_backward(s.out(dqkv, nqkv, false), ds, os, lse, qs, B, T, H, Hkv, A, attention_work(T, A / H));
    s.store();
  }
  void rmsnorm_forward(View out, float* rstd, ConstView x, const float* w, int N, int C, float eps) override {
    OpProfile::Scope op(&prof_, "rmsnorm_forward", 12.0 * N * C, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    k_.rmsnorm_forward(s.out(out, n, false), rstd, s.in(x, n), w, N, C, eps);
    s.store();
  }
  void rmsnorm_backward(View dx, float* dw, ConstView dy, ConstView x, const float* w, const float* rstd, int N,
                        int C) override {
    OpProfile::Scope op(&prof_, "rmsnorm_backward", 20.0 * N * C, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    k_.rmsnorm_backward(s.out(dx, n, true), dw, s.in(dy, n), s.in(x, n), w, rstd, N, C);
    s.store();
  }
  void rope(View x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) override {
    OpProfile::Scope op(&prof_, backward ? "rope_backward" : "rope_forward", 8.0 * N * heads * hd, 0);
    Staging s(stage_);
    k_.rope(s.out(x, strided_extent(N, heads * hd, ld), true), cs, N, T, heads, hd, ld, backward);
    s.store();
  }
  void swiglu_forward(View out, ConstView h, int N, int F) override {
    OpProfile::Scope op(&prof_, "swiglu_forward", 12.0 * N * F, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(F);
    k_.swiglu_forward(s.out(out, n, false), s.in(h, 2 * n), N, F);
    s.store();
  }
  void swiglu_backward(View dh, ConstView h, ConstView dout, int N, int F) override {
    OpProfile::Scope op(&prof_, "swiglu_backward", 20.0 * N * F, 0);
    Staging s(stage_);
    const size_t n = rows(N) * rows(F);
    const float *hs = s.in(h, 2 * n), *ds = s.in(dout, n);
    k_.swiglu_backward(s.out(dh, 2 * n, false), hs, ds, N, F);
    s.store();
  }

  void crossentropy(float* losses, View dlogits, ConstView logits, const int32_t* targets, int N, int V, int ld,
                    float dloss) override {
    OpProfile::Scope op(&prof_, "crossentropy", (dlogits ? 8.0 : 4.0) * N * V, 0);
    Staging s(stage_);
    const float* z = s.in(logits, strided_extent(N, V, ld));  // staged before dlogits, which may alias it
    k_.crossentropy(losses, dlogits ? s.out(dlogits, rows(N) * rows(ld), false) : nullptr, z, targets, N, V, ld, dloss);
    s.store();
  }
  void vocab_row_max(float* row_max, ConstView logits, int N, int V, int ld) override {
    OpProfile::Scope op(&prof_, "vocab_row_max", 4.0 * N * V, 0);
    Staging s(stage_);
    k_.vocab_row_max(row_max, s.in(logits, strided_extent(N, V, ld)), N, V, ld);
  }
  void vocab_sumexp(float* sumexp, float* target_logit, ConstView logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V, int ld) override {
    OpProfile::Scope op(&prof_, "vocab_sumexp", 4.0 * N * V, 0);
    Staging s(stage_);
    k_.vocab_sumexp(sumexp, target_logit, s.in(logits, strided_extent(N, V, ld)), row_max, targets, vocab_start, N, V,
                    ld);
  }
  void vocab_crossentropy_grad(View dlogits, ConstView logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) override {
    OpProfile::Scope op(&prof_, "vocab_crossentropy_grad", 8.0 * N * V, 0);
    Staging s(stage_);
    const float* z = s.in(logits, strided_extent(N, V, ld));
    k_.vocab_crossentropy_grad(s.out(dlogits, rows(N) * rows(ld), false), z, row_max, sumexp, targets, vocab_start, N,
                               V, ld, dloss);
    s.store();
  }
  void adam_steps(const AdamRun* runs, size_t count, const math::AdamParams& a, bool fp16) override {
    double bytes = 0;
    for (size_t i = 0; i < count; ++i)
      bytes += (math::kAdamBytesPerElement + (runs[i].p16 ? 2 : 0)) * static_cast<double>(runs[i].n);
    OpProfile::Scope op(&prof_, "adam_step", bytes, 0);
    for (size_t i = 0; i < count; ++i) {
      const AdamRun& r = runs[i];
      math::AdamParams ar = a;
      ar.weight_decay = r.weight_decay;
      k_.adam_step(r.p, r.m, r.v, r.g, r.n, ar, r.p16, fp16);
    }
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
  static size_t rows(int n) { return n > 0 ? static_cast<size_t>(n) : 0; }
  static size_t qkv_width(int H, int Hkv, int A) { return rows(A) + 2 * rows(Hkv) * rows(A / H); }

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
  StagingBuffers stage_;  // bf16 operands through the loops' own casts; counting stages nothing
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
