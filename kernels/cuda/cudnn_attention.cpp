// kernels/cuda/cudnn_attention.cpp: see the header. Host code (no kernels): built by the host
// compiler. cuDNN's backend API only: a tensor or an operation is a descriptor whose attributes are
// set one by one and then finalized; an operation graph of them is matched by cuDNN's heuristics to
// engine configurations, one of which becomes an execution plan (its kernels compiled); a variant
// pack binds the tensors' unique ids to device pointers for each execution.
//
// The graphs (tensors [batch, heads, rows, columns], strides in elements; S = the T x T scores of
// every head, never stored: virtual tensors live in the fused kernel only):
//   forward   S = Q K^T; S *= scale; S = row >= col ? S : -inf; m = rowmax S; E = exp(S - m);
//             z = rowsum E; lse = m + log z; P = E / z (bf16); O = P V
//   backward  D = rowsum(dO * O); P = exp(mask(scale Q K^T - lse)); dV = P^T dO; dP = dO V^T;
//             dS = scale P (dP - D); dK = dS^T Q; dQ = dS K
// With Hkv < H the matmuls broadcast K and V over the query heads of a group, and dK, dV come out
// per query head and are summed per group by a reduction. The log-sum-exp is the one our own kernels
// save (kernels/math/attention.h), so either backward can follow either forward.
#include "kernels/cuda/cudnn_attention.h"

#include <cudnn_graph.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/library_file.h"
#include "core/log.h"

namespace zero3d {

namespace {

constexpr size_t kMinVersion = 91900;  // 9.19: cudnnGetVersion() is major * 10000 + minor * 100 + patch

// The cuDNN functions zero3d calls, from the library loaded at run time.
struct Api {
  size_t (*GetVersion)();
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t);
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
  cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                int64_t, const void*);
  cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                int64_t, int64_t*, void*);
  cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

// Loaded once per process: ZERO3D_CUDNN names the library file, else the loader finds
// libcudnn_graph.so.9 (it loads its engine libraries and NVRTC from beside itself). Null, and why,
// where cuDNN cannot be used.
const Api* cudnn_api(std::string& why) {
  static std::string failed;
  static const Api* const api = []() -> const Api* {
    const char* env = std::getenv("ZERO3D_CUDNN");
    const std::string path = env && *env ? env : "libcudnn_graph.so.9";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      failed = strprintf("cannot load %s (%s)", path.c_str(), e ? e : "?");
      return nullptr;
    }
    static Api a;
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && failed.empty()) failed = strprintf("%s has no %s", path.c_str(), name);
    };
    bind(a.GetVersion, "cudnnGetVersion");
    bind(a.GetErrorString, "cudnnGetErrorString");
    bind(a.GetLastErrorString, "cudnnGetLastErrorString");
    bind(a.Create, "cudnnCreate");
    bind(a.Destroy, "cudnnDestroy");
    bind(a.SetStream, "cudnnSetStream");
    bind(a.CreateDescriptor, "cudnnBackendCreateDescriptor");
    bind(a.DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    bind(a.Finalize, "cudnnBackendFinalize");
    bind(a.SetAttribute, "cudnnBackendSetAttribute");
    bind(a.GetAttribute, "cudnnBackendGetAttribute");
    bind(a.Execute, "cudnnBackendExecute");
    if (!failed.empty()) return nullptr;
    const size_t v = a.GetVersion();
    if (v < kMinVersion) {
      failed = strprintf("%s is cuDNN %s; zero3d takes 9.19 or later (9.18 fixed a Hopper determinism bug)",
                         path.c_str(), dotted_version(static_cast<long>(v)).c_str());
      return nullptr;
    }
    return &a;
  }();
  if (!api) why = failed;
  return api;
}

// A refusal while building: why, in cuDNN's words.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string status_text(const Api& a, cudnnStatus_t s) {
  char last[512] = "";
  a.GetLastErrorString(last, sizeof last);
  return std::string(a.GetErrorString(s)) + (last[0] ? std::string(" (") + last + ")" : "");
}

// A refusal in one line: the status and the first reason in cuDNN's last error (its first line
// names the engine configuration, the next ones the checks that failed, innermost first).
std::string first_reason(const Api& a, cudnnStatus_t s) {
  char last[4096] = "";
  a.GetLastErrorString(last, sizeof last);
  std::string text = last, reason;
  if (const size_t at = text.find("Reason: "); at != std::string::npos) {
    reason = text.substr(at + 8, text.find('\n', at) - at - 8);
    if (const size_t tail = reason.rfind(" at: "); tail != std::string::npos) reason.resize(tail);
  }
  return std::string(a.GetErrorString(s)) + (reason.empty() ? "" : " (" + reason + ")");
}

