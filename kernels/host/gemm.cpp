#include "kernels/host/gemm.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <oneapi/dnnl/dnnl_debug.h>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "kernels/host/cpu_kernels.h"

// OpenBLAS's introspection (weak: absent from other CBLAS libraries).
extern "C" char* openblas_get_corename(void) __attribute__((weak));
extern "C" char* openblas_get_config(void) __attribute__((weak));
// Its dynamic-arch selection (DYNAMIC_ARCH builds, as Debian's): quit forgets the kernel set, init
// picks one again, from OPENBLAS_CORETYPE when set, else from cpuid.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

#define DNNL_CHECK(stmt) Z3D_CHECK_GEN("oneDNN", stmt, status == dnnl_success, dnnl_status2str(status))

namespace zero3d {

namespace {

std::string openblas_core() { return openblas_get_corename ? openblas_get_corename() : ""; }

// The ISA level of OpenBLAS's x86 kernels, by core name (its dynamic-arch table of 0.3.x).
int openblas_core_level(const std::string& core) {
  for (const char* c : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (core == c) return 2;
  for (const char* c : {"Haswell", "Zen"})
    if (core == c) return 1;
  return 0;
}

int level_of(const std::string& isa) { return isa == "avx512" ? 2 : isa == "avx2" ? 1 : 0; }  // on that scale

int cpu_level() { return level_of(cpu::select().isa); }  // the level this process runs (compute.isa)

}  // namespace

void cblas_use_level(const std::string& isa) {
#if defined(__x86_64__)
  const std::string core = openblas_core();
  if (core.empty() || !gotoblas_dynamic_init || !gotoblas_dynamic_quit || std::getenv("OPENBLAS_CORETYPE")) return;
  const int level = level_of(isa);
  if (openblas_core_level(core) == level) return;
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const char* want = level == 2   ? (f.avx512_bf16 ? "Cooperlake" : "SkylakeX")
                     : level == 1 ? (f.vendor == "AuthenticAMD" ? "Zen" : "Haswell")
                                  : "Prescott";
  // Through the variable OpenBLAS itself reads; set only for the call (none was set: checked above).
  setenv("OPENBLAS_CORETYPE", want, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
#else
  (void)isa;
#endif
}

const char* gemm_library_name(GemmLibrary l) { return l == GemmLibrary::onednn ? "onednn" : "cblas"; }

std::string GemmPlan::describe() const {
  std::string s = std::string(gemm_library_name(forward)) + (bf16 ? " bf16" : " fp32");
  if (input_grad != forward) s += std::string(", input gradients ") + gemm_library_name(input_grad);
  if (weight_grad != forward) s += std::string(", weight gradients ") + gemm_library_name(weight_grad);
  return s;
}

GemmPlan make_gemm_plan(const std::string& library, bool bf16) {
  GemmPlan p;
  p.bf16 = bf16;
  if (bf16) return (p.why = "bf16 GEMMs run on oneDNN"), p;
  if (library != "auto") {
    if (library == "cblas") p.forward = p.input_grad = p.weight_grad = GemmLibrary::cblas;
    return (p.why = "compute.gemm=" + library), p;
  }
  const std::string core = openblas_core();
  if (!core.empty() && cpu_level() > 0 && openblas_core_level(core) == cpu_level()) {
    if (cpu::threads() > 1) {
      // OpenBLAS (Debian's pthread build) starts its own threads beside oneDNN's OpenMP ones, which
      // spin between GEMMs: 1 rank x 2 threads ran bench-cpu 30% slower with weight gradients on
      // OpenBLAS and gpt-tiny 8x slower at its Haswell kernels; OpenBLAS on one thread was 25% slower.
      p.why = strprintf("auto: oneDNN (%d threads a rank: OpenBLAS's own threads would contend with oneDNN's)",
                        cpu::threads());
      return p;
    }
    p.weight_grad = GemmLibrary::cblas;
    p.why = "auto: weight gradients on OpenBLAS, whose " + core + " kernels match the level " + cpu::select().isa +
            " (faster than oneDNN 2.6 on those shapes), the rest on oneDNN";
  } else {
    p.why = core.empty()        ? "auto: oneDNN (the CBLAS is not OpenBLAS)"
            : cpu_level() == 0 ? "auto: oneDNN (OpenBLAS takes the weight gradients at avx2 and avx512 only)"
                               : "auto: oneDNN (OpenBLAS runs its " + core + " kernels, not level " + cpu::select().isa + "'s)";
  }
  return p;
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return strprintf("oneDNN %d.%d.%d", v->major, v->minor, v->patch);
}

std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool onednn_has_bf16() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

bool onednn_runs_bf16() {
  static const bool runs = [] {
    try {
      using dt = dnnl::memory::data_type;
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc a({16, 16}, dt::bf16, dnnl::memory::dims{16, 1}), c({16, 16}, dt::f32, dnnl::memory::dims{16, 1});
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, a, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return runs;
}

std::string cblas_name() {
  if (!openblas_get_config) return "CBLAS";
  std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
  const size_t sp = config.find(' ', std::strlen("OpenBLAS "));
  return config.substr(0, sp) + " " + openblas_core();
}

std::string cblas_core_fallback() {
  const std::string core = openblas_core();
  if (core.empty() || openblas_core_level(core) >= cpu_level()) return "";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  const std::string fix = forced ? strprintf("OPENBLAS_CORETYPE=%s is set; unset it and zero3d picks the level's", forced)
                                 : strprintf("this OpenBLAS does not know the model and has no dynamic kernels to pick "
                                             "again; set OPENBLAS_CORETYPE=%s before the program starts, or use a BLAS "
                                             "that knows this CPU",
                                             cpu_level() == 2 ? "SKYLAKEX" : "HASWELL");
  return strprintf("%s runs its %s kernels, below what this CPU does (%s, family %d model %d, %s), so zero3d's GEMMs "
                   "use oneDNN unless compute.gemm=\"cblas\": %s",
                   cblas_name().c_str(), core.c_str(), f.model.c_str(), f.family, f.model_number, f.level().c_str(),
                   fix.c_str());
}

// ---- oneDNN matmul primitives, created once per shape and reused ----

struct HostGemm::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // (ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, bias, residual): what fixes a primitive.
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, float, float, bool, bool>;
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory a, b, c, bias, residual;
  };
  std::map<Key, Entry> cache;
  std::vector<uint16_t> a16, b16;  // bf16 copies of A and B (grown to the largest GEMM, then reused)

  // op(X) of rows x cols stored row-major with leading dimension ld, transposed when t.
  static dnnl::memory::desc matrix(int rows, int cols, bool t, int ld, dnnl::memory::data_type dt) {
    return dnnl::memory::desc({rows, cols}, dt, t ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
  }

  Entry& primitive(const Key& key, bool bf16) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, has_bias, has_residual] = key;
    using dt = dnnl::memory::data_type;
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const auto a = matrix(m, k, ta, lda, in), b = matrix(k, n, tb, ldb, in), c = matrix(m, n, false, ldc, dt::f32);
    const dnnl::memory::desc bias({1, n}, dt::f32, {n, 1});
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    dnnl::post_ops po;
    if (beta != 0.0f) po.append_sum(beta);
    if (has_residual) po.append_binary(dnnl::algorithm::binary_add, c);
    attr.set_post_ops(po);
    const auto desc = has_bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
    Entry e{dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, engine)), dnnl::memory(a, engine, nullptr),
            dnnl::memory(b, engine, nullptr), dnnl::memory(c, engine, nullptr), dnnl::memory(bias, engine, nullptr),
            dnnl::memory(c, engine, nullptr)};
    return cache.emplace(key, std::move(e)).first->second;
  }

