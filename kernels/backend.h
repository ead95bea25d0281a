// kernels/backend.h: the seam between the model and the hardware. A Backend owns memory
// (host RAM or GPU memory) and runs every op the model needs on pointers into that memory.
// The math of each op lives once in kernels/math/*.h (the CUDA launchers and the references);
// the host runs it as vectorized, threaded loops compiled per ISA level (kernels/host/cpu_kernels.h)
// with GEMM through oneDNN or a CBLAS (kernels/host/gemm.h), so the host build runs everything.
//
// Conventions: all matrices are row-major; a linear layer's weight is (out, in) as in PyTorch,
// y = x W^T + b. Backward ops accumulate (+=) into parameter gradients, so gradient
// accumulation over micro-batches needs no extra buffer. Calls are asynchronous on CUDA (one
// stream per backend) and synchronous on the host; synchronize() joins them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mem.h"
#include "kernels/math/adamw.h"
#include "kernels/profile.h"
#include "kernels/tensor.h"

namespace zero3d {

enum class BackendKind { host, cuda, kokkos };

// A GEMM's weight operand (the B of op(A) op(B)): its fp32 values and, in bf16 runs, the same
// matrix as the run keeps it, in bf16, with the same leading dimension. f32 was widened from
// bf16, so bf16 is exactly what rounding f32 gives: a backend whose GEMMs run in bf16 takes it as
// it is (no rounding pass per GEMM); fp32 GEMMs read f32. Any fp32 matrix converts to a weight
// without a 16-bit copy; a bf16 activation (the x of a weight gradient) is a B with no fp32 values.
struct GemmWeight {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  GemmWeight(const float* w) : f32(w) {}  // NOLINT(google-explicit-constructor): every fp32 B is one
  GemmWeight(const float* w, const uint16_t* w16) : f32(w), bf16(w16) {}
  explicit GemmWeight(ConstView v) : f32(v.bf16() ? nullptr : v.f32_data()), bf16(v.bf16() ? v.bf16_data() : nullptr) {}
};

// adam_step's 16-bit output: where the updated weights go rounded to 16 bits (nullptr: nowhere).
struct Weights16 {
  uint16_t* p = nullptr;
  bool fp16 = false;  // fp16, else bf16
};

// One contiguous run of n parameters for adam_steps: the parameters, their moments and gradients,
// where the updated ones also go rounded to 16 bits (nullptr: nowhere), and the run's weight decay.
struct AdamRun {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* g = nullptr;
  size_t n = 0;
  float weight_decay = 0.0f;
  uint16_t* p16 = nullptr;
};

class Backend;
// The host backend is always available; the CUDA backend only in builds with ZERO3D_HAVE_CUDA.
struct HostOptions {
  std::string gemm = "auto";  // compute.gemm: "auto", "onednn" or "cblas" (kernels/host/gemm.h)
  bool bf16_gemm = false;     // GEMMs in bf16 with fp32 accumulation (oneDNN)
  std::string isa;            // the level of the host loops; "" = the best this CPU runs (tests pick others)
  bool count_only = false;    // run nothing, touch no operand: each op is only counted in profile() (zero3d plan)
};
std::unique_ptr<Backend> make_host_backend(const HostOptions& options = {});

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string describe() const = 0;
  // Where alloc_bytes memory lives, and how a comm group reaches it from the host (core/mem.h):
  // the host backend's is host memory (nullptr), the CUDA backend's device memory.
  virtual MemKind memory_kind() const { return MemKind::host; }
  virtual DeviceMemory* device_memory() { return nullptr; }
  // The host backend that runs what is offloaded to the CPU beside this one (zero/host_link.h):
  // beside a sizing backend one that only counts (walled_backend.cpp); null: a plain host backend.
  // Inline, and calling nothing: Backend keeps no key function (its vtable and typeinfo are in every
  // module that uses them) and the CUDA module needs no host-backend symbol from the executable.
  virtual std::unique_ptr<Backend> host_companion() const { return nullptr; }
  template <typename T>
  MemRef<T> mem(T* p) const {
    return {p, memory_kind()};
  }

