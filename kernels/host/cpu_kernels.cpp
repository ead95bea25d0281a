// kernels/host/cpu_kernels.cpp: which compiled ISA level of the host loops this CPU runs, what the
// CPU is, and the thread count of a rank.
#include "kernels/host/cpu_kernels.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.h>

#include "core/check.h"
#include "kernels/host/gemm.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

// The levels CMakeLists.txt compiled (ZERO3D_ISA_LIST), each a namespace with its table.
#define Z3D_DECLARE_LEVEL(isa) \
  namespace zero3d::cpu::isa { \
  extern const Kernels kernels; \
  }
#if defined(__x86_64__)
Z3D_DECLARE_LEVEL(sse2)
Z3D_DECLARE_LEVEL(avx2)
Z3D_DECLARE_LEVEL(avx512)
#else
Z3D_DECLARE_LEVEL(generic)
#endif

// OpenBLAS's own thread pool, when the CBLAS is OpenBLAS (weak: absent from other BLAS libraries).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace zero3d::cpu {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = {};
  __get_cpuid(0, &a, &b, &c, &d);
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const unsigned base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
    f.family = static_cast<int>(base == 0xf ? base + ext : base);
    f.model_number = static_cast<int>(((a >> 4) & 0xf) | ((base == 0x6 || base == 0xf) ? ((a >> 12) & 0xf0) : 0));
  }
  char brand[49] = {};
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004)
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      unsigned regs[4] = {a, b, c, d};
      std::memcpy(brand + 16 * leaf, regs, 16);
    }
  f.model = brand;
  while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
  f.avx2 = __builtin_cpu_supports("x86-64-v3");  // AVX2, FMA, F16C, BMI (and the OS saves ymm)
  f.fma = f.avx2;
  f.avx512 = __builtin_cpu_supports("x86-64-v4");  // AVX-512 F, BW, CD, DQ, VL (and the OS saves zmm)
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.amx_bf16 = f.avx512 && ((d >> 22) & 1) && ((d >> 24) & 1);
#else
  f.vendor = "unknown";
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

namespace {
// Every level built in, best first.
std::vector<const Kernels*> built() {
#if defined(__x86_64__)
  return {&avx512::kernels, &avx2::kernels, &sse2::kernels};
#else
  return {&generic::kernels};
#endif
}
std::string names(const std::vector<const Kernels*>& levels) {  // "avx512, avx2, sse2"
  std::string s;
  for (const Kernels* k : levels) s += std::string(s.empty() ? "" : ", ") + k->isa;
  return s;
}
}  // namespace

std::vector<const Kernels*> runnable() {
  const CpuFeatures& f = cpu_features();
  std::vector<const Kernels*> k;
  for (const Kernels* level : built()) {
    const std::string isa = level->isa;
    if (isa == "avx512" ? f.avx512 : isa == "avx2" ? f.avx2 : true) k.push_back(level);
  }
  return k;
}

std::string built_levels() { return names(built()); }
std::string runnable_levels() { return names(runnable()); }

namespace {
std::atomic<const Kernels*> chosen{nullptr};  // set by use_level, or by the first select()
std::atomic<bool> ran{false};                 // select() has handed the level out: it no longer changes
}  // namespace

const Kernels* by_name(const std::string& isa) {
  for (const Kernels* k : runnable())
    if (isa == k->isa) return k;
  return nullptr;
}

void use_level(const std::string& isa, const std::string& source) {
  std::string want = isa, from = source;
  if (want == "auto") {
    const char* env = std::getenv("ZERO3D_ISA");
    want = env && *env ? env : "auto";
    from = "ZERO3D_ISA";
  }
  const Kernels* k = want == "auto" ? runnable().front() : by_name(want);
  if (!k) {
    const std::string here = runnable_levels();
    const CpuFeatures& f = cpu_features();
    const std::vector<const Kernels*> all = built();
    const bool in_build = std::any_of(all.begin(), all.end(), [&](const Kernels* l) { return want == l->isa; });
    if (in_build)
      throw UserError(strprintf("%s=%s: this CPU (%s, %s family %d model %d) does not run %s; the levels it runs: %s "
                                "(auto: the best of them)",
                                from.c_str(), want.c_str(), f.model.c_str(), f.vendor.c_str(), f.family,
                                f.model_number, want.c_str(), here.c_str()));
    throw UserError(strprintf("%s=%s: no such level in this build; the levels built in: %s; on this CPU: %s (or auto)",
                              from.c_str(), want.c_str(), names(all).c_str(), here.c_str()));
  }
  if (ran && k != chosen)
    throw UserError(strprintf("%s=%s comes after the host loops ran at %s: set it before the job starts", from.c_str(),
                              want.c_str(), chosen.load()->isa));
  chosen = k;
#if defined(__x86_64__)
  // oneDNN's GEMMs at the same level, so that a forced level measures that level's machine. sse2
  // maps to oneDNN's lowest, sse41. Unforced, oneDNN is left alone (DNNL_MAX_CPU_ISA, when a user
  // sets it, still applies). OpenBLAS's kernels follow the level too (cblas_use_level).
  static bool capped = false;
  const bool best = k == runnable().front();
  if (!best || capped)
    dnnl_set_max_cpu_isa(best                              ? dnnl_cpu_isa_all
                         : std::string(k->isa) == "avx2" ? dnnl_cpu_isa_avx2
                                                         : dnnl_cpu_isa_sse41);
  capped = !best;
#endif
  cblas_use_level(k->isa);
}

const Kernels& counting() {
  // Generic lambdas without captures convert to each member's function-pointer type.
  static const auto none = [](auto...) {};
  static const auto zero = [](auto...) { return 0.0; };
  static const Kernels k{"none", none, none, none, none, none, none, none, none, none, none,  // embedding .. scale
                         none, none,  // attention
                         none, none, none, none, none,  // the Llama ops
                         none, none, none, none,  // cross-entropy
                         none, none, none, none, none, none, none,  // Adam, 16-bit
                         none, zero, zero};  // exp .. fma_peak
  return k;
}

const Kernels& select() {
  if (!chosen) use_level("auto", "compute.isa");
  if (!ran.load(std::memory_order_relaxed)) ran = true;
  return *chosen.load(std::memory_order_relaxed);
}

// Per thread: eight panels of T x head width (T padded to the 64-row tile plus kAttnRowPad, the
// width to 16 lanes: the widest level's vector, a multiple of every level's): K^T, V^T, dQ, dK, dV
// (a key/value head's gradients, summed over the query heads that share it), and the Q, K, dO
// copies when the head width is no whole number of vectors; two 64 x 64 tiles and D (backward's
// set, which covers forward's).
size_t attention_work_floats(int T, int head_dim) {
  const size_t Tp = (static_cast<size_t>(T) + 63) / 64 * 64, hp = (static_cast<size_t>(head_dim) + 15) / 16 * 16;
  return 8 * (Tp + kAttnRowPad) * hp + 2 * 64 * 64 + Tp + 16;
}

void set_threads(int n) {
  omp_set_num_threads(n);
  if (openblas_set_num_threads) openblas_set_num_threads(n);
}

int threads() { return omp_get_max_threads(); }

}  // namespace zero3d::cpu