void check(const Api& a, cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Refused(std::string(what) + ": " + status_text(a, s));
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc(const Api& a, cudnnBackendDescriptorType_t type) : a_(&a) {
    check(a, a.CreateDescriptor(type, &d_), "creating a descriptor");
  }
  Desc(Desc&& o) noexcept : a_(o.a_), d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  ~Desc() {
    if (d_) a_->DestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const void* values, int64_t n = 1) {
    const cudnnStatus_t s = a_->SetAttribute(d_, name, type, n, values);
    if (s != CUDNN_STATUS_SUCCESS) throw Refused(strprintf("attribute %d: %s", static_cast<int>(name), status_text(*a_, s).c_str()));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t d) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &d);
  }
  void finalize(const char* what) { check(*a_, a_->Finalize(d_), what); }

 private:
  const Api* a_;
  cudnnBackendDescriptor_t d_ = nullptr;
};

using D = cudnnBackendDescriptor_t;

// The tensors a variant pack binds (the others are virtual: inside the fused kernel only).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum,
  kFirstVirtual = 100
};

// A tensor's shape: dims [batch, heads, rows, columns] and strides in elements.
struct Shape {
  std::array<int64_t, 4> dims, strides;
};

// The descriptors of one graph, its operations in order.
class Graph {
 public:
  explicit Graph(const Api& a) : a_(a) {}

  // A tensor the variant pack binds (uid), or (uid 0) a virtual one, of `type`; by_value: a host
  // value (its address in the variant pack), not device memory.
  D tensor(const Shape& s, cudnnDataType_t type, int64_t uid = 0, bool by_value = false) {
    const bool is_virtual = uid == 0;
    const int64_t id = is_virtual ? next_virtual_++ : uid, alignment = 16;
    Desc& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, s.dims.data(), 4)
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, s.strides.data(), 4)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &id)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    const bool yes = true;
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &yes);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &yes);
    t.finalize(by_value ? "a scalar" : "a tensor");
    return t.get();
  }
  D virt(const Shape& s, cudnnDataType_t type = CUDNN_DATA_FLOAT) { return tensor(s, type); }
  // A float scalar passed by value.
  D scalar(int64_t uid) { return tensor({{1, 1, 1, 1}, {1, 1, 1, 1}}, CUDNN_DATA_FLOAT, uid, true); }

  // y = mode(x, b, t): b the second input (or null), t the third (BINARY_SELECT's predicate);
  // axis: GEN_INDEX's. The math in `precision`.
  void pointwise(cudnnPointwiseMode_t mode, D y, D x, D b = nullptr, D t = nullptr,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& p = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    p.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) p.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    p.finalize("a pointwise mode");
    const float one = 1.0f;
    Desc& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p.get()).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, &one);
    add(op, "a pointwise operation");
  }
  // c = a b over the last two dims, batched over the first two (broadcast where one has fewer heads).
  void matmul(D a, D b, D c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    Desc& m = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32).finalize("a matmul");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m.get());
    add(op, "a matmul operation");
  }
  // y = x reduced over the dims where y has 1 (or fewer heads: a group's sum). The attention
  // engines take only the non-deterministic flag here; the fused kernel fixes the order itself.
  void reduce(cudnnReduceTensorOp_t reduction, D x, D y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const bool no = false;
    Desc& r = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32)
        .set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduction)
        .set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, &no)
        .finalize("a reduction");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.get())
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    add(op, "a reduction operation");
  }
  // y = x viewed with y's dims and strides (a transpose, a type change).
  void reshape(D x, D y) {
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add(op, "a reshape operation");
  }

  // The operation graph of everything added, on `handle` (null: for a check without a GPU).
  D finalize(cudnnHandle_t handle) {
    Desc& g = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(), static_cast<int64_t>(ops_.size()));
    if (handle) g.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    g.finalize("the operation graph");
    return g.get();
  }

  Desc& keep(cudnnBackendDescriptorType_t type) {
    descs_.emplace_back(a_, type);
    return descs_.back();
  }

 private:
  void add(Desc& op, const char* what) {
    op.finalize(what);
    ops_.push_back(op.get());
  }
  const Api& a_;
  std::deque<Desc> descs_;  // every descriptor of the graph, alive as long as it (a deque: keep()'s references stay valid)
  std::vector<D> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// The layouts of one shape.