  // ---- memory: alloc returns zeroed memory ----
  // Every allocation is counted: a training step allocates nothing after its first (the count is
  // in the metrics; page faults and allocator calls inside the step cost more than the math).
  virtual void* alloc_bytes(size_t bytes) = 0;
  // Memory that collectives read and write: where a transport can read it in place, allocated so
  // it can (host: shared memory the other ranks of the node map, core/shared_memory.h); else
  // alloc_bytes. Freed by free_bytes like any other.
  virtual void* alloc_comm_bytes(size_t bytes) { return alloc_bytes(bytes); }
  virtual size_t alloc_count() const = 0;
  // The most device memory this backend's buffers and scratch held at once (what it asked the
  // device for: as torch.cuda.max_memory_allocated counts a PyTorch run's tensors; library
  // workspaces and the context aside). 0 on the host, whose memory the OS measures.
  virtual uint64_t device_peak_bytes() const { return 0; }
  // Kernels and library calls (a GEMM, a cuDNN graph) issued so far: on a GPU each costs a launch
  // (microseconds of CPU and of queue), so a step's count says what fusing would save. The host
  // counts its ops.
  virtual uint64_t launch_count() const = 0;
  // Per-op timers (wall_clock_breakdown), or nullptr where the backend has none (CUDA: future work).
  virtual OpProfile* profile() { return nullptr; }
  virtual void free_bytes(void* p) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- GEMM: C = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when t* is set ----
  // Activation operands (views: kernels/tensor.h) are fp32 or bf16: A and C each either, fp32
  // accumulation always, C rounded once when bf16.
  virtual void gemm(bool ta, bool tb, int m, int n, int k, float alpha, ConstView A, int lda,
                    GemmWeight B, int ldb, float beta, View C, int ldc) = 0;
  // A linear layer's forward, y = x W^T (+ bias) (+ residual), bias and residual (nullptr: none)
  // added in the GEMM's epilogue where the library can. x: N x in, W: out x in; y must not alias
  // x or residual.
  virtual void linear_forward(View y, ConstView x, GemmWeight w, const float* bias, ConstView residual,
                              int N, int in, int out) = 0;
  // What runs the GEMMs, for the run record: library, ISA, precision.
  virtual std::string describe_gemm() const = 0;
  // Whether the GEMMs round their operands to bf16 (then a weight's bf16 copy is all they read).
  virtual bool bf16_gemm() const = 0;