  void run(const Key& key, bool bf16, const void* A, const void* B, float* C, const float* bias,
           const float* residual) {
    try {
      Entry& e = primitive(key, bf16);
      e.a.set_data_handle(const_cast<void*>(A));
      e.b.set_data_handle(const_cast<void*>(B));
      e.c.set_data_handle(C);
      std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}};
      if (bias) {
        e.bias.set_data_handle(const_cast<float*>(bias));
        args[DNNL_ARG_BIAS] = e.bias;
      }
      if (residual) {
        e.residual.set_data_handle(const_cast<float*>(residual));
        args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(std::get<9>(key) != 0.0f ? 1 : 0) | DNNL_ARG_SRC_1] = e.residual;
      }
      e.prim.execute(stream, args);
      stream.wait();
    } catch (const dnnl::error& err) {
      fatal("oneDNN", err.what(), "matmul", __FILE__, __LINE__);
    }
  }

  // Round the stored rows of op(X) into a bf16 copy with the same leading dimension: a B rounded
  // here and a B that comes with its bf16 copy (same ld) then run the same primitive, so they give
  // the same bits. A contiguous copy of a padded B was another primitive, and with AMX (a Xeon of
  // family 6 model 207) another order of the sums: 1-ulp differences (test_kernels' Bf16Gemm cases).
  static int to_bf16(std::vector<uint16_t>& dst, const float* X, int rows, int cols, bool t, int ld) {
    const int srows = t ? cols : rows, scols = t ? rows : cols;
    const size_t extent = strided_extent(srows, scols, ld);
    if (dst.size() < extent) dst.resize(extent);
    if (ld == scols) {
      cpu::select().cast_to_bf16(dst.data(), X, extent);
    } else {
      for (int r = 0; r < srows; ++r)
        cpu::select().cast_to_bf16(dst.data() + static_cast<size_t>(r) * ld, X + static_cast<size_t>(r) * ld, scols);
    }
    return ld;
  }

  // In bf16, A and B are rounded into a16 and b16, except a B that comes with its bf16 copy.
  void matmul(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, GemmWeight B, int ldb,
              float beta, float* C, int ldc, const float* bias, const float* residual, bool bf16) {
    const void* a = A;
    const void* b = B.f32;
    if (bf16) {
      lda = to_bf16(a16, A, m, k, ta, lda);
      a = a16.data();
      if (B.bf16) {
        b = B.bf16;
      } else {
        ldb = to_bf16(b16, B.f32, k, n, tb, ldb);
        b = b16.data();
      }
    }
    const Key key{ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, bias != nullptr, residual != nullptr};
    run(key, bf16, a, b, C, bias, residual);
  }
};