struct Layouts {
  Shape q, kt, v, vt, o, dq, dk, scores, scores_t, rows, heads;
  explicit Layouts(const AttnShape& s) {
    const int64_t B = s.B, T = s.T, H = s.H, Hkv = s.Hkv, d = s.hd, R = (H + 2 * Hkv) * d;
    q = {{B, H, T, d}, {T * R, d, R, 1}};           // in the packed rows, at column 0
    kt = {{B, Hkv, d, T}, {T * R, d, 1, R}};        // K^T: K's memory (column H d) with the last two dims swapped
    v = {{B, Hkv, T, d}, {T * R, d, R, 1}};         // at column (H + Hkv) d
    vt = {{B, Hkv, d, T}, {T * R, d, 1, R}};        // V^T, as K^T
    o = {{B, H, T, d}, {T * H * d, d, H * d, 1}};   // B*T rows of H d
    dq = q;                                         // dQ, dK, dV: in packed rows, as Q, K, V
    dk = {{B, Hkv, T, d}, {T * R, d, R, 1}};
    scores = {{B, H, T, T}, {H * T * T, T * T, T, 1}};
    scores_t = {{B, H, T, T}, {H * T * T, T * T, 1, T}};
    rows = {{B, H, T, 1}, {H * T, T, 1, 1}};         // one per row: the log-sum-exp, as our kernels keep it
    heads = {{B, H, T, d}, {H * T * d, T * d, d, 1}};  // a per-query-head product inside the kernel
  }
};

// Keeps x where the row (query) index is at least the column (key) index, else -inf: causal.
D causal_mask(Graph& g, const Layouts& L, D x, D neg_inf) {
  const D row = g.virt(L.scores, CUDNN_DATA_INT32), col = g.virt(L.scores, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, row, x, nullptr, nullptr, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, col, x, nullptr, nullptr, CUDNN_DATA_FLOAT, 3);
  const D keep = g.virt(L.scores, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, keep, row, col, nullptr, CUDNN_DATA_BOOLEAN);
  const D y = g.virt(L.scores);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, y, x, neg_inf, keep);
  return y;
}

void forward_graph(Graph& g, const AttnShape& s) {
  const Layouts L(s);
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const D q = g.tensor(L.q, bf16, kQ), kt = g.tensor(L.kt, bf16, kK), v = g.tensor(L.v, bf16, kV);
  const D o = g.tensor(L.o, bf16, kO), lse = g.tensor(L.rows, f32, kStats);
  const D scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf);
  const D qk = g.virt(L.scores), scaled = g.virt(L.scores);
  g.matmul(q, kt, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, scaled, qk, scale);
  const D masked = causal_mask(g, L, scaled, neg_inf);
  const D m = g.virt(L.rows), shifted = g.virt(L.scores), e = g.virt(L.scores);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  g.pointwise(CUDNN_POINTWISE_SUB, shifted, masked, m);
  g.pointwise(CUDNN_POINTWISE_EXP, e, shifted);
  const D z = g.virt(L.rows), log_z = g.virt(L.rows);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, log_z, z);
  g.pointwise(CUDNN_POINTWISE_ADD, lse, m, log_z);
  const D p = g.virt(L.scores, bf16);  // the P V matmul takes P in the inputs' type
  g.pointwise(CUDNN_POINTWISE_DIV, p, e, z);
  g.matmul(p, v, o);
}

