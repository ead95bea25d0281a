// kernels/kokkos/backend_kokkos.cpp: the Kokkos backend. Every op of the seam (kernels/backend.h)
// as Kokkos parallel loops over the default execution space's memory, the math of
// kernels/math/*.h per element and per row, GEMM through Kokkos Kernels (KokkosBlas::gemm, which
// hands LayoutRight float views in host memory to the vendor BLAS where its build enables that TPL).
// The one translation unit that includes Kokkos: its headers cost their compile time once.
//
// Invariants:
//  - Kokkos is initialized by the first Kokkos backend a process makes and finalized at exit,
//    when every Kokkos backend is gone. Memory is kokkos_malloc'd in the execution space's memory
//    space; the loops take its raw pointers, and Kokkos's calls (GEMM, copies) unmanaged views of
//    it, so no managed view outlives finalize.
//  - Each op's parallel loop carries its op's name as label ("zero3d::layernorm_forward"), and each
//    GEMM is a region ("zero3d::gemm"): Kokkos Tools (KOKKOS_PROFILE_LIBRARY) time the ops by them.
//  - Deterministic, whatever the execution space's threads: every output element has one owner,
//    column sums (bias, norm weights, the embedding) add rows in row order, and only the scalar
//    sum of squares is a parallel_reduce.
//  - bf16 views: elementwise kernels are templates on the storage type (widened on load, rounded
//    once on store); row ops (norms, attention, cross-entropy) widen bf16 views into fp32 scratch,
//    run the fp32 row functions of kernels/math and round their outputs once (kernels/staging.h).
//    Either way the bits of a bf16 result are the rounded bits of the fp32 one.
//  - GEMMs are fp32 (bf16 operands widened, a bf16 C rounded once); bf16_gemm() is false.
//
// Tested on Debian's Kokkos 3.4.1 (Trilinos 13.2), whose one execution space is Serial: one
// thread. No kernel reads `this`, and memory the host cannot read goes behind DeviceMemory, but no
// other execution space has compiled or run this file; what one would meet: kernels/README.md.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <KokkosBlas3_gemm.hpp>
#include <Kokkos_Core.hpp>
#if __has_include(<Trilinos_version.h>)
#include <Trilinos_version.h>
#endif

#include "core/check.h"
#include "core/device_collectives.h"
#include "core/library_file.h"
#include "core/shared_memory.h"
#include "kernels/backend.h"
#include "kernels/math/adamw.h"
#include "kernels/math/attention.h"
#include "kernels/math/crossentropy.h"
#include "kernels/math/dtype.h"
#include "kernels/math/gelu.h"
#include "kernels/math/layernorm.h"
#include "kernels/math/rmsnorm.h"
#include "kernels/math/rope.h"
#include "kernels/math/swiglu.h"
#include "kernels/staging.h"
#include "kernels/typed_views.h"

namespace zero3d {
namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
// Whether the host reads the backend's memory in place: then collectives use it as host memory.
constexpr bool kHostMemory = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

// ---- Kokkos's lifetime: one initialize, one finalize at exit after the last backend ----

std::atomic<int> g_live{0};           // Kokkos backends alive
std::atomic<uint64_t> g_launches{0};  // parallel loops and GEMMs issued (Backend::launch_count)

void finalize_at_exit() {
  if (g_live.load() == 0 && Kokkos::is_initialized()) Kokkos::finalize();
}
void initialize_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Kokkos::is_initialized()) return;  // a host program that initialized it owns it
    Kokkos::initialize();
    std::atexit(finalize_at_exit);
  });
}

// ---- launchers ----

using Policy = Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>;

