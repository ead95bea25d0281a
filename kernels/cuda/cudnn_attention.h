// kernels/cuda/cudnn_attention.h: causal self-attention through cuDNN's fused flash attention, for
// the CUDA backend's bf16 runs. The operation graph is the one cuDNN's attention runtime-fusion
// engines recognise (FlashAttention-2): Q K^T, the scale, the causal mask by comparing the row and
// column indices, the softmax with its fp32 log-sum-exp as an output, P V; and its backward. Q, K, V
// are read from the packed [q | k | v] rows through strides, dQ, dK, dV written into the same
// layout: no copies. Grouped-query heads (query head h reads key/value head h / (H / Hkv)); cuDNN
// sums dK and dV over the query heads that share them.
//
// cuDNN is loaded at run time (dlopen of libcudnn_graph.so.9, or the file ZERO3D_CUDNN names), so a
// machine without it, or with one older than 9.19, still runs: the caller keeps its own kernels
// there, and for any shape cuDNN refuses (supports() says why).
//
// Invariants:
//  - Deterministic: the backward is the form without an fp32 dQ accumulator (its dQ matmul writes
//    dQ), and an engine configuration whose numerical notes say NONDETERMINISTIC is never taken; so
//    the same inputs give the same bits on every run.
//  - A plan is built once per shape and direction, then reused: building one compiles its kernels
//    (NVRTC), seconds.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace zero3d {

// One call's shape: B sequences of T tokens, H query heads on Hkv key/value heads of hd each.
struct AttnShape {
  int B = 0, T = 0, H = 0, Hkv = 0, hd = 0;
  auto key() const { return std::tuple(B, T, H, Hkv, hd); }
  bool operator<(const AttnShape& o) const { return key() < o.key(); }
};

class CudnnAttention {
 public:
  // cuDNN loaded, at least 9.19, with a handle on the calling thread's current device, whose
  // compute capability is `sm` (90: Hopper); nullptr and why where not. ZERO3D_CUDNN_DEVICE_JSON=FILE: cuDNN's description of that device written
  // there (what check_plans takes; the GPU check records it).
  static std::unique_ptr<CudnnAttention> load(int sm, std::string& why);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;
  std::string describe() const;  // "cuDNN 9.19.0 fused flash attention"

  // Whether cuDNN runs shape s in this direction; the first ask builds the plan. False: why_not()
  // says why, and later asks answer at once.
  bool supports(const AttnShape& s, bool backward);
  const std::string& why_not() const { return why_not_; }

  // Enqueued on `stream`, after supports(s, false): out16 (B*T rows of H*hd, bf16) and lse (B*H*T,
  // fp32: each row's natural-log sum of exp of the scaled, masked scores) from qkv16 (B*T rows of
  // (H + 2 Hkv) hd, bf16). Every pointer 16-byte aligned.
  void forward(cudaStream_t stream, uint16_t* out16, float* lse, const uint16_t* qkv16, const AttnShape& s);
  // After supports(s, true): dqkv16 (written, laid out as qkv16) from dout16 and the forward's
  // out16, lse and qkv16.
  void backward(cudaStream_t stream, uint16_t* dqkv16, const uint16_t* dout16, const uint16_t* out16,
                const float* lse, const uint16_t* qkv16, const AttnShape& s);

  // For tests without a GPU: builds the forward and the backward operation graph of s and finalizes
  // them (no handle, no engine): "" when cuDNN accepts both, else what it refused, or why cuDNN is
  // not there (`loaded` false then). sm: the compute capability whose limits apply (90: Hopper).
  static std::string check_graphs(const AttnShape& s, bool& loaded, int sm = 90);

  // For tests without a GPU, one step further (cuDNN's deviceless compilation, 9.8 or later): the
  // plans of s, forward then backward, built as a run builds them (the heuristics, the same walk
  // over engine configurations, an execution plan finalized, its kernels compiled) for the GPU that
  // device_json describes (cuDNN's device-property JSON: tests/data/cudnn/) instead of a handle's.
  // "" when both build, and `taken` names each one's engine and workspace; else what cuDNN refused
  // ("forward: ... | backward: ...", each engine tried and why). A plan's last step loads its
  // compiled kernels through the driver: with no driver (or its stub) every engine that took the
  // graph ends in CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, and nothing earlier failed.
  static std::string check_plans(const AttnShape& s, const std::string& device_json, bool& loaded,
                                 std::string& taken);

 private:
  struct Plan;
  CudnnAttention();
  Plan* plan(const AttnShape& s, bool backward);
  // Builds p: the graph of s, then the first deterministic engine configuration whose plan
  // finalizes, for `handle`'s device or (handle null) the one `device` (a device-property
  // descriptor) describes. p.why says why not.
  static void build(Plan& p, const AttnShape& s, bool backward, int sm, void* handle, void* device);
  void* workspace(size_t bytes);  // device memory, grown to the largest asked for

  void* handle_ = nullptr;  // cudnnHandle_t
  size_t version_ = 0;
  int sm_ = 0;  // the device's compute capability, 10 * major + minor
  std::map<std::pair<AttnShape, bool>, std::unique_ptr<Plan>> plans_;  // null: refused
  std::string why_not_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// The cuDNN this process runs (loaded here where it is not yet), for `zero3d --version` and the run
// record: its version ("9.19.0") and the file it came from; "" and why where it does not load or
// is older than 9.19.
std::string cudnn_loaded_version(std::string& from, std::string& why);

}  // namespace zero3d
