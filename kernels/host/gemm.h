// kernels/host/gemm.h: the host GEMMs. oneDNN picks its kernels from the ISA bits the CPU
// reports (AVX2, AVX-512, avx512_bf16, AMX), so it runs at full speed on CPUs newer than any table;
// a CBLAS (OpenBLAS here; MKL, NVPL, ArmPL, BLIS on sites) stays selectable. Debian's OpenBLAS
// 0.3.21 picks its kernels from a table of CPU models and silently falls back to old ones on CPUs
// it does not know (Prescott on Intel model 207, Haswell on AMD Zen 5): cblas_use_level picks the
// right set again, and cblas_core_fallback() says so where it cannot.
//
// Which library runs a GEMM is decided per role, once (GemmPlan): forward (x W^T), input gradient
// (dy W) and weight gradient (dy^T x). In bf16 compute, A and B are rounded to bf16 and multiplied
// with fp32 accumulation by oneDNN (AMX or avx512_bf16), C stays fp32.
// Linear layers fold bias and residual into oneDNN's epilogue (post-ops), so neither costs a pass.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"  // GemmWeight

namespace zero3d {

enum class GemmLibrary { onednn, cblas };
enum class GemmRole { forward, input_grad, weight_grad };  // by transposes: (N,T), (N,N), (T,N)
const char* gemm_library_name(GemmLibrary l);  // "onednn", "cblas"

struct GemmPlan {
  GemmLibrary forward = GemmLibrary::onednn, input_grad = GemmLibrary::onednn, weight_grad = GemmLibrary::onednn;
  bool bf16 = false;  // compute in bf16 (oneDNN only)
  std::string why;    // the rule that chose, for `bench gemm`
  GemmLibrary for_role(GemmRole r) const {
    return r == GemmRole::forward ? forward : r == GemmRole::input_grad ? input_grad : weight_grad;
  }
  std::string describe() const;  // "onednn fp32" / "onednn bf16" / "onednn fp32, weight gradients cblas"
};

// "auto": oneDNN for every role, except the weight gradients on an OpenBLAS that runs the kernels
// of the level (cblas_use_level sees to it unless OPENBLAS_CORETYPE is set) when the rank runs one
// thread: OpenBLAS beats oneDNN 2.6 on those shapes there (Intel AVX-512: 142-146 against 110-113
// GFLOP/s; AVX2 on gpt-tiny's shapes: 89-97 against 58-89), but its own threads contend with
// oneDNN's OpenMP ones. "onednn", "cblas": one library
// for everything. bf16 compute always goes through oneDNN.
GemmPlan make_gemm_plan(const std::string& library, bool bf16);

class HostGemm {
 public:
  explicit HostGemm(GemmPlan plan);
  ~HostGemm();
  const GemmPlan& plan() const { return plan_; }

  // C = alpha op(A) op(B) + beta C, row-major; beta = 0 never reads C.
  // In bf16, B's bf16 copy where it has one is multiplied as it is (not rounded again).
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, GemmWeight B, int ldb,
            float beta, float* C, int ldc);
  // y = x W^T (+ bias) (+ residual); x: N x in, W: out x in, y and residual: N x out.
  void linear(float* y, const float* x, GemmWeight w, const float* bias, const float* residual, int N, int in,
              int out);

 private:
  struct Impl;
  GemmPlan plan_;
  std::unique_ptr<Impl> impl_;
};

// What runs, for messages: oneDNN's version and the ISA it dispatched to ("avx512_core_bf16"), and
// the CBLAS's name and core ("OpenBLAS 0.3.21 Haswell", or "CBLAS" when it is not OpenBLAS).
std::string onednn_version();
std::string onednn_isa();
bool onednn_has_bf16();  // oneDNN runs bf16 GEMM natively here (avx512_bf16 or AMX)
bool onednn_runs_bf16();  // oneDNN has a bf16 GEMM here at all, native or emulated (not on AVX2)
std::string cblas_name();
// OpenBLAS's kernels of ISA level `isa` (cpu::use_level calls it with the level this process runs):
// where OpenBLAS picked another set at load, a forced lower level (compute.isa, ZERO3D_ISA) or a
// model its table does not know, it picks the level's own set again (Zen's or Haswell's for avx2,
// SkylakeX's or Cooperlake's for avx512, Prescott's below), as a CPU of that level gets them. Not
// when OPENBLAS_CORETYPE is set (the user's choice stands) or the library has no dynamic kernels.
// Call it before any CBLAS call.
void cblas_use_level(const std::string& isa);
// When the CBLAS is OpenBLAS running kernels below the CPU's ISA (a model it does not know): the
// warning with the fix; "" otherwise.
std::string cblas_core_fallback();

}  // namespace zero3d
