// kernels/host/cpu_kernels.h: the host backend's loops, as one table of functions per x86 ISA level
// (sse2, avx2, avx512; "generic" elsewhere). cpu_kernels_isa.cpp is compiled once per level with
// that level's flags into its own namespace; select() picks the best level the CPU reports at run
// time, so one binary is fast on the machine it runs on, whatever machine built it.
//
// Every function here runs on the calling rank's OpenMP threads (omp_get_max_threads(), set once
// at start by set_threads) and gives the same bits for any thread count: threads split rows or
// column blocks, never the terms of one sum. Semantics are those of the Backend ops of the same
// name (kernels/backend.h), which forward here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/math/adamw.h"

namespace zero3d::cpu {

struct Kernels {
  const char* isa;

  void (*embedding_forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                            int vocab_start, int vocab_rows);
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N, int T, int C,
                             int vocab_start, int vocab_rows);
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                            int C);
  void (*layernorm_backward)(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                             const float* mean, const float* rstd, int N, int C);
  void (*add_bias)(float* out, const float* bias, int N, int C);  // out[n,:] += bias: the CBLAS linear's epilogue
  void (*bias_backward)(float* dbias, const float* dout, int N, int C);
  void (*gelu_forward)(float* out, const float* x, size_t n);
  // dx = gelu'(x) * dout, y = gelu(x) as gelu_forward wrote it; with dbias != nullptr also
  // dbias[c] += sum_n dx[n, c] (N rows of C).
  void (*gelu_backward)(float* dx, float* dbias, const float* x, const float* y, const float* dout, int N, int C);
  void (*accumulate)(float* out, const float* a, size_t n);
  void (*scale)(float* x, float s, size_t n);

  // Causal multi-head (grouped-query) attention on packed qkv rows (see Backend::attention_forward).
  void (*attention_forward)(float* out, float* lse, const float* qkv, int B, int T, int H, int Hkv, int A, float* work);
  void (*attention_backward)(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv,
                             int B, int T, int H, int Hkv, int A, float* work);
  // The Llama family's ops (see the Backend's of the same name).
  void (*rmsnorm_forward)(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps);
  void (*rmsnorm_backward)(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                           int N, int C);
  void (*rope)(float* x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward);
  void (*swiglu_forward)(float* out, const float* h, int N, int F);
  void (*swiglu_backward)(float* dh, const float* h, const float* dout, int N, int F);

  // Logits rows of stride ld >= V; dlogits' padding columns [V, ld) are zeroed.
  void (*crossentropy)(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V, int ld,
                       float dloss);
  void (*vocab_row_max)(float* row_max, const float* logits, int N, int V, int ld);
  void (*vocab_sumexp)(float* sumexp, float* target_logit, const float* logits, const float* row_max,
                       const int32_t* targets, int vocab_start, int N, int V, int ld);
  void (*vocab_crossentropy_grad)(float* dlogits, const float* logits, const float* row_max, const float* sumexp,
                                  const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss);

  // with p16: the updated p also rounded to nearest even into p16 (fp16 or bf16), block by block
  void (*adam_step)(float* p, float* m, float* v, const float* g, size_t n, const math::AdamParams& a, uint16_t* p16,
                    bool fp16);
  void (*cast_to_bf16)(uint16_t* out, const float* x, size_t n);
  void (*cast_from_bf16)(float* out, const uint16_t* x, size_t n);
  void (*cast_to_fp16)(uint16_t* out, const float* x, size_t n);
  void (*cast_from_fp16)(float* out, const uint16_t* x, size_t n);
  void (*accumulate_bf16)(uint16_t* acc, const float* x, size_t n);
  void (*accumulate_fp16)(uint16_t* acc, const float* x, size_t n);

  // y = e^x elementwise by simd::vexp, the exp inside every softmax and GELU here: for its
  // accuracy test at each level and bench kernels' exp rate.
  void (*exp)(float* y, const float* x, size_t n);

  double (*sum_squares)(const float* x, size_t n);

  // The FMA peak of this level on the calling thread: independent vector FMAs for `seconds`,
  // FLOP/s (2 per lane per FMA). The ceiling `zero3d bench gemm` quotes GEMM rates against.
  double (*fma_peak)(double seconds);
};

// Floats of attention workspace per thread for sequences of T with head width hd. A transposed
// head's rows (K^T, V^T) are T padded to the 64-row tile plus kAttnRowPad floats (one cache line).
constexpr int kAttnRowPad = 16;
size_t attention_work_floats(int T, int head_dim);

// The level this process runs: the best this CPU runs, unless use_level chose another before the
// first kernel ran. runnable(): every level it can run (best first), for tests and benchmarks.
const Kernels& select();
std::vector<const Kernels*> runnable();
const Kernels* by_name(const std::string& isa);  // nullptr when not built in or not runnable here
// Loops that do nothing (isa "none"): a host backend that only counts what a step asks of it
// (HostOptions::count_only), so zero3d plan can read a step's work off the code without running it.
const Kernels& counting();
// Runs this process's host loops, and caps oneDNN's kernels, at level `isa` (compute.isa): "auto"
// is the ZERO3D_ISA environment variable when set, else the best level. A level above what the
// CPU runs, or one not built in, is a UserError naming `source` and the levels there are. Call it
// before any kernel or GEMM runs (main does, for ZERO3D_ISA; the trainer again for compute.isa).
void use_level(const std::string& isa, const std::string& source);
// The levels built into this binary, and those this CPU runs, best first ("avx512, avx2, sse2").
std::string built_levels();
std::string runnable_levels();

// What the CPU reports, for messages and the run record: "avx512" / "avx2" / "sse2" / "generic",
// plus the extensions GEMM libraries care about.
struct CpuFeatures {
  std::string vendor, model;  // e.g. "AuthenticAMD", "AMD EPYC 9B45"
  int family = 0, model_number = 0;
  bool avx2 = false, fma = false, avx512 = false, avx512_bf16 = false, amx_bf16 = false;
  std::string level() const { return avx512 ? "avx512" : avx2 && fma ? "avx2" : "sse2"; }
};
const CpuFeatures& cpu_features();

// Threads per rank: OpenMP (our loops and oneDNN) and, when the CBLAS is OpenBLAS, its own pool.
void set_threads(int n);
int threads();

}  // namespace zero3d::cpu