// dK or dV = a b: straight into its place with one key/value head per query head, else per query
// head and then summed over each group.
void per_kv_head(Graph& g, const Layouts& L, const AttnShape& s, D a, D b, D out) {
  if (s.H == s.Hkv) {
    g.matmul(a, b, out);
    return;
  }
  const D full = g.virt(L.heads, CUDNN_DATA_BFLOAT16);
  g.matmul(a, b, full);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

void backward_graph(Graph& g, const AttnShape& s) {
  const Layouts L(s);
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const D q = g.tensor(L.q, bf16, kQ), kt = g.tensor(L.kt, bf16, kK), vt = g.tensor(L.vt, bf16, kV);
  const D o = g.tensor(L.o, bf16, kO), dout = g.tensor(L.o, bf16, kDO), lse = g.tensor(L.rows, f32, kStats);
  const D dq = g.tensor(L.dq, bf16, kDQ), dk = g.tensor(L.dk, bf16, kDK), dv = g.tensor(L.dk, bf16, kDV);
  const D scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf), one = g.scalar(kOne);
  const D softmax_sum = g.tensor(L.rows, f32, kSoftmaxSum);  // D_i = dO_i . O_i, in our workspace
  // D_i.
  const D prod = g.virt(L.heads), row_sum = g.virt(L.rows);
  g.pointwise(CUDNN_POINTWISE_MUL, prod, dout, o);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, softmax_sum, row_sum, one);
  // P again, from the saved log-sum-exp.
  const D qk = g.virt(L.scores), scaled = g.virt(L.scores), shifted = g.virt(L.scores);
  g.matmul(q, kt, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, scaled, qk, scale);
  g.pointwise(CUDNN_POINTWISE_SUB, shifted, scaled, lse);
  const D masked = causal_mask(g, L, shifted, neg_inf);
  const D p = g.virt(L.scores);
  g.pointwise(CUDNN_POINTWISE_EXP, p, masked);
  // dV = P^T dO.
  const D p_t = g.virt(L.scores_t, bf16);
  g.reshape(p, p_t);
  per_kv_head(g, L, s, p_t, dout, dv);
  // dS = scale P (dO V^T - D).
  const D dp = g.virt(L.scores), centered = g.virt(L.scores), weighted = g.virt(L.scores), ds = g.virt(L.scores);
  g.matmul(dout, vt, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, centered, dp, softmax_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, centered, p);
  g.pointwise(CUDNN_POINTWISE_MUL, ds, weighted, scale);
  // dK = dS^T Q.
  const D ds_t = g.virt(L.scores_t, bf16);
  g.reshape(ds, ds_t);
  per_kv_head(g, L, s, ds_t, q, dk);
  // dQ = dS K, written by its matmul: the deterministic form (no fp32 dQ accumulator). K is K^T's
  // memory viewed untransposed, as an fp32 virtual tensor: the type cudnn-frontend's SDPA backward
  // gives it (its reshape output takes the graph's intermediate type), so the matmul's inputs are
  // both fp32, dS and K, as in the graph cuDNN's engines are tested with.
  const D k = g.virt(L.dk, f32);
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

// Bytes of device memory the backward keeps D_i in, ahead of the plan's workspace.
size_t softmax_sum_bytes(const AttnShape& s) {
  const size_t n = static_cast<size_t>(s.B) * s.H * s.T * sizeof(float);
  return (n + 255) / 256 * 256;
}

// What cuDNN's attention engines take on a GPU of compute capability sm (90: 9.0), checked before a
// graph is built: the limits cudnn-frontend checks before it builds one (node/sdpa_support_surface.h,
// and CompositeSDPABackwardNode's pre_validate_node for the backward's head width by architecture).
std::string shape_refusal(const AttnShape& s, bool backward, int sm) {
  if (s.hd % 8 != 0 || s.hd > 256) return strprintf("head width %d: cuDNN takes multiples of 8 up to 256", s.hd);
  if (backward && sm / 10 != 9 && s.hd > 128)
    return strprintf("head width %d: cuDNN's backward takes up to 128 on sm_%d (256 on Hopper only)", s.hd, sm);
  if (s.H % s.Hkv != 0) return strprintf("%d query heads on %d key/value heads", s.H, s.Hkv);
  if (backward && s.T < 2) return "a sequence of 1 (cuDNN's backward needs 2 or more)";
  // cuDNN 9.18.1's release notes list as a known issue causal attention with one query row (its
  // decode kernels) where query heads outnumber key/value heads; one row is our kernels' easy case.
  if (s.T < 2 && s.H != s.Hkv) return "a sequence of 1 with grouped-query heads (a known cuDNN issue)";
  return "";
}