HostGemm::HostGemm(GemmPlan plan) : plan_(plan), impl_(std::make_unique<Impl>()) {}
HostGemm::~HostGemm() = default;

void HostGemm::gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, GemmWeight B,
                    int ldb, float beta, float* C, int ldc) {
  if (m == 0 || n == 0) return;
  const GemmRole role = ta ? GemmRole::weight_grad : tb ? GemmRole::forward : GemmRole::input_grad;
  if (plan_.bf16) return impl_->matmul(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, nullptr, true);
  if (plan_.for_role(role) == GemmLibrary::cblas) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda,
                B.f32, ldb, beta, C, ldc);
    return;
  }
  DNNL_CHECK(dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, A, lda, B.f32, ldb, beta, C, ldc));
}

void HostGemm::linear(float* y, const float* x, GemmWeight w, const float* bias, const float* residual, int N,
                      int in, int out) {
  if (N == 0 || out == 0) return;
  if (plan_.bf16 || plan_.forward == GemmLibrary::onednn)
    return impl_->matmul(false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out, bias, residual, plan_.bf16);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w.f32, in, 0.0f, y, out);
  if (bias) cpu::select().add_bias(y, bias, N, out);
  if (residual) cpu::select().accumulate(y, residual, static_cast<size_t>(N) * out);
}

}  // namespace zero3d