  // ---- elementwise / per-row ops (N rows of C columns) ----
  // Activations and their gradients are views, fp32 or bf16 (fp32 math: kernels/tensor.h);
  // weights, their gradients and the statistics (mean, rstd, lse) are fp32.
  // out[n,:] = wte[tokens[n] - vocab_start,:] + wpe[n % T,:], where wte holds the vocab_rows rows
  // [vocab_start, vocab_start + vocab_rows) of the embedding (all of it without tensor parallelism);
  // a token outside them contributes 0, and wpe == nullptr adds no position embedding.
  virtual void embedding_forward(View out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T,
                                 int C, int vocab_start, int vocab_rows) = 0;
  // dwte[tokens[n] - vocab_start,:] += dout[n,:] for tokens in range; dwpe[n % T,:] += dout[n,:]
  // (dwpe == nullptr: no position embedding)
  virtual void embedding_backward(float* dwte, float* dwpe, ConstView dout, const int32_t* tokens, int N, int T,
                                  int C, int vocab_start, int vocab_rows) = 0;
  virtual void layernorm_forward(View out, float* mean, float* rstd, ConstView x, const float* w,
                                 const float* b, int N, int C) = 0;
  // dx += ...; dw += ...; db += ...
  virtual void layernorm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x,
                                  const float* w, const float* mean, const float* rstd, int N, int C) = 0;
  virtual void bias_backward(float* dbias, ConstView dout, int N, int C) = 0;  // dbias += sum_n dout[n,:]
  virtual void gelu_forward(View out, ConstView x, size_t n) = 0;
  // The MLP's first layer and its activation: pre = x W^T + bias (kept for backward), out =
  // gelu(pre) of the fp32 pre-activation, each rounded once in bf16 (the CUDA backend runs one
  // cuBLASLt matmul with the GELU in its epilogue; the host its GEMM, then the GELU on its fp32 out).
  virtual void linear_gelu_forward(View out, View pre, ConstView x, GemmWeight w, const float* bias, int N, int in,
                                   int F) = 0;
  // dx = gelu'(x) * dout over N rows of C (dx may alias dout), y = gelu(x) as gelu_forward wrote it
  // (the host derives the sigmoid from it: no exp); with dbias != nullptr also dbias[c] += sum_n
  // dx[n, c] (the bias gradient of the layer that produced x, in the same pass).
  virtual void gelu_backward(View dx, float* dbias, ConstView x, ConstView y, ConstView dout, int N, int C) = 0;
  virtual void accumulate(float* out, const float* a, size_t n) = 0;                      // out += a
  // Causal self-attention of B sequences of T on packed rows qkv (B*T rows of A + 2 Hkv hd:
  // [q | k | v], q holding H heads of hd = A/H columns, k and v Hkv heads each; Hkv divides H, and
  // query head h reads key/value head h / (H / Hkv): grouped-query attention, multi-head when
  // Hkv = H): out (B*T rows of A) = softmax(q k^T / sqrt(hd), keys j <= t) v per head; lse (B*H*T)
  // saves each row's log-sum-exp of the scaled scores for backward. The T x T probabilities are
  // never stored.
  virtual void attention_forward(View out, float* lse, ConstView qkv, int B, int T, int H, int Hkv, int A) = 0;
  // dqkv (written, not accumulated) from dout, given forward's out and lse.
  virtual void attention_backward(View dqkv, ConstView dout, ConstView out, const float* lse, ConstView qkv, int B,
                                  int T, int H, int Hkv, int A) = 0;
  // RMSNorm (kernels/math/rmsnorm.h) of N rows of C: out and each row's rstd; backward dx += and
  // dw += (the column sums), as layernorm_backward.
  virtual void rmsnorm_forward(View out, float* rstd, ConstView x, const float* w, int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(View dx, float* dw, ConstView dy, ConstView x, const float* w, const float* rstd,
                                int N, int C) = 0;
  // Rotary position embedding (kernels/math/rope.h), in place, on the first `heads` heads of hd
  // columns of N rows of stride ld (row n at position n % T): forward turns them, backward turns a
  // gradient back. cs: math::rope_table(T, hd, theta) in this backend's memory.
  virtual void rope(View x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) = 0;
  // SwiGLU (kernels/math/swiglu.h): out (N x F) = silu(gate) * up of h (N x 2F, [gate | up]);
  // backward writes dh (N x 2F) from dout (N x F).
  virtual void swiglu_forward(View out, ConstView h, int N, int F) = 0;
  virtual void swiglu_backward(View dh, ConstView h, ConstView dout, int N, int F) = 0;
  // Logits are N rows of stride ld >= V (a view: fp32 or the activations' bf16): V vocabulary
  // columns, then ld - V padding columns (the vocabulary padded for the GEMM) that no loss reads.
  // losses[n] = CE(logits[n, :V], targets[n]); with dlogits (may alias logits) also
  // dlogits[n, :V] = (softmax - onehot) * dloss and dlogits[n, V:ld] = 0 (N * ld elements: the
  // last row's padding too), so the padding gives the GEMMs behind it no gradient.
  virtual void crossentropy(float* losses, View dlogits, ConstView logits, const int32_t* targets, int N, int V,
                            int ld, float dloss) = 0;
  // Vocab-parallel cross-entropy (each tensor-parallel rank holds V of the vocabulary's logits,
  // starting at vocab_start): the row maxima, then (after an all-reduce max) each row's sum of
  // exp(z - max) and the target's logit (0 when the target is not in this rank's range), then
  // (after an all-reduce sum) dlogits = (softmax - onehot) * dloss (padding 0), in place allowed.
  virtual void vocab_row_max(float* row_max, ConstView logits, int N, int V, int ld) = 0;
  virtual void vocab_sumexp(float* sumexp, float* target_logit, ConstView logits, const float* row_max,
                            const int32_t* targets, int vocab_start, int N, int V, int ld) = 0;
  virtual void vocab_crossentropy_grad(View dlogits, ConstView logits, const float* row_max, const float* sumexp,
                                       const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) = 0;
  // AdamW (kernels/math/adamw.h) on every run of `runs` (a host array of `count`), one step with
  // the hyperparameters of `a` but each run's own weight decay; a run's p16 also gets its updated p
  // rounded to nearest even (fp16, else bf16), in the same pass: a mixed run's kept weights. As few
  // launches as the backend can: the host one op, CUDA one kernel per kAdamRunsPerLaunch runs
  // (their table passed as the kernel's argument), not one per run.
  virtual void adam_steps(const AdamRun* runs, size_t count, const math::AdamParams& a, bool fp16) = 0;
  // One run, its weight decay a's.
  void adam_step(float* p, float* m, float* v, const float* g, size_t n, const math::AdamParams& a, Weights16 w16) {
    const AdamRun run{p, m, v, g, n, a.weight_decay, w16.p};
    adam_steps(&run, 1, a, w16.fp16);
  }
  virtual void scale(float* x, float s, size_t n) = 0;
  virtual void cast_to_bf16(uint16_t* out, const float* x, size_t n) = 0;
  virtual void cast_from_bf16(float* out, const uint16_t* x, size_t n) = 0;
  virtual void cast_to_fp16(uint16_t* out, const float* x, size_t n) = 0;
  virtual void cast_from_fp16(float* out, const uint16_t* x, size_t n) = 0;
  // acc = round16(widen(acc) + x): accumulating fp32 contributions into a 16-bit gradient.
  virtual void accumulate_bf16(uint16_t* acc, const float* x, size_t n) = 0;
  virtual void accumulate_fp16(uint16_t* acc, const float* x, size_t n) = 0;

  // ---- reductions, result on the host (synchronizing) ----
  virtual double sum_squares(const float* x, size_t n) = 0;
};

