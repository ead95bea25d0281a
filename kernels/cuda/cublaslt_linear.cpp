// kernels/cuda/cublaslt_linear.cpp: see the header. Host code (no kernels): built by the host compiler.
//
// The row-major interface on column-major cuBLASLt, as in the backend's GEMM: row-major y (N x out)
// is column-major y^T (out x N), so D = y^T = W x^T with A = W stored as (in x out, ld in) and
// transposed, B = x^T stored as (in x N, ld in), C = D = (out x N, ld out). The bias then runs
// along D's rows, one element per output feature, as CUBLASLT_EPILOGUE_BIAS broadcasts it.
#include "kernels/cuda/cublaslt_linear.h"

#include <cublasLt.h>

#include "core/log.h"
#include "kernels/cuda/check.cuh"

namespace zero3d {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLASLt's Hopper kernels ask for at most

// The largest power of two, up to 256, dividing p's address. cuBLASLt's heuristic assumes A, B, C
// and D 256-byte aligned unless a preference says less (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES,
// default 256); an algorithm picked so for a view at a smaller offset fails at cublasLtMatmul
// (CUBLAS_STATUS_NOT_SUPPORTED) or faults (PyTorch #98975, TransformerEngine #845).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

// The epilogue's pointers of this call (the descriptor is host memory, read at enqueue).
void set_pointers(cublasLtMatmulDesc_t desc, const float* bias, void* gelu_pre) {
  if (bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (gelu_pre)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &gelu_pre, sizeof gelu_pre));
}
}  // namespace

struct LtLinear::Plan {
  bool ok = false;   // false: cuBLASLt has no algorithm here
  bool ran = false;  // cublasLtMatmul has accepted it once
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtLinear::LtLinear() {
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
}

LtLinear::~LtLinear() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

bool LtLinear::forward(cudaStream_t stream, View y, const void* x, const void* w, bool bf16, const float* bias,
                       ConstView residual, int N, int in, int out, View gelu_pre) {
  if (N <= 0 || out <= 0 || in <= 0) return false;
  if (gelu_pre && (residual || out % 8 != 0)) return false;  // the auxiliary output's ld must divide by 8
  // The epilogue's vectors have no alignment preference: the heuristic reads their pointers and may
  // take a kernel that assumes 16 bytes, which faults on a bias at a 4-byte offset (PyTorch #194497).
  if ((bias && alignment(bias) < 16) || (gelu_pre && alignment(gelu_pre.data) < 16)) return false;
  const void* c = residual ? residual.data : y.data;
  const std::array<uint32_t, 6> align{alignment(w), alignment(x), alignment(c), alignment(y.data),
                                      bias ? alignment(bias) : 0, gelu_pre ? alignment(gelu_pre.data) : 0};
  const Key key{N, in, out, bf16, y.bf16(), bias != nullptr, static_cast<bool>(residual), static_cast<bool>(gelu_pre),
                align};
  std::unique_ptr<Plan>& plan = plans_[key];
  if (!plan) {
    plan = std::make_unique<Plan>();
    if (!workspace_) CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    const cudaDataType_t ab = bf16 ? CUDA_R_16BF : CUDA_R_32F, cd = y.bf16() ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    const cublasLtEpilogue_t epilogue = gelu_pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                        : bias   ? CUBLASLT_EPILOGUE_BIAS
                                                 : CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias && y.bf16()) {  // the bias takes D's type unless told: it stays fp32
      const int32_t f32 = CUDA_R_32F;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32));
    }
    set_pointers(plan->desc, bias, gelu_pre.data);  // the heuristic reads their alignment
    if (gelu_pre) {  // the pre-activation, laid out as D (D's type, the auxiliary output's default; ld out)
      const int64_t ld = out;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, ab, in, out, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, ab, in, N, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->cd, cd, out, N, out));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t min_alignment[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, min_alignment[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a, plan->b, plan->cd,
                                       plan->cd, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    plan->ok = status == CUBLAS_STATUS_SUCCESS && found > 0;  // else: not supported here, the caller falls back
    if (plan->ok) plan->algo = result.algo;
  }
  if (!plan->ok) return false;
  set_pointers(plan->desc, bias, gelu_pre.data);
  const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
  const cublasStatus_t run =
      cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, w, plan->a, x, plan->b, &beta, c,
                     plan->cd, y.data, plan->cd, &plan->algo, workspace_, kWorkspaceBytes, stream);
  // A combination the heuristic answered but the matmul refuses (an epilogue's types, say) is
  // refused at the plan's first run, before anything is enqueued: the plan is marked as having no
  // algorithm and the caller falls back, as for a shape the heuristic refused. Later refusals fail.
  if (!plan->ran && (run == CUBLAS_STATUS_NOT_SUPPORTED || run == CUBLAS_STATUS_INVALID_VALUE)) {
    plan->ok = false;
    log_warn("zero3d: cuBLASLt refused its heuristic's algorithm for a linear layer (%d x %d -> %d%s%s%s): %s; the "
             "GEMM and an epilogue kernel run it",
             N, in, out, bias ? ", bias" : "", residual ? ", residual" : "", gelu_pre ? ", GELU" : "",
             cublasGetStatusString(run));
    return false;
  }
  CUBLAS_CHECK(run);
  plan->ran = true;
  return true;
}

}  // namespace zero3d