// cuDNN's description of the handle's device (its device-property JSON, as the deviceless plan
// check takes it: tests/data/cudnn) written to `file`; a warning where it cannot be.
void write_device_json(const Api& a, cudnnHandle_t handle, const char* file) {
  try {
    Desc device(a, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    device.set(CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, &handle).finalize("the device properties");
    int64_t n = 0;
    check(a, a.GetAttribute(device.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n, nullptr),
          "sizing the device's JSON");
    std::string json(static_cast<size_t>(n), '\0');
    check(a, a.GetAttribute(device.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, json.data()),
          "reading the device's JSON");
    json.resize(std::min(json.size(), json.find('\0')));
    std::FILE* f = std::fopen(file, "w");
    if (!f || std::fprintf(f, "%s\n", json.c_str()) < 0 || std::fclose(f) != 0)
      log_warn("zero3d: cannot write cuDNN's device properties to %s", file);
  } catch (const Refused& e) {
    log_warn("zero3d: cuDNN's device properties: %s", e.what());
  }
}

}  // namespace

struct CudnnAttention::Plan {
  Graph graph;
  std::deque<Desc> configs;  // the engine configurations tried, and engines (the plan refers to one)
  std::deque<Desc> plans;    // the execution plan taken, last
  int64_t workspace = 0;      // the plan's, bytes
  int64_t engine = -1;        // the engine's global index
  std::string why;            // refused: why (then `plans` is empty)
  explicit Plan(const Api& a) : graph(a) {}
  D plan() const { return plans.back().get(); }
};

CudnnAttention::CudnnAttention() = default;

CudnnAttention::~CudnnAttention() {
  std::string unused;
  const Api* a = cudnn_api(unused);
  plans_.clear();  // the plans before the handle they were made with
  if (workspace_) cudaFree(workspace_);
  if (a && handle_) a->Destroy(static_cast<cudnnHandle_t>(handle_));
}

std::unique_ptr<CudnnAttention> CudnnAttention::load(int sm, std::string& why) {
  if (const char* e = std::getenv("ZERO3D_CUDNN_ATTENTION"); e && std::string(e) == "0") {
    why = "ZERO3D_CUDNN_ATTENTION=0";
    return nullptr;
  }
  const Api* a = cudnn_api(why);
  if (!a) return nullptr;
  std::unique_ptr<CudnnAttention> c(new CudnnAttention());
  cudnnHandle_t h = nullptr;
  if (const cudnnStatus_t s = a->Create(&h); s != CUDNN_STATUS_SUCCESS) {
    why = "cudnnCreate: " + status_text(*a, s);
    return nullptr;
  }
  c->handle_ = h;
  c->version_ = a->GetVersion();
  if (const char* file = std::getenv("ZERO3D_CUDNN_DEVICE_JSON"); file && *file) write_device_json(*a, h, file);
  c->sm_ = sm;
  return c;
}

std::string cudnn_loaded_version(std::string& from, std::string& why) {
  const Api* a = cudnn_api(why);
  if (!a) return "";
  from = library_file(a->GetVersion);
  return dotted_version(static_cast<long>(a->GetVersion()));
}

std::string CudnnAttention::describe() const {
  return "cuDNN " + dotted_version(static_cast<long>(version_)) + " fused flash attention (bf16, deterministic backward)";
}

CudnnAttention::Plan* CudnnAttention::plan(const AttnShape& s, bool backward) {
  auto [it, fresh] = plans_.try_emplace({s, backward});
  if (!fresh) return it->second.get();
  std::string why;
  auto p = std::make_unique<Plan>(*cudnn_api(why));
  build(*p, s, backward, sm_, handle_, nullptr);
  return (it->second = std::move(p)).get();
}