// Tests: the host backend whose memory is "device" memory, unreadable from the host except inside
// its ops and copies (kernels/host/walled_backend.cpp): host code that touches device memory
// directly faults, without a GPU. ZERO3D_DEVICE_WALLS=1 makes `--backend host` this one.
std::unique_ptr<Backend> make_walled_backend(const HostOptions& options = {});
// What a sizing backend allocated: live and peak bytes of its memory.
struct MemoryTally {
  size_t live = 0, peak = 0;
  void add(size_t bytes) {
    live += bytes;
    if (live > peak) peak = live;
  }
};
// zero3d plan's: allocations of `kind` memory counted into `tally`, never backed by memory; copies
// and zeroing do nothing; running a kernel is a bug (kernels/host/walled_backend.cpp).
std::unique_ptr<Backend> make_sizing_backend(MemKind kind, std::shared_ptr<MemoryTally> tally);
// A library as `zero3d --version` and the run record name it (src/train/versions.h): the version
// zero3d was built with ("" where only the loaded one is known) and the one this process loaded,
// with the file it came from; or, where it is not loaded, why not.
struct LibraryVersion {
  std::string name, built, loaded, from, why_not;
};
#if defined(ZERO3D_HAVE_CUDA)
// bf16_gemm: GEMMs on the bf16 tensor cores with fp32 accumulation (fp32 in and out).
std::unique_ptr<Backend> make_cuda_backend(int device, bool bf16_gemm = false);
int cuda_device_count();  // 0 when no driver or no device
// The CUDA module for `zero3d --version`: loaded as --backend auto would (only where an NVIDIA
// driver is), its file and the libraries it runs on (CUDA runtime and driver, cuBLAS, cuDNN, NCCL);
// where it does not load, no libraries and why (no driver, ...).
struct CudaModuleReport {
  std::string file, why_not;
  std::vector<LibraryVersion> libraries;
};
CudaModuleReport cuda_module_report();
#endif
#if defined(ZERO3D_HAVE_KOKKOS)
// The Kokkos backend on Kokkos's default execution space (kernels/kokkos/backend_kokkos.cpp);
// the first one made initializes Kokkos, which is finalized at exit.
std::unique_ptr<Backend> make_kokkos_backend();
// "Kokkos 3.4.1 (Serial), Kokkos Kernels ... (BLAS TPL)": from the headers built against, without
// initializing Kokkos (zero3d --version).
std::string kokkos_version_string();
// The Kokkos core library this process loaded (its path; "" where linked statically). Kokkos 3.4
// has no call that says its version at run time: the file (its soname) is what names it.
std::string kokkos_library_file();
#endif
// The backend a command line names (--backend): "host", "cuda", "kokkos", or "auto" (CUDA where it
// is built and a GPU is visible, else the host; never Kokkos, which is asked for by name); local_rank,
// among the ranks of this node, picks the GPU (round robin over the visible ones); host.bf16_gemm
// applies to the host and CUDA backends (Kokkos's GEMMs are fp32). UserError for another name, or
// for cuda or kokkos where the build has none. ZERO3D_DEVICE_WALLS=1 makes the host one walled.
// (kernels/make_backend.cpp)
std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank, const HostOptions& host = {});
bool backend_is_cuda(const std::string& name);  // whether make_backend(name) makes the CUDA backend

// What a buffer is for: comm buffers are the ones collectives move (Backend::alloc_comm_bytes).
enum class BufferUse { compute, comm };

// Typed, move-only buffer in one backend's memory.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, size_t n, BufferUse use = BufferUse::compute) : be_(&be), n_(n) {
    if (n) p_ = static_cast<T*>(use == BufferUse::comm ? be.alloc_comm_bytes(n * sizeof(T)) : be.alloc_bytes(n * sizeof(T)));
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : be_(o.be_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_; p_ = o.p_; n_ = o.n_;
      o.p_ = nullptr; o.n_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  // Element `at` on, with its memory kind: what collectives take.
  MemRef<T> mem(size_t at = 0) { return {p_ + at, be_ ? be_->memory_kind() : MemKind::host}; }
  MemRef<const T> mem(size_t at = 0) const { return {p_ + at, be_ ? be_->memory_kind() : MemKind::host}; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void reset() {
    if (p_) be_->free_bytes(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  Backend* be_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace zero3d