// f(i) for i in [0, n) on the execution space, labelled; empty work launches nothing.
template <typename F>
void for_each(const char* label, size_t n, const F& f) {
  if (n == 0) return;
  ++g_launches;
  Kokkos::parallel_for(label, Policy(0, static_cast<int64_t>(n)), f);
}
// f(i, j) over [0, n0) x [0, n1) (f(i, j, k) with n2): rows and columns as an MDRange, so no element
// pays the 64-bit divisions a flat index needs to find its row (on Serial they cost more than the
// op: rope 990 -> 44 us a call, embedding_forward 513 -> 23, bench kernels at gpt-tiny's shape).
template <typename F>
void for_each(const char* label, int64_t n0, int64_t n1, const F& f) {
  if (n0 <= 0 || n1 <= 0) return;
  ++g_launches;
  Kokkos::parallel_for(label, Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<int64_t>>({0, 0}, {n0, n1}), f);
}
template <typename F>
void for_each(const char* label, int64_t n0, int64_t n1, int64_t n2, const F& f) {
  if (n0 <= 0 || n1 <= 0 || n2 <= 0) return;
  ++g_launches;
  Kokkos::parallel_for(
      label, Kokkos::MDRangePolicy<Exec, Kokkos::Rank<3>, Kokkos::IndexType<int64_t>>({0, 0, 0}, {n0, n1, n2}), f);
}

// ---- activation storage: float, or bf16 carried as its bits ----

using math::load;  // kernels/math/dtype.h
using math::store;

void widen(float* out, const uint16_t* x, size_t n) {
  for_each("zero3d::cast_from_bf16", n, KOKKOS_LAMBDA(const int64_t i) { out[i] = math::float_from_bf16(x[i]); });
}
void round_bf16(uint16_t* out, const float* x, size_t n) {
  for_each("zero3d::cast_to_bf16", n, KOKKOS_LAMBDA(const int64_t i) { out[i] = math::bf16_from_float(x[i]); });
}

// dst[c] += the sum over rows n (in row order) of term(n, c), one owner per column.
template <typename Term>
void column_sums(const char* label, float* dst, int N, int C, const Term& term) {
  for_each(label, static_cast<size_t>(C), KOKKOS_LAMBDA(const int64_t c) {
    float acc = dst[c];
    for (int64_t n = 0; n < N; ++n) acc += term(n, c);
    dst[c] = acc;
  });
}

// A row-major matrix of `rows` x `cols` at row stride ld, as the LayoutRight view KokkosBlas::gemm
// takes (a subview of the rows x ld view: its stride(0), ld, is the BLAS's leading dimension).
using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
auto matrix(const float* p, int rows, int cols, int ld) {
  return Kokkos::subview(Matrix(const_cast<float*>(p), rows, ld), Kokkos::ALL, std::make_pair(0, cols));
}

// The library whose sgemm_ a BLAS TPL calls (the first in the process's lookup order), for the record.
std::string blas_library() {
  void* f = dlsym(RTLD_DEFAULT, "sgemm_");
  const std::string file = f ? library_file(f) : "";
  if (file.empty()) return "no sgemm_ found";
  return "sgemm_ from " + file.substr(file.rfind('/') + 1);
}

class KokkosBackend final : public Backend, public DeviceMemory {
 public:
  KokkosBackend() {
    initialize_once();
    ++g_live;
  }
  ~KokkosBackend() override {
    Exec().fence();
    stage_.clear();
    --g_live;
  }
  KokkosBackend(const KokkosBackend&) = delete;
  KokkosBackend& operator=(const KokkosBackend&) = delete;

  BackendKind kind() const override { return BackendKind::kokkos; }
  std::string describe() const override {
    const int threads = Exec().concurrency();
    return strprintf("kokkos on the %s execution space (%d thread%s, %s memory), %s; GEMM %s", Exec::name(), threads,
                     threads == 1 ? "" : "s", Mem::name(), kokkos_version_string().c_str(), describe_gemm().c_str());
  }
  MemKind memory_kind() const override { return kHostMemory ? MemKind::host : MemKind::device; }
  DeviceMemory* device_memory() override { return kHostMemory ? nullptr : this; }
  bool bf16_gemm() const override { return false; }
  uint64_t launch_count() const override { return g_launches.load(); }
  std::string describe_gemm() const override {
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
    if (kHostMemory) return "KokkosBlas::gemm fp32 (BLAS TPL: " + blas_library() + ")";
#endif
    return "KokkosBlas::gemm fp32";
  }
  size_t alloc_count() const override { return allocs_; }

  // ---- memory ----