void CudnnAttention::build(Plan& p, const AttnShape& s, bool backward, int sm, void* handle, void* device) {
  std::string unused;
  const Api& a = *cudnn_api(unused);
  p.why = shape_refusal(s, backward, sm);
  if (!p.why.empty()) return;
  // With a device-property descriptor, the heuristics, the engines and the plan take it where they
  // would ask the handle's device.
  const auto with_device = [&](Desc& d, cudnnBackendAttributeName_t name) {
    if (device) d.set_desc(name, static_cast<D>(device));
  };
  std::string tried;
  // Takes configuration cfg when its engine is deterministic and its plan builds; else says why
  // in `tried`.
  const auto take = [&](D cfg) {
    Desc engine(a, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    D e = engine.get();
    int64_t k = 0, index = -1;
    check(a, a.GetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k, &e),
          "reading a configuration's engine");
    a.GetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &k, &index);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t count = 0;
    check(a, a.GetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                            &count, notes),
          "reading an engine's numerical notes");
    bool deterministic = true;
    for (int64_t j = 0; j < count; ++j) deterministic = deterministic && notes[j] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    if (!deterministic) {
      tried += strprintf("; engine %lld: nondeterministic", static_cast<long long>(index));
      return false;
    }
    Desc& plan = p.plans.emplace_back(a, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (handle) plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    with_device(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP);
    plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    if (const cudnnStatus_t st = a.Finalize(plan.get()); st != CUDNN_STATUS_SUCCESS) {
      tried += strprintf("; engine %lld: %s", static_cast<long long>(index), first_reason(a, st).c_str());
      p.plans.pop_back();
      return false;
    }
    check(a, a.GetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &k, &p.workspace),
          "reading the plan's workspace");
    p.engine = index;
    return true;
  };
  try {
    if (backward) backward_graph(p.graph, s);
    else forward_graph(p.graph, s);
    const D graph = p.graph.finalize(static_cast<cudnnHandle_t>(handle));
    // The heuristic's configurations, best first (its fallback list when the first mode has none);
    // the first that is deterministic and whose plan builds is taken.
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur(a, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
      with_device(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP);
      heur.finalize("the engine heuristic");
      int64_t n = 0;
      check(a, a.GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr),
            "counting engine configurations");
      std::vector<D> cfg;
      for (int64_t i = 0; i < n; ++i) cfg.push_back(p.configs.emplace_back(a, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
      int64_t got = 0;
      check(a, a.GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg.data()),
            "reading engine configurations");
      for (int64_t i = 0; i < got; ++i)
        if (take(cfg[i])) return;
    }
    if (tried.empty()) {
      // None offered: the heuristics drop the engines that refuse the graph without saying why, so
      // each engine's default configuration is tried as above, for cuDNN's reasons.
      int64_t engines = 0, k = 0;
      check(a, a.GetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &k, &engines),
            "counting engines");
      tried = "; none offered";
      for (int64_t i = 0; i < engines; ++i) {
        Desc& engine = p.configs.emplace_back(a, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        engine.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &i);
        with_device(engine, CUDNN_ATTR_ENGINE_DEVICEPROP);
        if (const cudnnStatus_t st = a.Finalize(engine.get()); st != CUDNN_STATUS_SUCCESS) {
          tried += strprintf("; engine %lld: %s", static_cast<long long>(i), first_reason(a, st).c_str());
          continue;
        }
        Desc& cfg = p.configs.emplace_back(a, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        cfg.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, engine.get());
        if (const cudnnStatus_t st = a.Finalize(cfg.get()); st != CUDNN_STATUS_SUCCESS) {
          tried += strprintf("; engine %lld: %s", static_cast<long long>(i), first_reason(a, st).c_str());
          continue;
        }
        if (take(cfg.get())) return;
      }
    }
    p.why = "no deterministic engine configuration builds" + tried;
  } catch (const Refused& e) {
    p.why = e.what() + tried;
  }
  p.plans.clear();
}

bool CudnnAttention::supports(const AttnShape& s, bool backward) {
  const Plan* p = plan(s, backward);
  if (p->plans.empty()) why_not_ = strprintf("%s B %d T %d H %d Hkv %d hd %d: %s", backward ? "backward" : "forward",
                                             s.B, s.T, s.H, s.Hkv, s.hd, p->why.c_str());
  return !p->plans.empty();
}

void* CudnnAttention::workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    // Grown between calls of one stream: the last user is done once the device is.
    if (workspace_) {
      cudaDeviceSynchronize();
      cudaFree(workspace_);
      workspace_ = nullptr;
    }
    if (cudaMalloc(&workspace_, bytes) != cudaSuccess)
      fatal("CUDA", strprintf("cannot allocate %zu bytes for cuDNN attention's workspace", bytes),
            "cudaMalloc(&workspace_, bytes)", __FILE__, __LINE__);
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