  void* alloc_bytes(size_t bytes) override {
    void* p = nullptr;
    try {
      p = Kokkos::kokkos_malloc<Mem>("zero3d::alloc", bytes ? bytes : 1);
    } catch (const std::bad_alloc&) {
      throw UserError(strprintf("out of %s memory allocating %zu bytes", Mem::name(), bytes));
    }
    zero(p, bytes);
    Exec().fence();
    ++allocs_;
    return p;
  }
  // Host-readable memory: shared memory the node's other ranks map, as the host backend's.
  void* alloc_comm_bytes(size_t bytes) override {
    if (!kHostMemory) return alloc_bytes(bytes);
    void* p = alloc_shared(bytes);
    if (!p) return alloc_bytes(bytes);
    ++allocs_;
    return p;
  }
  void free_bytes(void* p) override {
    if (!p) return;
    Exec().fence();  // no queued kernel still reads it
    if (kHostMemory && free_shared(p)) return;
    Kokkos::kokkos_free<Mem>(p);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    Kokkos::deep_copy(bytes_view(dst, bytes), HostBytes(static_cast<char*>(const_cast<void*>(src)), bytes));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    Kokkos::deep_copy(HostBytes(static_cast<char*>(dst), bytes), bytes_view(const_cast<void*>(src), bytes));
  }
  // memmove's contract (ranges may overlap): in place where the host reads the memory, else
  // through a temporary when they overlap.
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    ++g_launches;
    if (kHostMemory) {
      Exec().fence();
      std::memmove(dst, src, bytes);
      return;
    }
    const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    if (d < s + bytes && s < d + bytes) {
      void* tmp = Kokkos::kokkos_malloc<Mem>("zero3d::copy", bytes);
      Kokkos::deep_copy(bytes_view(tmp, bytes), bytes_view(const_cast<void*>(src), bytes));
      Kokkos::deep_copy(bytes_view(dst, bytes), bytes_view(tmp, bytes));
      Kokkos::kokkos_free<Mem>(tmp);
      return;
    }
    Kokkos::deep_copy(bytes_view(dst, bytes), bytes_view(const_cast<void*>(src), bytes));
  }
  void zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    ++g_launches;
    Kokkos::deep_copy(Exec(), bytes_view(p, bytes), char(0));
  }
  void synchronize() override { Exec().fence(); }

  // ---- DeviceMemory: only where the host cannot read the memory (then collectives stage it) ----
  void to_host(void* dst, const void* src, size_t bytes) override { copy_to_host(dst, src, bytes); }
  void to_device(void* dst, const void* src, size_t bytes) override { copy_from_host(dst, src, bytes); }
  void* alloc_pinned(size_t bytes) override { return Kokkos::kokkos_malloc<Kokkos::HostSpace>("zero3d::pinned", bytes); }
  void free_pinned(void* p) override { Kokkos::kokkos_free<Kokkos::HostSpace>(p); }
  std::unique_ptr<DeviceCollectives> make_collectives(int, int, const std::string&, bool, const Share&) override {
    return nullptr;  // no device library: the groups stage through host memory (or a device-aware MPI)
  }

  // ---- GEMM ----

  // bf16 A and C staged as fp32; a B with only bf16 values widened.
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, ConstView A, int lda, GemmWeight B, int ldb,
            float beta, View C, int ldc) override {
    if (m <= 0 || n <= 0) return;
    Staging s(stage_);
    const size_t na = strided_extent(ta ? k : m, ta ? m : k, lda), nb = strided_extent(tb ? n : k, tb ? k : n, ldb);
    const float* b = B.f32 ? B.f32 : s.in(ConstView(B.bf16, nb), nb);
    // A bf16 C is read even where beta = 0: the elements between its rows go back as they were.
    float* c = s.out(C, strided_extent(m, n, ldc), beta != 0.0f || ldc != n);
    sgemm(ta, tb, m, n, k, alpha, s.in(A, na), lda, b, ldb, beta, c, ldc);
    s.store();
  }
  void linear_forward(View y, ConstView x, GemmWeight w, const float* bias, ConstView residual, int N, int in,
                      int out) override {
    Staging s(stage_);
    const size_t ny = rows(N) * rows(out);
    const float* wf = w.f32 ? w.f32 : s.in(ConstView(w.bf16, rows(out) * rows(in)), rows(out) * rows(in));
    const float* r = residual ? s.in(residual, ny) : nullptr;
    linear(s.out(y, ny, false), s.in(x, rows(N) * rows(in)), wf, bias, r, N, in, out);
    s.store();
  }
  // The GELU reads the fp32 pre-activation; both outputs are rounded once.
  void linear_gelu_forward(View out, View pre, ConstView x, GemmWeight w, const float* bias, int N, int in,
                           int F) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(F);
    const float* wf = w.f32 ? w.f32 : s.in(ConstView(w.bf16, rows(F) * rows(in)), rows(F) * rows(in));
    float* p = s.out(pre, n, false);
    linear(p, s.in(x, rows(N) * rows(in)), wf, bias, nullptr, N, in, F);
    with_storage(storage("linear_gelu_forward", {{out, n}}), [&]<typename S>() {
      S* o = ptr<S>(out);
      for_each("zero3d::gelu_forward", n, KOKKOS_LAMBDA(const int64_t i) { store(o + i, math::gelu_forward(p[i])); });
    });
    s.store();
  }

  // ---- elementwise ops: templates on the views' storage type ----

  void embedding_forward(View out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    with_storage(storage("embedding_forward", {{out, rows(N) * rows(C)}}), [&]<typename S>() {
      S* o = ptr<S>(out);
      for_each("zero3d::embedding_forward", N, C, KOKKOS_LAMBDA(const int64_t n, const int64_t c) {
        const int row = tokens[n] - vocab_start;
        const float e = row >= 0 && row < vocab_rows ? wte[static_cast<int64_t>(row) * C + c] : 0.0f;
        store(o + n * C + c, e + (wpe ? wpe[(n % T) * C + c] : 0.0f));
      });
    });
  }
  // dwte: one owner per column, walking the tokens in order (rows sharing a token meet in row
  // order); dwpe: one owner per (position, column), rows t, t + T, ... in order.
  void embedding_backward(float* dwte, float* dwpe, ConstView dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    with_storage(storage("embedding_backward", {{dout, rows(N) * rows(C)}}), [&]<typename S>() {
      const S* d = ptr<S>(dout);
      for_each("zero3d::embedding_backward", rows(C), KOKKOS_LAMBDA(const int64_t c) {
        for (int64_t n = 0; n < N; ++n) {
          const int row = tokens[n] - vocab_start;
          if (row >= 0 && row < vocab_rows) dwte[static_cast<int64_t>(row) * C + c] += load(d + n * C + c);
        }
      });
      if (!dwpe) return;
      const int64_t positions = N < T ? N : T;
      for_each("zero3d::embedding_backward_wpe", positions, C, KOKKOS_LAMBDA(const int64_t t, const int64_t c) {
        float acc = dwpe[t * C + c];
        for (int64_t n = t; n < N; n += T) acc += load(d + n * C + c);
        dwpe[t * C + c] = acc;
      });
    });
  }
  void bias_backward(float* dbias, ConstView dout, int N, int C) override {
    with_storage(storage("bias_backward", {{dout, rows(N) * rows(C)}}), [&]<typename S>() {
      const S* d = ptr<S>(dout);
      column_sums("zero3d::bias_backward", dbias, N, C,
                  KOKKOS_LAMBDA(const int64_t n, const int64_t c) { return load(d + n * C + c); });
    });
  }
  void gelu_forward(View out, ConstView x, size_t n) override {
    with_storage(storage("gelu_forward", {{out, n}, {x, n}}), [&]<typename S>() {
      S* o = ptr<S>(out);
      const S* xs = ptr<S>(x);
      for_each("zero3d::gelu_forward", n, KOKKOS_LAMBDA(const int64_t i) { store(o + i, math::gelu_forward(load(xs + i))); });
    });
  }
  // The bias gradient first: its terms recompute dx in fp32 from x and dout, which dx may overwrite.
  void gelu_backward(View dx, float* dbias, ConstView x, ConstView y, ConstView dout, int N, int C) override {
    const size_t n = rows(N) * rows(C);
    with_storage(storage("gelu_backward", {{dx, n}, {x, n}, {y, n}, {dout, n}}), [&]<typename S>() {
      S* g = ptr<S>(dx);
      const S *xs = ptr<S>(x), *d = ptr<S>(dout);
      if (dbias)
        column_sums("zero3d::gelu_backward_bias", dbias, N, C, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
          return math::gelu_backward(load(xs + r * C + c), load(d + r * C + c));
        });
      for_each("zero3d::gelu_backward", n, KOKKOS_LAMBDA(const int64_t i) {
        store(g + i, math::gelu_backward(load(xs + i), load(d + i)));
      });
    });
  }
  void accumulate(float* out, const float* a, size_t n) override {
    for_each("zero3d::accumulate", n, KOKKOS_LAMBDA(const int64_t i) { out[i] += a[i]; });
  }
  void rope(View x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) override {
    const int half = hd / 2;
    with_storage(storage("rope", {{x, strided_extent(N, heads * hd, ld)}}), [&]<typename S>() {
      S* xs = ptr<S>(x);
      for_each(backward ? "zero3d::rope_backward" : "zero3d::rope_forward", N, heads, half,
               KOKKOS_LAMBDA(const int64_t n, const int64_t h, const int64_t i) {
                 math::rope_pair_stored(xs + n * ld + h * hd, half, static_cast<int>(i), cs + 2 * ((n % T) * half + i),
                                        backward);
               });
    });
  }
  void swiglu_forward(View out, ConstView h, int N, int F) override {
    const size_t n = rows(N) * rows(F);
    with_storage(storage("swiglu_forward", {{out, n}, {h, 2 * n}}), [&]<typename S>() {
      S* o = ptr<S>(out);
      const S* hs = ptr<S>(h);
      for_each("zero3d::swiglu_forward", N, F, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
        store(o + r * F + c, math::swiglu_forward(load(hs + 2 * r * F + c), load(hs + 2 * r * F + F + c)));
      });
    });
  }
  void swiglu_backward(View dh, ConstView h, ConstView dout, int N, int F) override {
    const size_t n = rows(N) * rows(F);
    with_storage(storage("swiglu_backward", {{dh, 2 * n}, {h, 2 * n}, {dout, n}}), [&]<typename S>() {
      S* g = ptr<S>(dh);
      const S *hs = ptr<S>(h), *d = ptr<S>(dout);
      for_each("zero3d::swiglu_backward", N, F, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
        float dgate, dup;
        math::swiglu_backward(&dgate, &dup, load(hs + 2 * r * F + c), load(hs + 2 * r * F + F + c), load(d + r * F + c));
        store(g + 2 * r * F + c, dgate);
        store(g + 2 * r * F + F + c, dup);
      });
    });
  }

  // ---- row ops: the fp32 row functions of kernels/math, one row per iteration ----

  void layernorm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b, int N,
                         int C) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    float* o = s.out(out, n, false);
    const float* xs = s.in(x, n);
    for_each("zero3d::layernorm_forward", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      math::layernorm_row_forward(o + r * C, mean + r, rstd + r, xs + r * C, w, b, C);
    });
    s.store();
  }
  void layernorm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w, const float* mean,
                          const float* rstd, int N, int C) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    float* g = s.out(dx, n, true);
    const float *d = s.in(dy, n), *xs = s.in(x, n);
    for_each("zero3d::layernorm_backward", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      math::layernorm_row_backward_input(g + r * C, d + r * C, xs + r * C, w, mean[r], rstd[r], C);
    });
    column_sums("zero3d::layernorm_backward_weight", dw, N, C, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
      return d[r * C + c] * math::layernorm_xhat(xs[r * C + c], mean[r], rstd[r]);
    });
    column_sums("zero3d::layernorm_backward_bias", db, N, C,
                KOKKOS_LAMBDA(const int64_t r, const int64_t c) { return d[r * C + c]; });
    s.store();
  }
  void rmsnorm_forward(View out, float* rstd, ConstView x, const float* w, int N, int C, float eps) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    float* o = s.out(out, n, false);
    const float* xs = s.in(x, n);
    for_each("zero3d::rmsnorm_forward", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      rstd[r] = math::rmsnorm_row_forward(o + r * C, xs + r * C, w, C, eps);
    });
    s.store();
  }
  // dx += rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd (kernels/math/rmsnorm.h).
  void rmsnorm_backward(View dx, float* dw, ConstView dy, ConstView x, const float* w, const float* rstd, int N,
                        int C) override {
    Staging s(stage_);
    const size_t n = rows(N) * rows(C);
    float* g = s.out(dx, n, true);
    const float *d = s.in(dy, n), *xs = s.in(x, n);
    for_each("zero3d::rmsnorm_backward", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      const float* dyr = d + r * C;
      const float* xr = xs + r * C;
      const float rs = rstd[r];
      float sum_gx = 0.0f;
      for (int i = 0; i < C; ++i) sum_gx += dyr[i] * w[i] * (xr[i] * rs);
      const float mean_gx = sum_gx / C;
      for (int i = 0; i < C; ++i) g[r * C + i] += rs * (dyr[i] * w[i] - xr[i] * rs * mean_gx);
    });
    column_sums("zero3d::rmsnorm_backward_weight", dw, N, C, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
      return d[r * C + c] * (xs[r * C + c] * rstd[r]);
    });
    s.store();
  }
  // One (batch, head, query row) per iteration: kernels/math/attention.h's online softmax.
  void attention_forward(View out, float* lse, ConstView qkv, int B, int T, int H, int Hkv, int A) override {
    Staging s(stage_);
    const int hd = A / H;
    const int64_t ld = A + 2 * static_cast<int64_t>(Hkv) * hd;
    const size_t nrows = rows(B) * rows(T);
    float* o = s.out(out, nrows * rows(A), false);
    const float* x = s.in(qkv, nrows * static_cast<size_t>(ld));
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hd));
    for_each("zero3d::attention_forward", rows(B) * rows(H) * rows(T), KOKKOS_LAMBDA(const int64_t r) {
      const int64_t b = r / (static_cast<int64_t>(H) * T), h = r / T % H, kvh = h / (H / Hkv);
      const int i = static_cast<int>(r % T);
      const float* rows0 = x + b * T * ld;
      lse[r] = math::attention_row_forward(o + (b * T + i) * A + h * hd, rows0 + h * hd, rows0 + A + kvh * hd,
                                           rows0 + A + (Hkv + kvh) * hd, ld, i, hd, alpha);
    });
    s.store();
  }
  // dq of every (batch, head, row); dk and dv of key row j by the first query head of its group,
  // summed over the group's query heads in head order.
  void attention_backward(View dqkv, ConstView dout, ConstView out, const float* lse, ConstView qkv, int B, int T,
                          int H, int Hkv, int A) override {
    Staging s(stage_);
    const int hd = A / H, G = H / Hkv;
    const int64_t ld = A + 2 * static_cast<int64_t>(Hkv) * hd;
    const size_t nrows = rows(B) * rows(T), nqkv = nrows * static_cast<size_t>(ld);
    const float *d = s.in(dout, nrows * rows(A)), *o = s.in(out, nrows * rows(A)), *x = s.in(qkv, nqkv);
    float* g = s.out(dqkv, nqkv, false);
    const float alpha = 1.0f / std::sqrt(static_cast<float>(hd));
    for_each("zero3d::attention_backward", rows(B) * rows(H) * rows(T), KOKKOS_LAMBDA(const int64_t r) {
      const int64_t b = r / (static_cast<int64_t>(H) * T), h = r / T % H, kvh = h / G;
      const int i = static_cast<int>(r % T);
      const float* rows0 = x + b * T * ld;
      const float *k = rows0 + A + kvh * hd, *v = rows0 + A + (Hkv + kvh) * hd;
      float* gi = g + (b * T + i) * ld;
      math::attention_row_backward_q(gi + h * hd, rows0 + h * hd, k, v, ld, d + b * T * A + h * hd,
                                     o + b * T * A + h * hd, A, lse + (b * H + h) * T, i, hd, alpha);
      if (h % G != 0) return;
      float *dk = gi + A + kvh * hd, *dv = gi + A + (Hkv + kvh) * hd;
      for (int e = 0; e < hd; ++e) dk[e] = dv[e] = 0.0f;
      for (int64_t hq = h; hq < h + G; ++hq)
        math::attention_row_backward_kv(dk, dv, rows0 + hq * hd, k, v, ld, d + b * T * A + hq * hd,
                                        o + b * T * A + hq * hd, A, lse + (b * H + hq) * T, i, T, hd, alpha);
    });
    s.store();
  }

  // The cross-entropy ops: logits N rows of stride ld >= V; a gradient's padding columns [V, ld)
  // are written 0 (the last row's too: N * ld elements of dlogits). dlogits may alias logits: the
  // logits are staged first, and the row functions allow it.
  void crossentropy(float* losses, View dlogits, ConstView logits, const int32_t* targets, int N, int V, int ld,
                    float dloss) override {
    Staging s(stage_);
    const float* z = s.in(logits, logits_extent("crossentropy", N, V, ld));
    float* dz = dlogits ? s.out(dlogits, rows(N) * rows(ld), false) : nullptr;
    for_each("zero3d::crossentropy", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      const float* zr = z + r * ld;
      if (!dz) {
        losses[r] = math::crossentropy_row_forward(zr, targets[r], V);
        return;
      }
      losses[r] = math::crossentropy_row_forward_backward(dz + r * ld, zr, targets[r], V, dloss);
      for (int i = V; i < ld; ++i) dz[r * ld + i] = 0.0f;
    });
    s.store();
  }
  void vocab_row_max(float* row_max, ConstView logits, int N, int V, int ld) override {
    Staging s(stage_);
    const float* z = s.in(logits, logits_extent("vocab_row_max", N, V, ld));
    for_each("zero3d::vocab_row_max", rows(N), KOKKOS_LAMBDA(const int64_t r) { row_max[r] = math::row_max(z + r * ld, V); });
  }
  void vocab_sumexp(float* sumexp, float* target_logit, ConstView logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V, int ld) override {
    Staging s(stage_);
    const float* z = s.in(logits, logits_extent("vocab_sumexp", N, V, ld));
    for_each("zero3d::vocab_sumexp", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      const float* zr = z + r * ld;
      const int t = targets[r] - vocab_start;
      sumexp[r] = math::row_sumexp(zr, V, row_max[r]);
      target_logit[r] = t >= 0 && t < V ? zr[t] : 0.0f;
    });
  }
  void vocab_crossentropy_grad(View dlogits, ConstView logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) override {
    Staging s(stage_);
    const float* z = s.in(logits, logits_extent("vocab_crossentropy_grad", N, V, ld));
    float* dz = s.out(dlogits, rows(N) * rows(ld), false);
    for_each("zero3d::vocab_crossentropy_grad", rows(N), KOKKOS_LAMBDA(const int64_t r) {
      const int t = targets[r] - vocab_start;
      math::crossentropy_row_grad(dz + r * ld, z + r * ld, V, row_max[r], sumexp[r], t >= 0 && t < V ? t : -1, dloss);
      for (int i = V; i < ld; ++i) dz[r * ld + i] = 0.0f;
    });
    s.store();
  }

  // ---- optimizer and casts ----

  // One loop per run (empty ones skipped), each element math::adam_element with the run's decay.
  void adam_steps(const AdamRun* runs, size_t count, const math::AdamParams& a, bool fp16) override {
    for (size_t r = 0; r < count; ++r) {
      const AdamRun run = runs[r];
      math::AdamParams ar = a;
      ar.weight_decay = run.weight_decay;
      for_each("zero3d::adam_step", run.n, KOKKOS_LAMBDA(const int64_t i) {
        math::adam_element(run.p + i, run.m + i, run.v + i, run.g[i], ar);
        if (run.p16) run.p16[i] = fp16 ? math::fp16_from_float(run.p[i]) : math::bf16_from_float(run.p[i]);
      });
    }
  }
  void scale(float* x, float s, size_t n) override {
    for_each("zero3d::scale", n, KOKKOS_LAMBDA(const int64_t i) { x[i] *= s; });
  }
  void cast_to_bf16(uint16_t* out, const float* x, size_t n) override { round_bf16(out, x, n); }
  void cast_from_bf16(float* out, const uint16_t* x, size_t n) override { widen(out, x, n); }
  void cast_to_fp16(uint16_t* out, const float* x, size_t n) override {
    for_each("zero3d::cast_to_fp16", n, KOKKOS_LAMBDA(const int64_t i) { out[i] = math::fp16_from_float(x[i]); });
  }
  void cast_from_fp16(float* out, const uint16_t* x, size_t n) override {
    for_each("zero3d::cast_from_fp16", n, KOKKOS_LAMBDA(const int64_t i) { out[i] = math::float_from_fp16(x[i]); });
  }
  void accumulate_bf16(uint16_t* acc, const float* x, size_t n) override {
    for_each("zero3d::accumulate_bf16", n, KOKKOS_LAMBDA(const int64_t i) {
      acc[i] = math::bf16_from_float(math::float_from_bf16(acc[i]) + x[i]);
    });
  }
  void accumulate_fp16(uint16_t* acc, const float* x, size_t n) override {
    for_each("zero3d::accumulate_fp16", n, KOKKOS_LAMBDA(const int64_t i) {
      acc[i] = math::fp16_from_float(math::float_from_fp16(acc[i]) + x[i]);
    });
  }

  // In double, as a parallel_reduce (on Serial: in index order).
  double sum_squares(const float* x, size_t n) override {
    double sum = 0.0;
    if (n == 0) return sum;
    ++g_launches;
    Kokkos::parallel_reduce(
        "zero3d::sum_squares", Policy(0, static_cast<int64_t>(n)),
        KOKKOS_LAMBDA(const int64_t i, double& acc) { acc += static_cast<double>(x[i]) * x[i]; }, sum);
    return sum;
  }

 private:
  using Bytes = Kokkos::View<char*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using HostBytes = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static Bytes bytes_view(void* p, size_t bytes) { return Bytes(static_cast<char*>(p), bytes); }
  static size_t rows(int n) { return n > 0 ? static_cast<size_t>(n) : 0; }
  static size_t logits_extent(const char* name, int N, int V, int ld) {
    Z3D_ASSERT(ld >= V, strprintf("%s: row stride %d below the %d vocabulary columns", name, ld, V));
    return strided_extent(N, V, ld);
  }

  // C = alpha op(A) op(B) + beta C on fp32 row-major operands, through KokkosBlas::gemm. k = 0
  // leaves the GEMM nothing to add: C = beta C (KokkosBlas returns without touching C then).
  void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    ++g_launches;
    auto c = matrix(C, m, n, ldc);
    if (k <= 0) {
      for_each("zero3d::gemm_scale", m, n, KOKKOS_LAMBDA(const int64_t i, const int64_t j) {
        float& x = C[i * ldc + j];
        x = beta == 0.0f ? 0.0f : beta * x;
      });
      return;
    }
    // A region, so Kokkos Tools see the GEMM (a BLAS TPL's call is no Kokkos kernel).
    Kokkos::Profiling::pushRegion("zero3d::gemm");
    KokkosBlas::gemm(ta ? "T" : "N", tb ? "T" : "N", alpha, matrix(A, ta ? k : m, ta ? m : k, lda),
                     matrix(B, tb ? n : k, tb ? k : n, ldb), beta, c);
    Kokkos::Profiling::popRegion();
  }
  // y = x W^T (+ bias) (+ residual) in fp32: the GEMM, then one pass for the bias and residual.
  void linear(float* y, const float* x, const float* w, const float* bias, const float* residual, int N, int in, int out) {
    sgemm(false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    if (!bias && !residual) return;
    for_each("zero3d::linear_epilogue", N, out, KOKKOS_LAMBDA(const int64_t r, const int64_t c) {
      float v = y[r * out + c];
      if (bias) v += bias[c];
      if (residual) v += residual[r * out + c];
      y[r * out + c] = v;
    });
  }

  size_t allocs_ = 0;
  StagingBuffers stage_{*this, "kokkos", widen, round_bf16};  // bf16 operands of the row functions
};

}  // namespace

std::unique_ptr<Backend> make_kokkos_backend() { return std::make_unique<KokkosBackend>(); }

// From the headers alone: callable before (and without) Kokkos::initialize.
std::string kokkos_version_string() {
  std::string s = "Kokkos " + dotted_version(KOKKOS_VERSION) + " (" + Exec::name() + ")";
#if defined(KOKKOSKERNELS_VERSION)
  s += ", Kokkos Kernels " + dotted_version(KOKKOSKERNELS_VERSION);
#elif defined(TRILINOS_VERSION_STRING)
  s += ", Kokkos Kernels of Trilinos " TRILINOS_VERSION_STRING;
#else
  s += ", Kokkos Kernels";
#endif
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS)
  s += " (BLAS TPL)";
#endif
  return s;
}

std::string kokkos_library_file() { return library_file(&Kokkos::is_initialized); }

}  // namespace zero3d