namespace {
// Executes `plan` on `stream` with the variant pack of uids -> pointers.
void execute(const Api& a, cudnnHandle_t handle, cudaStream_t stream, D plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  try {
    check(a, a.SetStream(handle, stream), "cudnnSetStream");
    Desc pack(a, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(),
             static_cast<int64_t>(pointers.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
    pack.finalize("the variant pack");
    check(a, a.Execute(handle, plan, pack.get()), "cudnnBackendExecute");
  } catch (const Refused& e) {  // after a plan was built: the device or the library is broken
    fatal("cuDNN", e.what(), "cudnnBackendExecute(handle, plan, pack)", __FILE__, __LINE__);
  }
}
}  // namespace

void CudnnAttention::forward(cudaStream_t stream, uint16_t* out16, float* lse, const uint16_t* qkv16,
                             const AttnShape& s) {
  std::string why;
  const Api& a = *cudnn_api(why);
  const Plan& p = *plan(s, false);
  Z3D_ASSERT(!p.plans.empty(), "cuDNN attention forward called for a shape it refused");
  float scale = 1.0f / std::sqrt(static_cast<float>(s.hd)), neg_inf = -INFINITY;  // the scale as our kernels take it
  const size_t H = s.H, Hkv = s.Hkv, d = s.hd;
  auto* qkv = const_cast<uint16_t*>(qkv16);
  execute(a, static_cast<cudnnHandle_t>(handle_), stream, p.plan(), {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {qkv, qkv + H * d, qkv + (H + Hkv) * d, out16, lse, &scale, &neg_inf},
          workspace(std::max<size_t>(static_cast<size_t>(p.workspace), 256)));
}

void CudnnAttention::backward(cudaStream_t stream, uint16_t* dqkv16, const uint16_t* dout16, const uint16_t* out16,
                              const float* lse, const uint16_t* qkv16, const AttnShape& s) {
  std::string why;
  const Api& a = *cudnn_api(why);
  const Plan& p = *plan(s, true);
  Z3D_ASSERT(!p.plans.empty(), "cuDNN attention backward called for a shape it refused");
  float scale = 1.0f / std::sqrt(static_cast<float>(s.hd)), neg_inf = -INFINITY, one = 1.0f;
  const size_t H = s.H, Hkv = s.Hkv, d = s.hd, sums = softmax_sum_bytes(s);
  auto* ws = static_cast<char*>(workspace(sums + static_cast<size_t>(p.workspace)));
  auto* qkv = const_cast<uint16_t*>(qkv16);
  execute(a, static_cast<cudnnHandle_t>(handle_), stream, p.plan(),
          {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kNegInf, kOne, kSoftmaxSum},
          {qkv, qkv + H * d, qkv + (H + Hkv) * d, const_cast<uint16_t*>(out16), const_cast<uint16_t*>(dout16),
           const_cast<float*>(lse), dqkv16, dqkv16 + H * d, dqkv16 + (H + Hkv) * d, &scale, &neg_inf, &one, ws},
          ws + sums);
}

std::string CudnnAttention::check_graphs(const AttnShape& s, bool& loaded, int sm) {
  std::string why;
  const Api* a = cudnn_api(why);
  loaded = a != nullptr;
  if (!a) return why;
  for (const bool backward : {false, true}) {
    const char* direction = backward ? "backward: " : "forward: ";
    if (std::string r = shape_refusal(s, backward, sm); !r.empty()) return direction + r;
    try {
      Graph g(*a);
      if (backward) backward_graph(g, s);
      else forward_graph(g, s);
      g.finalize(nullptr);
    } catch (const Refused& e) {
      return direction + std::string(e.what());
    }
  }
  return "";
}

std::string CudnnAttention::check_plans(const AttnShape& s, const std::string& device_json, bool& loaded,
                                        std::string& taken) {
  std::string why;
  const Api* a = cudnn_api(why);
  loaded = a != nullptr;
  if (!a) return why;
  // The compute capability whose limits shape_refusal applies: the JSON's deviceVer (900: sm_90).
  const size_t at = device_json.find("\"deviceVer\":");
  const int sm = at == std::string::npos ? 0 : std::atoi(device_json.c_str() + at + 12) / 10;
  taken.clear();
  try {
    Desc device(*a, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, device_json.data(),
               static_cast<int64_t>(device_json.size()));
    device.finalize("the device properties");
    std::string refused;  // both directions', so one run says all
    for (const bool backward : {false, true}) {
      const char* direction = backward ? "backward" : "forward";
      Plan p(*a);
      build(p, s, backward, sm, nullptr, device.get());
      std::string& to = p.plans.empty() ? refused : taken;
      to += strprintf("%s%s: ", to.empty() ? "" : " | ", direction);
      to += p.plans.empty() ? p.why
                            : strprintf("engine %lld, workspace %lld B", static_cast<long long>(p.engine),
                                        static_cast<long long>(p.workspace));
    }
    return refused;
  } catch (const Refused& e) {
    return e.what();
  }
}

}  // namespace zero3d
