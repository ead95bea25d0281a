// kernels/cuda/backend_cuda.cu: the CUDA backend. Thin launchers around kernels/math/*.h (the same
// per-element / per-row functions the host backend runs) plus cuBLAS for GEMM. It owns one
// non-blocking stream, one cuBLAS handle bound to it and device scratches for one op's temporaries.
// Built as a module (libzero3d_cuda.so) that kernels/cuda_module.cpp loads only where a driver
// is: the CUDA libraries cost every process 0.65 s of CPU to load, on CPU nodes for nothing.
//
// Invariants:
//  - Every op is enqueued on the backend's stream, in call order; the host waits only where it
//    needs data (copy_to_host, copy_from_host, the reductions, synchronize). The stream is
//    non-blocking, so a later communication stream must join it through events, never through the
//    legacy default stream.
//  - Results follow HostBackend: the same per-element math functions and the same += accumulation
//    into gradients. The orders of sums differ where the GPU needs parallelism: rows (LayerNorm,
//    softmax, dot products in attention) are reduced across a block or warp, column sums
//    (bias, LayerNorm parameters) in 64 chunks of rows, scalar sums as a tree in double, GEMMs as
//    cuBLAS blocks them; the embedding gradient adds its rows in the host's order. Every op is
//    deterministic: the same inputs give the same bits on every run.
//  - The interface is row-major and cuBLAS column-major: a row-major M is its transpose read
//    column-major, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with A/B and m/n swapped.
//  - The backend assumes its device is current on the calling thread (one device per rank, set in
//    the constructor); it does not call cudaSetDevice before every op.
//
// Performance: LayerNorm and the cross-entropy kernels run one block per row (coalesced loads, the
// row's reductions across the block); attention one warp per (batch, head, row), its vectors in
// the lanes' registers; column sums in chunks of rows; a linear layer's bias and residual in its
// cuBLASLt matmul's epilogue; AdamW one launch per kAdamRunsPerLaunch parameter runs. In bf16 runs
// attention goes to cuDNN's fused flash attention where cuDNN is there and takes the shape
// (kernels/cuda/cudnn_attention.h): bf16 views as they are, fp32 ones rounded to bf16 and the
// output widened again around the call; elsewhere, and in fp32 runs, the warp kernels below.
//
// Precision: activations are views (kernels/tensor.h), fp32 or bf16 storage, fp32 math. The
// elementwise, per-row and attention kernels are templates on the storage type: they read through
// load() (bf16 widened, exactly), compute in fp32 and write through store() (rounded to nearest
// even once, by math::bf16_from_float: the host's bits); an op's activation views share one type
// (a mix is a fatal error naming the op). GEMMs with bf16_gemm take bf16 operands as they are and
// round fp32 ones, accumulate in fp32 on the tensor cores and write C in its type (cuBLAS rounds a
// bf16 C); fp32 GEMMs widen bf16 operands into the scratch and round a bf16 C from an fp32 one.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <set>
#include <unordered_map>
#include <string>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cublaslt_linear.h"
#if defined(ZERO3D_HAVE_CUDNN)
#include "kernels/cuda/cudnn_attention.h"
#endif
#include "kernels/cuda/nccl_collectives.h"
#include "kernels/typed_views.h"
#include "kernels/math/adamw.h"
#include "kernels/math/crossentropy.h"
#include "kernels/math/dtype.h"
#include "kernels/math/gelu.h"
#include "kernels/math/layernorm.h"
#include "kernels/math/rope.h"
#include "kernels/math/swiglu.h"
#include "kernels/math/attention.h"
#include "core/device_collectives.h"

namespace zero3d {
namespace {

// ---- launch configuration ----

constexpr int kThreads = 256;        // threads per block for every kernel here
constexpr size_t kMaxBlocks = 65535;  // grid-stride loops cover the rest; keeps the grid small
constexpr size_t kReduceBlocks = 1024;  // at most this many partials in the scalar reductions

size_t blocks_for(size_t work, size_t cap = kMaxBlocks) {
  return std::min((work + kThreads - 1) / kThreads, cap);
}

// Grid-stride loop over [0, n): any grid size covers any n.
#define Z3D_GRID_LOOP(i, n)                                                    \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<size_t>(blockDim.x) * gridDim.x)

// Kernels and library calls enqueued by this process's CUDA backends (Backend::launch_count).
std::atomic<uint64_t> g_launches{0};

// Enqueue `kernel` on `stream` with enough blocks for `work` grid-stride iterations. A zero-sized
// grid is a launch error in CUDA, so empty work is a no-op (as the host loops are).
template <typename... KernelArgs, typename... Args>
void launch(cudaStream_t stream, size_t work, void (*kernel)(KernelArgs...), Args... args) {
  if (work == 0) return;
  ++g_launches;
  kernel<<<static_cast<unsigned>(blocks_for(work)), kThreads, 0, stream>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

// Enqueue a per-row kernel: one block of kThreads per row, rows grid-strided over at most
// kMaxBlocks blocks.
template <typename... KernelArgs, typename... Args>
void launch_rows(cudaStream_t stream, size_t rows, void (*kernel)(KernelArgs...), Args... args) {
  if (rows == 0) return;
  ++g_launches;
  kernel<<<static_cast<unsigned>(std::min(rows, kMaxBlocks)), kThreads, 0, stream>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

// ---- activation storage: the kernels below are templates on S, float or bf16 carried as its
// bits (uint16_t); they read S through load() and write it through store(), so the math stays
// fp32 and a bf16 value is rounded once, where it is written. ----

using math::load;
using math::store;

// ---- elementwise kernels ----

template <typename S>
__global__ void embedding_forward_kernel(S* out, const int32_t* tokens, const float* wte, const float* wpe,
                                         size_t N, int T, int C, int vocab_start, int vocab_rows) {
  Z3D_GRID_LOOP(i, N * C) {
    size_t n = i / C, c = i % C;
    const int row = tokens[n] - vocab_start;
    const float e = row >= 0 && row < vocab_rows ? wte[static_cast<size_t>(row) * C + c] : 0.0f;
    store(out + i, e + (wpe ? wpe[(n % T) * C + c] : 0.0f));
  }
}

// dwte: rows sharing a token would collide, so each element of dwte has one owner. Thread (part,
// c) owns column c of the vocabulary rows with row % kEmbedParts == part and walks the tokens in
// order, adding each owned row's dout: the host's order, so dwte is deterministic and equals the
// host's. kEmbedParts spreads the C columns over enough threads to fill the GPU; a warp's lanes
// share `part` (C a multiple of 32), so the branch is uniform and the token loads broadcast.
constexpr int kEmbedParts = 32;
template <typename S>
__global__ void embedding_backward_wte_kernel(float* dwte, const S* dout, const int32_t* tokens, size_t N,
                                              int C, int vocab_start, int vocab_rows) {
  Z3D_GRID_LOOP(i, static_cast<size_t>(C) * kEmbedParts) {
    const int part = static_cast<int>(i / C);
    const size_t c = i % C;
    for (size_t n = 0; n < N; ++n) {
      const int row = tokens[n] - vocab_start;
      if (row >= 0 && row < vocab_rows && row % kEmbedParts == part)
        dwte[static_cast<size_t>(row) * C + c] += load(dout + n * C + c);
    }
  }
}

// dwpe: position t collects rows t, t+T, t+2T, ...; one thread per (t, c) sums them in row order,
// as the host does, so dwpe is deterministic and matches the host.
template <typename S>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const S* dout, size_t N, int T, int C) {
  size_t positions = N < static_cast<size_t>(T) ? N : static_cast<size_t>(T);
  Z3D_GRID_LOOP(i, positions * C) {
    size_t t = i / C, c = i % C;
    float acc = dwpe[i];
    for (size_t n = t; n < N; n += T) acc += load(dout + n * C + c);
    dwpe[i] = acc;
  }
}

// A linear layer's epilogue where cuBLASLt has none: y = acc + bias + residual (either null: none),
// acc the GEMM's fp32 result (y itself when y is fp32: each element read, then written, by one
// thread), so a bf16 y is rounded once; with gelu_out also gelu_out = the GELU of that fp32 sum
// (not of the rounded y), as the host's GELU reads its fp32 GEMM output.
template <typename S>
__global__ void linear_epilogue_kernel(S* y, S* gelu_out, const float* acc, const float* bias, const S* residual,
                                       size_t N, int C) {
  Z3D_GRID_LOOP(i, N * C) {
    float v = acc[i];
    if (bias) v += bias[i % C];
    if (residual) v += load(residual + i);
    store(y + i, v);
    if (gelu_out) store(gelu_out + i, math::gelu_forward(v));
  }
}

template <typename S>
__global__ void gelu_forward_kernel(S* out, const S* x, size_t n) {
  Z3D_GRID_LOOP(i, n) store(out + i, math::gelu_forward(load(x + i)));
}

// dx may alias dout: each element is read and written by one thread.
template <typename S>
__global__ void gelu_backward_kernel(S* dx, const S* x, const S* dout, size_t n) {
  Z3D_GRID_LOOP(i, n) store(dx + i, math::gelu_backward(load(x + i), load(dout + i)));
}

__global__ void accumulate_kernel(float* out, const float* a, size_t n) {
  Z3D_GRID_LOOP(i, n) out[i] += a[i];
}

__global__ void scale_kernel(float* x, float s, size_t n) {
  Z3D_GRID_LOOP(i, n) x[i] *= s;
}

// AdamW on many runs in one launch (multi-tensor, as apex's multi_tensor_apply): a table of up to
// kAdamRunsPerLaunch runs travels by value in the kernel's parameter space, as AdamParams does (no
// device copy to manage), each run cut into chunks of kAdamChunk elements. Block b takes
// chunks b, b + gridDim.x, ... of the launch; a chunk lies within one run, found by binary search
// of first_chunk. Each element gets math::adam_element with the run's weight decay in a copy of a,
// and with p16 its updated weight rounded to 16 bits in the same pass (a mixed run's kept
// weights): per element the same computation, so the same bits, as one launch per run.
constexpr size_t kAdamRunsPerLaunch = 48;
constexpr size_t kAdamChunk = 8 * kThreads;  // elements per chunk: 8 per thread

struct AdamTable {
  AdamRun run[kAdamRunsPerLaunch];                // the first `count` are set, none empty
  size_t first_chunk[kAdamRunsPerLaunch + 1] = {};  // run r's chunks: [first_chunk[r], first_chunk[r + 1])
  int count = 0;
};
// CUDA's portable limit on a kernel's parameters is 4 KB: the table and its two companions fit.
static_assert(sizeof(AdamTable) + sizeof(math::AdamParams) + sizeof(bool) <= 4096,
              "adam_steps_kernel's parameters exceed 4 KB");

__global__ void adam_steps_kernel(AdamTable t, math::AdamParams a, bool fp16) {
  for (size_t c = blockIdx.x; c < t.first_chunk[t.count]; c += gridDim.x) {
    int lo = 0, hi = t.count - 1;  // the last run whose first chunk is <= c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (t.first_chunk[mid] <= c) lo = mid;
      else hi = mid - 1;
    }
    const AdamRun& r = t.run[lo];
    math::AdamParams ar = a;
    ar.weight_decay = r.weight_decay;
    const size_t begin = (c - t.first_chunk[lo]) * kAdamChunk, end = std::min(begin + kAdamChunk, r.n);
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      math::adam_element(r.p + i, r.m + i, r.v + i, r.g[i], ar);
      if (r.p16) r.p16[i] = fp16 ? math::fp16_from_float(r.p[i]) : math::bf16_from_float(r.p[i]);
    }
  }
}

// fp32 <-> bf16 (D and S the two storage types): the casts, and the GEMMs' operands.
template <typename D, typename S>
__global__ void convert_kernel(D* out, const S* x, size_t n) {
  Z3D_GRID_LOOP(i, n) store(out + i, load(x + i));
}
// The same on `rows` rows of `cols` at stride ld, the elements between rows untouched: a bf16 C
// around an fp32 GEMM.
template <typename D, typename S>
__global__ void convert_rows_kernel(D* out, const S* x, size_t rows, int cols, size_t ld) {
  Z3D_GRID_LOOP(e, rows * cols) {
    const size_t i = e / cols * ld + e % cols;
    store(out + i, load(x + i));
  }
}
__global__ void cast_to_fp16_kernel(uint16_t* out, const float* x, size_t n) {
  Z3D_GRID_LOOP(i, n) out[i] = math::fp16_from_float(x[i]);
}
__global__ void cast_from_fp16_kernel(float* out, const uint16_t* x, size_t n) {
  Z3D_GRID_LOOP(i, n) out[i] = math::float_from_fp16(x[i]);
}
__global__ void accumulate_bf16_kernel(uint16_t* acc, const float* x, size_t n) {
  Z3D_GRID_LOOP(i, n) acc[i] = math::bf16_from_float(math::float_from_bf16(acc[i]) + x[i]);
}
__global__ void accumulate_fp16_kernel(uint16_t* acc, const float* x, size_t n) {
  Z3D_GRID_LOOP(i, n) acc[i] = math::fp16_from_float(math::float_from_fp16(acc[i]) + x[i]);
}

// ---- per-row kernels: one block per row (rows grid-strided), the row's sums and maxima reduced
// across the block in a fixed order, so every thread gets the same value and every run the same
// bits. The per-element math is the host's; only the order of the row sums differs from it. ----

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {  // from -inf, as the host's row max: a NaN is never taken over a number
  template <typename T>
  __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

// op over the warp's v, in every lane: a butterfly (both operands of each step are the same pair
// on both lanes, so all lanes agree).
template <typename T, typename Op>
__device__ T warp_all_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// op over every thread's v, in every thread: warp_all_reduce, then the warps' values in warp
// order. blockDim.x: a multiple of 32, at most 1024.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block reductions assume full warps, at most 32");
  __shared__ T warp_values[32];
  v = warp_all_reduce(v, op);
  __syncthreads();  // the last call's readers are done with warp_values
  if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_values[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) v = op(v, warp_values[w]);
  return v;
}

#define Z3D_ROW_LOOP(n, N) for (size_t n = blockIdx.x; n < (N); n += gridDim.x)
#define Z3D_COL_LOOP(i, C) for (int i = static_cast<int>(threadIdx.x); i < (C); i += static_cast<int>(blockDim.x))

template <typename S>
__global__ void layernorm_forward_kernel(S* out, float* mean, float* rstd, const S* x, const float* w,
                                         const float* b, size_t N, int C) {
  Z3D_ROW_LOOP(n, N) {
    const S* xr = x + n * C;
    float sum = 0.0f;
    Z3D_COL_LOOP(i, C) sum += load(xr + i);
    const float m = block_all_reduce(sum, SumOp{}) / C;
    float var = 0.0f;
    Z3D_COL_LOOP(i, C) {
      const float d = load(xr + i) - m;
      var += d * d;
    }
    const float r = 1.0f / sqrtf(block_all_reduce(var, SumOp{}) / C + math::kLayerNormEps);
    Z3D_COL_LOOP(i, C) store(out + n * C + i, (load(xr + i) - m) * r * w[i] + b[i]);
    if (threadIdx.x == 0) mean[n] = m, rstd[n] = r;
  }
}

template <typename S>
__global__ void layernorm_backward_input_kernel(S* dx, const S* dy, const S* x, const float* w, const float* mean,
                                                const float* rstd, size_t N, int C) {
  Z3D_ROW_LOOP(n, N) {
    const S* xr = x + n * C;
    const S* dyr = dy + n * C;
    S* dxr = dx + n * C;
    const float m = mean[n], r = rstd[n];
    float sum_g = 0.0f, sum_gx = 0.0f;
    Z3D_COL_LOOP(i, C) {
      const float g = load(dyr + i) * w[i];
      sum_g += g;
      sum_gx += g * math::layernorm_xhat(load(xr + i), m, r);
    }
    const float mean_g = block_all_reduce(sum_g, SumOp{}) / C, mean_gx = block_all_reduce(sum_gx, SumOp{}) / C;
    Z3D_COL_LOOP(i, C) {
      const float g = load(dyr + i) * w[i];
      store(dxr + i, load(dxr + i) + r * (g - mean_g - math::layernorm_xhat(load(xr + i), m, r) * mean_gx));
    }
  }
}

// The cross-entropy kernels take logits as N rows of stride ld >= V (S: the logits' storage type,
// widened on load): columns [0, V) the vocabulary, [V, ld) padding that none of them reads; a
// gradient's padding columns are written as 0. Row offsets are size_t (N * ld may pass 2^31).
// The row's max and sum of exp(z - max): the two reductions every cross-entropy kernel starts with.
template <typename S>
__device__ float row_max_of(const S* z, int V) {
  float m = -INFINITY;
  Z3D_COL_LOOP(i, V) m = MaxOp{}(m, load(z + i));
  return block_all_reduce(m, MaxOp{});
}
template <typename S>
__device__ float row_sumexp_of(const S* z, int V, float m) {
  float sum = 0.0f;
  Z3D_COL_LOOP(i, V) sum += expf(load(z + i) - m);
  return block_all_reduce(sum, SumOp{});
}
// A gradient row's padding columns [V, ld): no gradient.
template <typename S>
__device__ void zero_padding(S* dz, int V, int ld) {
  for (int i = V + static_cast<int>(threadIdx.x); i < ld; i += static_cast<int>(blockDim.x)) store(dz + i, 0.0f);
}

// dlogits may alias logits (same storage type, fp32 or bf16): a row is read whole into its
// reductions, which end in barriers, before any of it is written; after them every element is read
// and written by one thread (a bf16 element is a whole 16-bit store, so no thread writes another's
// bytes); the only value read across threads (the target's logit) is read before the first
// reduction's barrier; the padding no thread reads.
template <typename S>
__global__ void vocab_row_max_kernel(float* row_max, const S* logits, size_t N, int V, int ld) {
  Z3D_ROW_LOOP(n, N) {
    const float m = row_max_of(logits + n * static_cast<size_t>(ld), V);
    if (threadIdx.x == 0) row_max[n] = m;
  }
}
template <typename S>
__global__ void vocab_sumexp_kernel(float* sumexp, float* target_logit, const S* logits, const float* row_max,
                                    const int32_t* targets, int vocab_start, size_t N, int V, int ld) {
  Z3D_ROW_LOOP(n, N) {
    const S* z = logits + n * static_cast<size_t>(ld);
    const float sum = row_sumexp_of(z, V, row_max[n]);
    if (threadIdx.x == 0) {
      const int t = targets[n] - vocab_start;
      sumexp[n] = sum;
      target_logit[n] = t >= 0 && t < V ? load(z + t) : 0.0f;
    }
  }
}
template <typename S>
__global__ void vocab_crossentropy_grad_kernel(S* dlogits, const S* logits, const float* row_max,
                                               const float* sumexp, const int32_t* targets, int vocab_start, size_t N,
                                               int V, int ld, float dloss) {
  Z3D_ROW_LOOP(n, N) {
    const S* z = logits + n * static_cast<size_t>(ld);
    S* dz = dlogits + n * static_cast<size_t>(ld);
    const int t = targets[n] - vocab_start;
    const float m = row_max[n], scale = dloss / sumexp[n];
    Z3D_COL_LOOP(i, V) {
      float g = expf(load(z + i) - m) * scale;
      if (i == t) g -= dloss;
      store(dz + i, g);
    }
    zero_padding(dz, V, ld);
  }
}

template <typename S>
__global__ void crossentropy_kernel(float* losses, S* dlogits, const S* logits, const int32_t* targets, size_t N,
                                    int V, int ld, float dloss) {
  Z3D_ROW_LOOP(n, N) {
    const S* z = logits + n * static_cast<size_t>(ld);
    const int t = targets[n];
    const float z_target = load(z + t);
    const float m = row_max_of(z, V), sum = row_sumexp_of(z, V, m);
    if (threadIdx.x == 0) losses[n] = logf(sum) + (m - z_target);
    if (!dlogits) continue;
    S* dz = dlogits + n * static_cast<size_t>(ld);
    const float scale = dloss / sum;
    Z3D_COL_LOOP(i, V) {
      float g = expf(load(z + i) - m) * scale;
      if (i == t) g -= dloss;
      store(dz + i, g);
    }
    zero_padding(dz, V, ld);
  }
}

// ---- attention: one warp per (batch, head, row), lane l holding dimensions l, l+32, ... of the
// row's vectors in registers (K per lane: head dims up to 32 K); the dot products are the lanes'
// partials added by a butterfly, so every lane has the same value. The math of
// kernels/math/attention.h, the same online softmax; only the dot products' order differs. ----

template <int K, typename S>
__device__ void lane_load(float (&a)[K], const S* src, int hd) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k) a[k] = lane + 32 * k < hd ? load(src + lane + 32 * k) : 0.0f;
}
template <int K, typename S>
__device__ void lane_store(S* dst, const float (&a)[K], int hd) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < hd) store(dst + lane + 32 * k, a[k]);
}
// a . b over hd, in every lane (b in memory; a's lanes past hd hold 0).
template <int K, typename S>
__device__ float lane_dot(const float (&a)[K], const S* b, int hd) {
  const int lane = threadIdx.x % 32;
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < hd) s += a[k] * load(b + lane + 32 * k);
  return warp_all_reduce(s, SumOp{});
}
// a . b over hd, both in memory, in every lane.
template <typename S>
__device__ float memory_dot(const S* a, const S* b, int hd) {
  float s = 0.0f;
  for (int d = threadIdx.x % 32; d < hd; d += 32) s += load(a + d) * load(b + d);
  return warp_all_reduce(s, SumOp{});
}
// acc += f * b over the lane's dimensions.
template <int K, typename S>
__device__ void lane_axpy(float (&acc)[K], float f, const S* b, int hd) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < hd) acc[k] += f * load(b + lane + 32 * k);
}

// Warp-uniform loop over [0, n) by warp index (a block's warps, grid-strided).
#define Z3D_WARP_LOOP(r, n)                                                                       \
  for (size_t r = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < (n); \
       r += static_cast<size_t>(gridDim.x) * blockDim.x / 32)

// Where a (batch, head)'s rows start in packed [q (H heads) | k (Hkv) | v (Hkv)] rows of stride ld:
// query head h reads key/value head h / (H / Hkv).
template <typename S>
struct AttnHead {
  const S *q, *k, *v;
};
template <typename S>
__device__ AttnHead<S> attn_head(const S* qkv, size_t b, size_t h, int T, int H, int Hkv, int A, size_t ld) {
  const int hd = A / H;
  const size_t kvh = h / (H / Hkv);
  const S* rows = qkv + b * T * ld;
  return {rows + h * hd, rows + A + kvh * hd, rows + A + (Hkv + kvh) * hd};
}

template <int K, typename S>
__global__ void attention_forward_warp_kernel(S* out, float* lse, const S* qkv, size_t B, int T, int H, int Hkv,
                                              int A) {
  const int hd = A / H;
  const float alpha = 1.0f / sqrtf(static_cast<float>(hd));  // as the host computes it
  const size_t ld = A + 2 * static_cast<size_t>(Hkv) * hd;
  Z3D_WARP_LOOP(r, B * H * T) {
    const size_t b = r / (static_cast<size_t>(H) * T), h = r / T % H;
    const int i = static_cast<int>(r % T);
    const AttnHead<S> x = attn_head(qkv, b, h, T, H, Hkv, A, ld);
    float q[K], o[K];
    lane_load<K>(q, x.q + i * ld, hd);
#pragma unroll
    for (int k = 0; k < K; ++k) o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= i; ++j) {
      const float sc = alpha * lane_dot<K>(q, x.k + j * ld, hd);
      const float mn = sc > m ? sc : m;
      const float corr = expf(m - mn), p = expf(sc - mn);
      l = l * corr + p;
#pragma unroll
      for (int k = 0; k < K; ++k) o[k] *= corr;
      lane_axpy<K>(o, p, x.v + j * ld, hd);
      m = mn;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) o[k] /= l;
    lane_store<K>(out + (b * T + i) * A + h * hd, o, hd);
    if (threadIdx.x % 32 == 0) lse[r] = m + logf(l);
  }
}

// delta (indexed as lse) = dout_i . out_i per (batch, head, row): D_i of kernels/math/attention.h,
// which the backward reads once per query row instead of recomputing it for every key row.
template <typename S>
__global__ void attention_delta_kernel(float* delta, const S* dout, const S* out, size_t B, int T, int H, int A) {
  const int hd = A / H;
  Z3D_WARP_LOOP(r, B * H * T) {
    const size_t b = r / (static_cast<size_t>(H) * T), h = r / T % H, i = r % T;
    const float d = memory_dot(dout + (b * T + i) * A + h * hd, out + (b * T + i) * A + h * hd, hd);
    if (threadIdx.x % 32 == 0) delta[r] = d;
  }
}

// Row i's dq, all written; and, in the warp of the first query head of each group, dk and dv of
// key row i summed over the group's query heads in head order.
template <int K, typename S>
__global__ void attention_backward_warp_kernel(S* dqkv, const S* dout, const float* delta, const float* lse,
                                               const S* qkv, size_t B, int T, int H, int Hkv, int A) {
  const int hd = A / H, G = H / Hkv;
  const float alpha = 1.0f / sqrtf(static_cast<float>(hd));
  const size_t ld = A + 2 * static_cast<size_t>(Hkv) * hd;
  Z3D_WARP_LOOP(r, B * H * T) {
    const size_t b = r / (static_cast<size_t>(H) * T), h = r / T % H;
    const int i = static_cast<int>(r % T);
    const AttnHead<S> x = attn_head(qkv, b, h, T, H, Hkv, A, ld);
    S* d = dqkv + b * T * ld + i * ld;
    // dq_i over keys j <= i
    {
      const S* g_rows = dout + b * T * A + h * hd;
      float q[K], g[K], acc[K];
      lane_load<K>(q, x.q + i * ld, hd);
      lane_load<K>(g, g_rows + i * A, hd);
      const float Di = delta[(b * H + h) * T + i], lse_i = lse[(b * H + h) * T + i];
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] = 0.0f;
      for (int j = 0; j <= i; ++j) {
        const S* kj = x.k + j * ld;
        const float p = expf(alpha * lane_dot<K>(q, kj, hd) - lse_i);
        const float ds = p * (lane_dot<K>(g, x.v + j * ld, hd) - Di);
        lane_axpy<K>(acc, alpha * ds, kj, hd);
      }
      lane_store<K>(d + h * hd, acc, hd);
    }
    if (h % G != 0) continue;
    // dk_i and dv_i over queries i2 >= i of every query head hq of the group
    float kr[K], vr[K], dk[K], dv[K];
    lane_load<K>(kr, x.k + i * ld, hd);
    lane_load<K>(vr, x.v + i * ld, hd);
#pragma unroll
    for (int k = 0; k < K; ++k) dk[k] = dv[k] = 0.0f;
    for (size_t hq = h; hq < h + G; ++hq) {
      const S* q_rows = qkv + b * T * ld + hq * hd;
      const S* g_rows = dout + b * T * A + hq * hd;
      const float* row_lse = lse + (b * H + hq) * T;
      const float* row_delta = delta + (b * H + hq) * T;
      for (int i2 = i; i2 < T; ++i2) {
        const S* q2 = q_rows + i2 * ld;
        const S* g2 = g_rows + i2 * A;
        const float p = expf(alpha * lane_dot<K>(kr, q2, hd) - row_lse[i2]);
        const float ds = p * (lane_dot<K>(vr, g2, hd) - row_delta[i2]);
        lane_axpy<K>(dv, p, g2, hd);
        lane_axpy<K>(dk, alpha * ds, q2, hd);
      }
    }
    lane_store<K>(d + (x.k - x.q) + h * hd, dk, hd);
    lane_store<K>(d + (x.v - x.q) + h * hd, dv, hd);
  }
}

// Attention, fallback for heads wider than 256: one thread per (batch, head, row); see
// kernels/math/attention.h, whose row functions take fp32 rows (and accumulate in out): bf16 views
// are widened into the scratch around them.
__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, size_t B, int T, int H, int Hkv,
                                         int A) {
  const int hd = A / H;
  const float alpha = 1.0f / sqrtf(static_cast<float>(hd));  // as the host (rsqrtf is approximate)
  const size_t ld = A + 2 * static_cast<size_t>(Hkv) * hd;
  Z3D_GRID_LOOP(r, B * H * T) {
    const size_t b = r / (static_cast<size_t>(H) * T), h = r / T % H;
    const int i = static_cast<int>(r % T);
    const AttnHead<float> x = attn_head(qkv, b, h, T, H, Hkv, A, ld);
    lse[r] = math::attention_row_forward(out + (b * T + i) * A + h * hd, x.q, x.k, x.v, ld, i, hd, alpha);
  }
}
__global__ void attention_backward_kernel(float* dqkv, const float* dout, const float* out, const float* lse,
                                          const float* qkv, size_t B, int T, int H, int Hkv, int A) {
  const int hd = A / H, G = H / Hkv;
  const float alpha = 1.0f / sqrtf(static_cast<float>(hd));  // as the host (rsqrtf is approximate)
  const size_t ld = A + 2 * static_cast<size_t>(Hkv) * hd;
  Z3D_GRID_LOOP(r, B * H * T) {
    const size_t b = r / (static_cast<size_t>(H) * T), h = r / T % H;
    const int i = static_cast<int>(r % T);
    const AttnHead<float> x = attn_head(qkv, b, h, T, H, Hkv, A, ld);
    const size_t obase = b * T * A + h * hd;
    float* g = dqkv + b * T * ld + static_cast<size_t>(i) * ld;
    math::attention_row_backward_q(g + h * hd, x.q, x.k, x.v, ld, dout + obase, out + obase, A,
                                   lse + (b * H + h) * T, i, hd, alpha);
    if (h % G != 0) continue;
    float *dk = g + (x.k - x.q) + h * hd, *dv = g + (x.v - x.q) + h * hd;
    for (int d = 0; d < hd; ++d) dk[d] = dv[d] = 0.0f;
    for (size_t hq = h; hq < h + G; ++hq) {
      const size_t ob = b * T * A + hq * hd;
      math::attention_row_backward_kv(dk, dv, qkv + b * T * ld + hq * hd, x.k, x.v, ld, dout + ob, out + ob, A,
                                      lse + (b * H + hq) * T, i, T, hd, alpha);
    }
  }
}

// ---- the Llama family: RMSNorm one block per row (as LayerNorm), RoPE and SwiGLU elementwise ----

template <typename S>
__global__ void rmsnorm_forward_kernel(S* out, float* rstd, const S* x, const float* w, size_t N, int C, float eps) {
  Z3D_ROW_LOOP(n, N) {
    const S* xr = x + n * C;
    float ss = 0.0f;
    Z3D_COL_LOOP(i, C) {
      const float v = load(xr + i);
      ss += v * v;
    }
    const float r = 1.0f / sqrtf(block_all_reduce(ss, SumOp{}) / C + eps);
    Z3D_COL_LOOP(i, C) store(out + n * C + i, load(xr + i) * r * w[i]);
    if (threadIdx.x == 0) rstd[n] = r;
  }
}

template <typename S>
__global__ void rmsnorm_backward_input_kernel(S* dx, const S* dy, const S* x, const float* w, const float* rstd,
                                              size_t N, int C) {
  Z3D_ROW_LOOP(n, N) {
    const S* xr = x + n * C;
    const S* dyr = dy + n * C;
    S* dxr = dx + n * C;
    const float r = rstd[n];
    float sum_gx = 0.0f;
    Z3D_COL_LOOP(i, C) sum_gx += load(dyr + i) * w[i] * (load(xr + i) * r);
    const float mean_gx = block_all_reduce(sum_gx, SumOp{}) / C;
    Z3D_COL_LOOP(i, C) store(dxr + i, load(dxr + i) + r * (load(dyr + i) * w[i] - load(xr + i) * r * mean_gx));
  }
}

// In place: each pair is read and written by one thread (math::rope_pair_stored).
template <typename S>
__global__ void rope_kernel(S* x, const float* cs, size_t N, int T, int heads, int hd, long ld, bool backward) {
  const int half = hd / 2;
  Z3D_GRID_LOOP(e, N * heads * half) {
    const size_t n = e / (static_cast<size_t>(heads) * half), h = e / half % heads;
    const int i = static_cast<int>(e % half);
    math::rope_pair_stored(x + n * ld + h * hd, half, i, cs + 2 * ((n % T) * half + i), backward);
  }
}

template <typename S>
__global__ void swiglu_forward_kernel(S* out, const S* h, size_t N, int F) {
  Z3D_GRID_LOOP(e, N * F) {
    const size_t n = e / F, c = e % F;
    store(out + e, math::swiglu_forward(load(h + 2 * n * F + c), load(h + 2 * n * F + F + c)));
  }
}

template <typename S>
__global__ void swiglu_backward_kernel(S* dh, const S* h, const S* dout, size_t N, int F) {
  Z3D_GRID_LOOP(e, N * F) {
    const size_t n = e / F, c = e % F;
    float dgate, dup;
    math::swiglu_backward(&dgate, &dup, load(h + 2 * n * F + c), load(h + 2 * n * F + F + c), load(dout + e));
    store(dh + 2 * n * F + c, dgate);
    store(dh + 2 * n * F + F + c, dup);
  }
}

// ---- column reductions (bias and LayerNorm parameter gradients) in two passes: chunk r of the
// rows adds its rows in order into partial (r, c), one thread per (r, c); then out[c] += the
// chunks' partials in chunk order. Deterministic; the rows meet in another order than on the host
// (which adds them one by one into out). kColumnChunks chunks make C * kColumnChunks threads. ----

constexpr size_t kColumnChunks = 64;

template <typename S>
__global__ void layernorm_params_partials_kernel(float* pw, float* pb, const S* dy, const S* x, const float* mean,
                                                 const float* rstd, size_t N, int C) {
  Z3D_GRID_LOOP(i, kColumnChunks * C) {
    const size_t c = i % C, r = i / C;
    float w_acc = 0.0f, b_acc = 0.0f;
    for (size_t n = r * N / kColumnChunks; n < (r + 1) * N / kColumnChunks; ++n) {
      const float d = load(dy + n * C + c);
      w_acc += d * math::layernorm_xhat(load(x + n * C + c), mean[n], rstd[n]);
      b_acc += d;
    }
    pw[i] = w_acc;
    pb[i] = b_acc;
  }
}

template <typename S>
__global__ void rmsnorm_params_partials_kernel(float* pw, const S* dy, const S* x, const float* rstd, size_t N, int C) {
  Z3D_GRID_LOOP(i, kColumnChunks * C) {
    const size_t c = i % C, r = i / C;
    float w_acc = 0.0f;
    for (size_t n = r * N / kColumnChunks; n < (r + 1) * N / kColumnChunks; ++n)
      w_acc += load(dy + n * C + c) * (load(x + n * C + c) * rstd[n]);
    pw[i] = w_acc;
  }
}

// A bias gradient's terms: the elements of dout, or the GELU's input gradient recomputed from x and
// dout (gelu_backward's bias: the fp32 dx, as the host sums it, read before dx overwrites dout).
template <typename S>
struct Element {
  const S* p;
  __device__ float operator()(size_t i) const { return load(p + i); }
};
template <typename S>
struct GeluGrad {
  const S *x, *dout;
  __device__ float operator()(size_t i) const { return math::gelu_backward(load(x + i), load(dout + i)); }
};

template <typename Term>
__global__ void bias_partials_kernel(float* pb, Term term, size_t N, int C) {
  Z3D_GRID_LOOP(i, kColumnChunks * C) {
    const size_t c = i % C, r = i / C;
    float acc = 0.0f;
    for (size_t n = r * N / kColumnChunks; n < (r + 1) * N / kColumnChunks; ++n) acc += term(n * C + c);
    pb[i] = acc;
  }
}

__global__ void column_finish_kernel(float* out, const float* partial, int C) {
  Z3D_GRID_LOOP(c, static_cast<size_t>(C)) {
    float acc = out[c];
    for (size_t r = 0; r < kColumnChunks; ++r) acc += partial[r * C + c];
    out[c] = acc;
  }
}

// ---- scalar reductions: per-thread partials reduced across each block (block_all_reduce); each
// block writes its partial, and one block adds the partials in a fixed order: deterministic (no
// atomics), the same bits on every run for the same n ----

struct SquareOf {
  __device__ double operator()(float v) const { return static_cast<double>(v) * v; }
};

template <typename Acc, typename Term>
__global__ void reduce_partials_kernel(Acc* partials, const float* x, size_t n, Term term) {
  Acc acc = 0;
  Z3D_GRID_LOOP(i, n) acc += term(x[i]);
  acc = block_all_reduce(acc, SumOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

template <typename Acc>
__global__ void reduce_final_kernel(Acc* out, const Acc* partials, unsigned count) {  // one block
  Acc acc = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_all_reduce(acc, SumOp{});
  if (threadIdx.x == 0) *out = acc;
}

// ---- owners of the CUDA and cuBLAS handles (move-only via unique_ptr). Destructors do not check
// status: they may run during unwinding or after MPI_Finalize, where fatal() cannot help, and a
// broken device would already have failed the last checked call. ----

struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct CublasDestroy {
  void operator()(cublasHandle_t h) const { cublasDestroy(h); }
};
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using CublasPtr = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDestroy>;
using DevicePtr = std::unique_ptr<void, DeviceFree>;

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The seam's views as the kernels take them: with_storage, ptr, storage (kernels/typed_views.h).

class CudaBackend final : public Backend, public DeviceMemory {
 public:
  // The device is made current first (device_'s initializer), before any member is built: lt_'s
  // cuBLASLt handle is tied to the device current at its creation.
  CudaBackend(int device, bool bf16_gemm) : device_(current_device(device)), bf16_gemm_(bf16_gemm) {
    CUDA_CHECK(cudaGetDeviceProperties(&prop_, device));
    // Non-blocking: no implicit joins with the legacy default stream, so NCCL or copy streams
    // overlap with compute and are joined only by explicit events.
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_.reset(stream);
    cublasHandle_t handle = nullptr;
    CUBLAS_CHECK(cublasCreate(&handle));
    cublas_.reset(handle);
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    // Plain fp32 GEMMs (no TF32 tensor cores), so results compare with the host's CBLAS at fp32
    // tolerances. A TF32/bf16 mode would be an explicit option, not a default.
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    attention_ = "the backend's warp kernels (fp32 runs compute attention in fp32)";
#if defined(ZERO3D_HAVE_CUDNN)
    if (bf16_gemm_) {
      std::string why;
      cudnn_ = CudnnAttention::load(10 * prop_.major + prop_.minor, why);
      attention_ = cudnn_ ? cudnn_->describe() + "; the warp kernels for shapes it refuses"
                          : "the backend's warp kernels (no cuDNN: " + why + ")";
    }
#else
    if (bf16_gemm_) attention_ = "the backend's warp kernels (built without cuDNN's headers)";
#endif
  }
  ~CudaBackend() override {
    if (stream_) cudaStreamSynchronize(stream_.get());  // let queued work finish before handles go
  }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  BackendKind kind() const override { return BackendKind::cuda; }
  MemKind memory_kind() const override { return MemKind::device; }
  DeviceMemory* device_memory() override { return this; }
  bool bf16_gemm() const override { return bf16_gemm_; }
  uint64_t launch_count() const override { return g_launches.load(); }
  std::string describe_gemm() const override {
    return bf16_gemm_ ? "cuBLAS, bf16 inputs (rounded to nearest even) on the tensor cores, fp32 accumulation"
                      : "cuBLAS fp32";
  }
  size_t alloc_count() const override { return allocs_; }
  std::string describe() const override {
    return strprintf("cuda device %d (%s, sm_%d%d, %d SMs, %.1f GiB) + cuBLAS; attention: %s", device_, prop_.name,
                     prop_.major, prop_.minor, prop_.multiProcessorCount,
                     static_cast<double>(prop_.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), attention_.c_str());
  }

  // ---- memory ----

  // Out of device memory is a sizing mistake (model/batch too large for the GPU), reported like the
  // host backend's out-of-RAM: a UserError naming the request and what the device has free.
  void* alloc_bytes(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it so the next checked call does not report it
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw UserError(strprintf("out of GPU memory on device %d allocating %zu bytes (%zu of %zu bytes free)",
                                device_, bytes, free_b, total_b));
    }
    CUDA_CHECK(err);
    // Zeroed as the contract says; synchronised so the memory is ready for any stream (NCCL's).
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    ++allocs_;
    held_[p] = bytes;
    tally_.add(bytes);
    return p;
  }
  // cudaFree waits for the device, so kernels still queued on the pointer finish first.
  void free_bytes(void* p) override {
    CUDA_CHECK(cudaFree(p));
    if (auto it = held_.find(p); it != held_.end()) tally_.live -= it->second, held_.erase(it);
  }
  uint64_t device_peak_bytes() const override { return tally_.peak; }

  // Synchronous: the caller may reuse or free `src` as soon as this returns, and with pinned memory
  // an async copy would still be reading it.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  // Device to device, asynchronous. The host backend uses memmove, and cudaMemcpy leaves
  // overlapping ranges undefined, so overlap goes through a stream-ordered temporary.
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    bool overlap = d < s + bytes && s < d + bytes;
    if (!overlap) {
      CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
      return;
    }
    void* tmp = nullptr;
    CUDA_CHECK(cudaMallocAsync(&tmp, bytes, stream()));
    CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream()));
    CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, stream()));
    CUDA_CHECK(cudaFreeAsync(tmp, stream()));
  }
  void zero(void* p, size_t bytes) override { CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream())); }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream())); }

  // ---- DeviceMemory: what a comm group stages device buffers with (core/mem.h) ----
  // Both copies are stream-ordered after the queued compute and synchronous, as copy_* above.
  void to_host(void* dst, const void* src, size_t bytes) override { copy_to_host(dst, src, bytes); }
  void to_device(void* dst, const void* src, size_t bytes) override { copy_from_host(dst, src, bytes); }
  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
  void free_pinned(void* p) override { CUDA_CHECK(cudaFreeHost(p)); }
  void use_on_this_thread() override { CUDA_CHECK(cudaSetDevice(device_)); }
  // NCCL where the build has it (kernels/cuda/nccl_collectives.h), else null: staged.
  std::unique_ptr<DeviceCollectives> make_collectives(int size, int rank, const std::string& name,
                                                      bool point_to_point, const Share& share) override {
    return make_nccl_collectives(stream(), size, rank, name, point_to_point, share);
  }

  // ---- GEMM (row-major interface on column-major cuBLAS: see the header) ----

  // bf16_gemm: bf16 operands as they are, fp32 ones rounded to bf16 here (to nearest even, as the
  // host rounds), multiplied on the tensor cores with fp32 accumulation into C of its type, as the
  // host's bf16 GEMMs do. (cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF would skip the copies but promises
  // neither the rounding nor the tensor cores.) fp32 GEMMs take bf16 operands widened (exactly), and
  // a bf16 C through an fp32 one in the accumulator scratch (widened first where beta reads it),
  // rounded once.
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, ConstView A, int lda, GemmWeight B, int ldb,
            float beta, View C, int ldc) override {
    const size_t na = strided_extent(ta ? k : m, ta ? m : k, lda), nb = strided_extent(tb ? n : k, tb ? k : n, ldb);
    const size_t nc = strided_extent(m, n, ldc);
    storage("gemm", {{A, na}});  // A and C each of either type
    storage("gemm", {{C, nc}});
    if (m <= 0 || n <= 0) return;
    const auto [a, b] = gemm_operands(A, na, B, nb);
    if (bf16_gemm_) {
      ++g_launches;
      CUBLAS_CHECK(cublasGemmEx(cublas(), op(tb), op(ta), n, m, k, &alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda,
                                &beta, C.data, C.bf16() ? CUDA_R_16BF : CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
      return;
    }
    float* c = C.bf16() ? acc_scratch(nc) : C.f32_data();
    if (C.bf16() && beta != 0.0f)
      launch(stream(), rows(m) * n, convert_rows_kernel<float, uint16_t>, c, C.bf16_data(), rows(m), n, rows(ldc));
    ++g_launches;
    CUBLAS_CHECK(cublasSgemm(cublas(), op(tb), op(ta), n, m, k, &alpha, static_cast<const float*>(b), ldb,
                             static_cast<const float*>(a), lda, &beta, c, ldc));
    if (C.bf16())
      launch(stream(), rows(m) * n, convert_rows_kernel<uint16_t, float>, C.bf16_data(), static_cast<const float*>(c),
             rows(m), n, rows(ldc));
  }
  // One cuBLASLt matmul with the bias in its epilogue and the residual as beta * C
  // (kernels/cuda/cublaslt_linear.h); where cuBLASLt has no algorithm, the GEMM into fp32 (y itself,
  // or the accumulator scratch for a bf16 y) and one pass adding bias and residual, rounding once.
  void linear_forward(View y, ConstView x, GemmWeight w, const float* bias, ConstView residual, int N, int in,
                      int out) override {
    const size_t nx = rows(N) * rows(in), ny = rows(N) * rows(out);
    storage("linear_forward", {{x, nx}});  // x of either type
    const DType t = storage("linear_forward", {{y, ny}, {residual, ny}});
    const auto [xa, wa] = gemm_operands(x, nx, w, rows(out) * rows(in));
    if (lt_.forward(stream(), y, xa, wa, bf16_gemm_, bias, residual, N, in, out)) return static_cast<void>(++g_launches);
    unfused_linear(t, y, nullptr, x, w, bias, residual, N, in, out);
  }

  // ---- elementwise / per-row ops: the kernels instantiated for the views' storage type ----

  void embedding_forward(View out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    with_storage(storage("embedding_forward", {{out, rows(N) * rows(C)}}), [&]<typename S>() {
      launch(stream(), rows(N) * C, embedding_forward_kernel<S>, ptr<S>(out), tokens, wte, wpe, rows(N), T, C,
             vocab_start, vocab_rows);
    });
  }
  void embedding_backward(float* dwte, float* dwpe, ConstView dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    with_storage(storage("embedding_backward", {{dout, rows(N) * rows(C)}}), [&]<typename S>() {
      launch(stream(), static_cast<size_t>(C) * kEmbedParts, embedding_backward_wte_kernel<S>, dwte, ptr<S>(dout),
             tokens, rows(N), C, vocab_start, vocab_rows);
      if (dwpe)
        launch(stream(), std::min(rows(N), rows(T)) * C, embedding_backward_wpe_kernel<S>, dwpe, ptr<S>(dout), rows(N),
               T, C);
    });
  }
  void layernorm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b, int N,
                         int C) override {
    const size_t n = rows(N) * rows(C);
    with_storage(storage("layernorm_forward", {{out, n}, {x, n}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), layernorm_forward_kernel<S>, ptr<S>(out), mean, rstd, ptr<S>(x), w, b, rows(N), C);
    });
  }
  void layernorm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w, const float* mean,
                          const float* rstd, int N, int C) override {
    const size_t n = rows(N) * rows(C);
    const DType t = storage("layernorm_backward", {{dx, n}, {dy, n}, {x, n}});
    auto* pw = static_cast<float*>(stream_scratch(2 * kColumnChunks * rows(C) * sizeof(float)));
    float* pb = pw + kColumnChunks * rows(C);
    with_storage(t, [&]<typename S>() {
      launch_rows(stream(), rows(N), layernorm_backward_input_kernel<S>, ptr<S>(dx), ptr<S>(dy), ptr<S>(x), w, mean,
                  rstd, rows(N), C);
      launch(stream(), kColumnChunks * rows(C), layernorm_params_partials_kernel<S>, pw, pb, ptr<S>(dy), ptr<S>(x),
             mean, rstd, rows(N), C);
    });
    launch(stream(), rows(C), column_finish_kernel, dw, static_cast<const float*>(pw), C);
    launch(stream(), rows(C), column_finish_kernel, db, static_cast<const float*>(pb), C);
  }
  void bias_backward(float* dbias, ConstView dout, int N, int C) override {
    with_storage(storage("bias_backward", {{dout, rows(N) * rows(C)}}),
                 [&]<typename S>() { column_sums(dbias, Element<S>{ptr<S>(dout)}, N, C); });
  }
  // One cuBLASLt matmul with bias and GELU in its epilogue, the pre-activation as its auxiliary
  // output (out and pre of one type); where cuBLASLt offers no algorithm, the GEMM into fp32 (pre
  // itself, or the accumulator scratch for bf16) and one pass writing pre and the GELU of the fp32
  // sum (not of the rounded pre: the contract's, and the host's, order).
  void linear_gelu_forward(View out, View pre, ConstView x, GemmWeight w, const float* bias, int N, int in,
                           int F) override {
    const size_t nx = rows(N) * rows(in), n = rows(N) * rows(F);
    storage("linear_gelu_forward", {{x, nx}});  // x of either type
    const DType t = storage("linear_gelu_forward", {{out, n}, {pre, n}});
    const auto [xa, wa] = gemm_operands(x, nx, w, rows(F) * rows(in));
    if (lt_.forward(stream(), out, xa, wa, bf16_gemm_, bias, nullptr, N, in, F, pre))
      return static_cast<void>(++g_launches);
    unfused_linear(t, pre, out, x, w, bias, {}, N, in, F);
  }
  void gelu_forward(View out, ConstView x, size_t n) override {
    with_storage(storage("gelu_forward", {{out, n}, {x, n}}), [&]<typename S>() {
      launch(stream(), n, gelu_forward_kernel<S>, ptr<S>(out), ptr<S>(x), n);
    });
  }
  // The bias gradient first: its terms recompute dx in fp32 from x and dout, which dx may overwrite.
  void gelu_backward(View dx, float* dbias, ConstView x, ConstView y, ConstView dout, int N, int C) override {
    const size_t n = rows(N) * rows(C);
    with_storage(storage("gelu_backward", {{dx, n}, {x, n}, {y, n}, {dout, n}}), [&]<typename S>() {
      if (dbias) column_sums(dbias, GeluGrad<S>{ptr<S>(x), ptr<S>(dout)}, N, C);
      launch(stream(), n, gelu_backward_kernel<S>, ptr<S>(dx), ptr<S>(x), ptr<S>(dout), n);
    });
  }
  void accumulate(float* out, const float* a, size_t n) override { launch(stream(), n, accumulate_kernel, out, a, n); }
  // One warp per row for heads up to 256 wide (K registers per lane per vector), else the fallback.
  void attention_forward(View out, float* lse, ConstView qkv, int B, int T, int H, int Hkv, int A) override {
    const size_t n = rows(B) * H * T, hd = rows(A / H), warps = 32 * n;
    const size_t nqkv = rows(B) * T * (A + 2 * rows(Hkv) * hd), nout = rows(B) * T * A;
    const DType t = storage("attention_forward", {{out, nout}, {qkv, nqkv}});
#if defined(ZERO3D_HAVE_CUDNN)
    // cuDNN reads and writes bf16: bf16 views as they are (16-byte aligned, as it needs), fp32 ones
    // rounded into the scratch and the output widened back; lse it takes as it is in either case.
    if (const AttnShape s{B, T, H, Hkv, A / H};
        aligned({lse}) && (t == DType::f32 || aligned({out.data, qkv.data})) && use_cudnn(s, false)) {
      ++g_launches;
      if (t == DType::bf16) return cudnn_->forward(stream(), out.bf16_data(), lse, qkv.bf16_data(), s);
      uint16_t* qkv16 = scratch_of<uint16_t>({nqkv, nout})[0];
      uint16_t* out16 = qkv16 + padded(nqkv);
      launch(stream(), nqkv, convert_kernel<uint16_t, float>, qkv16, qkv.f32_data(), nqkv);
      cudnn_->forward(stream(), out16, lse, qkv16, s);
      launch(stream(), nout, convert_kernel<float, uint16_t>, out.f32_data(), static_cast<const uint16_t*>(out16), nout);
      return;
    }
#endif
    if (hd > 256) {
      if (t == DType::f32)
        return launch(stream(), n, attention_forward_kernel, out.f32_data(), lse, qkv.f32_data(), rows(B), T, H, Hkv, A);
      const std::array<float*, 4> f = scratch_of<float>({nqkv, nout});
      launch(stream(), nqkv, convert_kernel<float, uint16_t>, f[0], qkv.bf16_data(), nqkv);
      launch(stream(), n, attention_forward_kernel, f[1], lse, static_cast<const float*>(f[0]), rows(B), T, H, Hkv, A);
      launch(stream(), nout, convert_kernel<uint16_t, float>, out.bf16_data(), static_cast<const float*>(f[1]), nout);
      return;
    }
    with_storage(t, [&]<typename S>() {
      auto args = [&](auto kernel) { launch(stream(), warps, kernel, ptr<S>(out), lse, ptr<S>(qkv), rows(B), T, H, Hkv, A); };
      if (hd <= 32) args(attention_forward_warp_kernel<1, S>);
      else if (hd <= 64) args(attention_forward_warp_kernel<2, S>);
      else if (hd <= 128) args(attention_forward_warp_kernel<4, S>);
      else args(attention_forward_warp_kernel<8, S>);
    });
  }
  void attention_backward(View dqkv, ConstView dout, ConstView out, const float* lse, ConstView qkv, int B, int T,
                          int H, int Hkv, int A) override {
    const size_t n = rows(B) * H * T, hd = rows(A / H), warps = 32 * n;
    const size_t nqkv = rows(B) * T * (A + 2 * rows(Hkv) * hd), nout = rows(B) * T * A;
    const DType t = storage("attention_backward", {{dqkv, nqkv}, {dout, nout}, {out, nout}, {qkv, nqkv}});
#if defined(ZERO3D_HAVE_CUDNN)
    if (const AttnShape s{B, T, H, Hkv, A / H};
        aligned({lse}) && (t == DType::f32 || aligned({dqkv.data, dout.data, out.data, qkv.data})) &&
        use_cudnn(s, true)) {
      ++g_launches;
      if (t == DType::bf16)
        return cudnn_->backward(stream(), dqkv.bf16_data(), dout.bf16_data(), out.bf16_data(), lse, qkv.bf16_data(), s);
      // out rounds to the forward's bf16 output again, bit for bit (it was widened from it).
      const std::array<uint16_t*, 4> b = scratch_of<uint16_t>({nqkv, nout, nout, nqkv});
      launch(stream(), nqkv, convert_kernel<uint16_t, float>, b[0], qkv.f32_data(), nqkv);
      launch(stream(), nout, convert_kernel<uint16_t, float>, b[1], out.f32_data(), nout);
      launch(stream(), nout, convert_kernel<uint16_t, float>, b[2], dout.f32_data(), nout);
      cudnn_->backward(stream(), b[3], b[2], b[1], lse, b[0], s);
      launch(stream(), nqkv, convert_kernel<float, uint16_t>, dqkv.f32_data(), static_cast<const uint16_t*>(b[3]), nqkv);
      return;
    }
#endif
    if (hd > 256) {
      if (t == DType::f32)
        return launch(stream(), n, attention_backward_kernel, dqkv.f32_data(), dout.f32_data(), out.f32_data(), lse,
                      qkv.f32_data(), rows(B), T, H, Hkv, A);
      const std::array<float*, 4> f = scratch_of<float>({nqkv, nout, nout, nqkv});
      launch(stream(), nqkv, convert_kernel<float, uint16_t>, f[0], qkv.bf16_data(), nqkv);
      launch(stream(), nout, convert_kernel<float, uint16_t>, f[1], out.bf16_data(), nout);
      launch(stream(), nout, convert_kernel<float, uint16_t>, f[2], dout.bf16_data(), nout);
      launch(stream(), n, attention_backward_kernel, f[3], static_cast<const float*>(f[2]),
             static_cast<const float*>(f[1]), lse, static_cast<const float*>(f[0]), rows(B), T, H, Hkv, A);
      launch(stream(), nqkv, convert_kernel<uint16_t, float>, dqkv.bf16_data(), static_cast<const float*>(f[3]), nqkv);
      return;
    }
    auto* delta = static_cast<float*>(stream_scratch(n * sizeof(float)));
    with_storage(t, [&]<typename S>() {
      launch(stream(), warps, attention_delta_kernel<S>, delta, ptr<S>(dout), ptr<S>(out), rows(B), T, H, A);
      auto args = [&](auto kernel) {
        launch(stream(), warps, kernel, ptr<S>(dqkv), ptr<S>(dout), static_cast<const float*>(delta), lse, ptr<S>(qkv),
               rows(B), T, H, Hkv, A);
      };
      if (hd <= 32) args(attention_backward_warp_kernel<1, S>);
      else if (hd <= 64) args(attention_backward_warp_kernel<2, S>);
      else if (hd <= 128) args(attention_backward_warp_kernel<4, S>);
      else args(attention_backward_warp_kernel<8, S>);
    });
  }
  void rmsnorm_forward(View out, float* rstd, ConstView x, const float* w, int N, int C, float eps) override {
    const size_t n = rows(N) * rows(C);
    with_storage(storage("rmsnorm_forward", {{out, n}, {x, n}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), rmsnorm_forward_kernel<S>, ptr<S>(out), rstd, ptr<S>(x), w, rows(N), C, eps);
    });
  }
  void rmsnorm_backward(View dx, float* dw, ConstView dy, ConstView x, const float* w, const float* rstd, int N,
                        int C) override {
    const size_t n = rows(N) * rows(C);
    const DType t = storage("rmsnorm_backward", {{dx, n}, {dy, n}, {x, n}});
    auto* pw = static_cast<float*>(stream_scratch(kColumnChunks * rows(C) * sizeof(float)));
    with_storage(t, [&]<typename S>() {
      launch_rows(stream(), rows(N), rmsnorm_backward_input_kernel<S>, ptr<S>(dx), ptr<S>(dy), ptr<S>(x), w, rstd,
                  rows(N), C);
      launch(stream(), kColumnChunks * rows(C), rmsnorm_params_partials_kernel<S>, pw, ptr<S>(dy), ptr<S>(x), rstd,
             rows(N), C);
    });
    launch(stream(), rows(C), column_finish_kernel, dw, static_cast<const float*>(pw), C);
  }
  void rope(View x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) override {
    with_storage(storage("rope", {{x, strided_extent(N, heads * hd, ld)}}), [&]<typename S>() {
      launch(stream(), rows(N) * heads * (hd / 2), rope_kernel<S>, ptr<S>(x), cs, rows(N), T, heads, hd, ld, backward);
    });
  }
  void swiglu_forward(View out, ConstView h, int N, int F) override {
    const size_t n = rows(N) * rows(F);
    with_storage(storage("swiglu_forward", {{out, n}, {h, 2 * n}}), [&]<typename S>() {
      launch(stream(), n, swiglu_forward_kernel<S>, ptr<S>(out), ptr<S>(h), rows(N), F);
    });
  }
  void swiglu_backward(View dh, ConstView h, ConstView dout, int N, int F) override {
    const size_t n = rows(N) * rows(F);
    with_storage(storage("swiglu_backward", {{dh, 2 * n}, {h, 2 * n}, {dout, n}}), [&]<typename S>() {
      launch(stream(), n, swiglu_backward_kernel<S>, ptr<S>(dh), ptr<S>(h), ptr<S>(dout), rows(N), F);
    });
  }
  // The cross-entropy ops: logits and dlogits (which may alias them) N rows of stride ld in one
  // storage type, the kernels instantiated for it. The reads span strided_extent(N, V, ld) of logits; a
  // gradient's writes include every row's padding, the last row's too: N * ld of dlogits.
  void vocab_row_max(float* row_max, ConstView logits, int N, int V, int ld) override {
    with_storage(storage("vocab_row_max", {{logits, logits_extent("vocab_row_max", N, V, ld)}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), vocab_row_max_kernel<S>, row_max, ptr<S>(logits), rows(N), V, ld);
    });
  }
  void vocab_sumexp(float* sumexp, float* target_logit, ConstView logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V, int ld) override {
    with_storage(storage("vocab_sumexp", {{logits, logits_extent("vocab_sumexp", N, V, ld)}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), vocab_sumexp_kernel<S>, sumexp, target_logit, ptr<S>(logits), row_max, targets,
                  vocab_start, rows(N), V, ld);
    });
  }
  void vocab_crossentropy_grad(View dlogits, ConstView logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) override {
    const size_t n = logits_extent("vocab_crossentropy_grad", N, V, ld);
    with_storage(storage("vocab_crossentropy_grad", {{logits, n}, {dlogits, rows(N) * rows(ld)}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), vocab_crossentropy_grad_kernel<S>, ptr<S>(dlogits), ptr<S>(logits), row_max,
                  sumexp, targets, vocab_start, rows(N), V, ld, dloss);
    });
  }
  void crossentropy(float* losses, View dlogits, ConstView logits, const int32_t* targets, int N, int V, int ld,
                    float dloss) override {
    const size_t n = logits_extent("crossentropy", N, V, ld);
    with_storage(storage("crossentropy", {{logits, n}, {dlogits, rows(N) * rows(ld)}}), [&]<typename S>() {
      launch_rows(stream(), rows(N), crossentropy_kernel<S>, losses, ptr<S>(dlogits), ptr<S>(logits), targets, rows(N),
                  V, ld, dloss);
    });
  }
  // One launch per kAdamRunsPerLaunch non-empty runs (empty ones skipped), one block per chunk
  // (at most kMaxBlocks, grid-strided).
  void adam_steps(const AdamRun* runs, size_t count, const math::AdamParams& a, bool fp16) override {
    AdamTable t;
    const auto flush = [&] {
      launch(stream(), t.first_chunk[t.count] * kThreads, adam_steps_kernel, t, a, fp16);
      t.count = 0;
    };
    for (size_t i = 0; i < count; ++i) {
      if (runs[i].n == 0) continue;
      t.run[t.count] = runs[i];
      t.first_chunk[t.count + 1] = t.first_chunk[t.count] + (runs[i].n + kAdamChunk - 1) / kAdamChunk;
      if (++t.count == static_cast<int>(kAdamRunsPerLaunch)) flush();
    }
    if (t.count > 0) flush();
  }
  void scale(float* x, float s, size_t n) override { launch(stream(), n, scale_kernel, x, s, n); }
  void cast_to_bf16(uint16_t* out, const float* x, size_t n) override {
    launch(stream(), n, convert_kernel<uint16_t, float>, out, x, n);
  }
  void cast_from_bf16(float* out, const uint16_t* x, size_t n) override {
    launch(stream(), n, convert_kernel<float, uint16_t>, out, x, n);
  }
  void cast_to_fp16(uint16_t* out, const float* x, size_t n) override {
    launch(stream(), n, cast_to_fp16_kernel, out, x, n);
  }
  void cast_from_fp16(float* out, const uint16_t* x, size_t n) override {
    launch(stream(), n, cast_from_fp16_kernel, out, x, n);
  }
  void accumulate_bf16(uint16_t* acc, const float* x, size_t n) override {
    launch(stream(), n, accumulate_bf16_kernel, acc, x, n);
  }
  void accumulate_fp16(uint16_t* acc, const float* x, size_t n) override {
    launch(stream(), n, accumulate_fp16_kernel, acc, x, n);
  }

  // ---- reductions (synchronising: the result comes back to the host) ----

  double sum_squares(const float* x, size_t n) override { return reduce<double>(x, n, SquareOf{}); }

 private:
  static int current_device(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    return device;
  }
  cudaStream_t stream() const { return stream_.get(); }
  // A linear layer where cuBLASLt has no algorithm: the GEMM into fp32 (y itself, or the
  // accumulator scratch for a bf16 y), then one epilogue pass (none for an fp32 y with nothing to
  // add): y = acc + bias + residual, and with gelu_out its GELU.
  void unfused_linear(DType t, View y, View gelu_out, ConstView x, GemmWeight w, const float* bias, ConstView residual,
                      int N, int in, int out) {
    const size_t ny = rows(N) * rows(out);
    float* acc = y.bf16() ? acc_scratch(ny) : y.f32_data();
    gemm(false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, acc, out);
    if (!y.bf16() && !bias && !residual && !gelu_out) return;
    with_storage(t, [&]<typename S>() {
      launch(stream(), ny, linear_epilogue_kernel<S>, ptr<S>(y), ptr<S>(gelu_out), static_cast<const float*>(acc), bias,
             ptr<S>(residual), rows(N), out);
    });
  }
  cublasHandle_t cublas() const { return cublas_.get(); }
  // Interface dimensions are int; index arithmetic is size_t so N*ld (logits) cannot overflow.
  static size_t rows(int n) { return n > 0 ? static_cast<size_t>(n) : 0; }
  // The logits' extent in a cross-entropy op, its stride checked: ld >= V.
  static size_t logits_extent(const char* name, int N, int V, int ld) {
    Z3D_ASSERT(ld >= V, strprintf("%s: row stride %d below the %d vocabulary columns", name, ld, V));
    return strided_extent(N, V, ld);
  }

  // Device memory grown to the largest asked for (in the first step), then reused. One op at a time
  // uses it, in stream order, so the next op's kernels run after the last one's are done with it.
  struct Scratch {
    DevicePtr p;
    size_t bytes = 0;
  };
  void* grown(Scratch& s, size_t bytes) {
    if (bytes > s.bytes) {
      CUDA_CHECK(cudaStreamSynchronize(stream()));  // the last user is done with the old one
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, bytes));
      s.p.reset(p);
      tally_.live -= s.bytes;
      tally_.add(bytes);
      s.bytes = bytes;
    }
    return s.p.get();
  }
  // One op's temporaries: the reductions' and column sums' partials, converted GEMM operands,
  // attention's row deltas and its operands around cuDNN or the fallback.
  void* stream_scratch(size_t bytes) { return grown(scratch_, bytes); }
  // The fp32 result of a GEMM whose C is bf16, apart from stream_scratch, which the GEMM's operands
  // use meanwhile (a linear layer's fallback rounds it in its epilogue).
  float* acc_scratch(size_t n) { return static_cast<float*>(grown(acc_scratch_, n * sizeof(float))); }

#if defined(ZERO3D_HAVE_CUDNN)
  // Whether cuDNN runs this attention; the first refusal of a shape says why, once.
  bool use_cudnn(const AttnShape& s, bool backward) {
    if (!cudnn_) return false;
    if (cudnn_->supports(s, backward)) return true;
    if (refused_.insert({s, backward}).second)
      log_warn("zero3d: cuDNN attention: %s; the backend's warp kernels run it", cudnn_->why_not().c_str());
    return false;
  }
  // cuDNN's operands must be 16-byte aligned: views at an odd offset take the warp kernels.
  static bool aligned(std::initializer_list<const void*> ps) {
    return std::all_of(ps.begin(), ps.end(), [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; });
  }
#endif
  static size_t padded(size_t n) { return (n + 7) / 8 * 8; }  // elements to a 16-byte boundary (bf16 or fp32)
  // Up to four buffers of T of these element counts in the stream scratch, each 16-byte aligned.
  template <typename T>
  std::array<T*, 4> scratch_of(std::initializer_list<size_t> counts) {
    size_t total = 0;
    for (size_t n : counts) total += padded(n);
    auto* p = static_cast<T*>(stream_scratch(total * sizeof(T)));
    std::array<T*, 4> out{};
    size_t i = 0;
    for (size_t n : counts) out[i++] = p, p += padded(n);
    return out;
  }

  // A GEMM's A (na elements) and B (nb) in the type its GEMMs take, bf16 with bf16_gemm, else fp32:
  // an operand of that type as it is (B's bf16 copy where it comes with one), else converted into the
  // stream scratch, 16-byte aligned: rounded to nearest even, or widened (exactly).
  std::pair<const void*, const void*> gemm_operands(ConstView A, size_t na, GemmWeight B, size_t nb) {
    const DType t = bf16_gemm_ ? DType::bf16 : DType::f32;
    const std::array<ConstView, 2> v{
        ConstView(A.data, A.dtype, na),
        (bf16_gemm_ ? B.bf16 != nullptr : B.f32 == nullptr) ? ConstView(B.bf16, nb) : ConstView(B.f32, nb)};
    size_t bytes = 0;
    for (const ConstView& x : v)
      if (x.dtype != t) bytes += padded(x.size) * dtype_bytes(t);
    char* p = bytes ? static_cast<char*>(stream_scratch(bytes)) : nullptr;
    std::array<const void*, 2> out{};
    for (size_t i = 0; i < 2; ++i) {
      if (v[i].dtype == t) {
        out[i] = v[i].data;
        continue;
      }
      if (t == DType::bf16)
        launch(stream(), v[i].size, convert_kernel<uint16_t, float>, reinterpret_cast<uint16_t*>(p), v[i].f32_data(),
               v[i].size);
      else
        launch(stream(), v[i].size, convert_kernel<float, uint16_t>, reinterpret_cast<float*>(p), v[i].bf16_data(),
               v[i].size);
      out[i] = p;
      p += padded(v[i].size) * dtype_bytes(t);
    }
    return {out[0], out[1]};
  }
  // bias (or another column sum) += the column sums of term over N rows of C, in the two passes of
  // the column reductions.
  template <typename Term>
  void column_sums(float* out, Term term, int N, int C) {
    auto* p = static_cast<float*>(stream_scratch(kColumnChunks * rows(C) * sizeof(float)));
    launch(stream(), kColumnChunks * rows(C), bias_partials_kernel<Term>, p, term, rows(N), C);
    launch(stream(), rows(C), column_finish_kernel, out, static_cast<const float*>(p), C);
  }

  template <typename Acc, typename Term>
  Acc reduce(const float* x, size_t n, Term term) {
    const auto blocks = static_cast<unsigned>(blocks_for(n, kReduceBlocks));
    Acc* out = static_cast<Acc*>(stream_scratch((blocks + 1) * sizeof(Acc)));  // the result, then the partials
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(Acc), stream()));
    if (n > 0) {
      g_launches += 2;
      reduce_partials_kernel<<<blocks, kThreads, 0, stream()>>>(out + 1, x, n, term);
      CUDA_CHECK(cudaGetLastError());
      reduce_final_kernel<<<1, kThreads, 0, stream()>>>(out, static_cast<const Acc*>(out + 1), blocks);
      CUDA_CHECK(cudaGetLastError());
    }
    Acc result{};
    CUDA_CHECK(cudaMemcpyAsync(&result, out, sizeof(Acc), cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return result;
  }

  int device_;  // first: its initializer makes the device current for every member after it
  bool bf16_gemm_;
  std::string attention_;  // what computes attention, for the run record
#if defined(ZERO3D_HAVE_CUDNN)
  std::unique_ptr<CudnnAttention> cudnn_;  // bf16 runs, where cuDNN loads
  std::set<std::pair<AttnShape, bool>> refused_;
#endif
  size_t allocs_ = 0;
  cudaDeviceProp prop_{};
  // Members die in reverse declaration order: the scratches, then the cuBLAS handle, then its stream.
  StreamPtr stream_;
  CublasPtr cublas_;
  Scratch scratch_, acc_scratch_;
  std::unordered_map<void*, size_t> held_;  // alloc_bytes' buffers and their sizes
  MemoryTally tally_;                       // their bytes and the scratch's: device_peak_bytes
  LtLinear lt_;  // linear_forward's fused matmuls
};

}  // namespace

// No driver, no device or a driver too old all mean "no CUDA here": 0, so the caller falls back to
// the host backend instead of aborting.
static int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later checked calls do not inherit it
    return 0;
  }
  return count;
}

static std::unique_ptr<Backend> make_backend(int device, bool bf16_gemm) {
  int count = device_count();
  if (count == 0)
    throw UserError(strprintf("CUDA device %d requested but no CUDA device is visible (no driver, or "
                              "CUDA_VISIBLE_DEVICES is empty); use the host backend",
                              device));
  if (device < 0 || device >= count)
    throw UserError(strprintf("CUDA device %d requested but this process sees %d device(s) (valid: 0..%d); "
                              "check CUDA_VISIBLE_DEVICES and the ranks per node",
                              device, count, count - 1));
  return std::make_unique<CudaBackend>(device, bf16_gemm);
}

}  // namespace zero3d

// The module's entry points (kernels/cuda_module.h loads them with dlopen).
extern "C" int zero3d_cuda_device_count() { return zero3d::device_count(); }
extern "C" zero3d::Backend* zero3d_make_cuda_backend(int device, int bf16_gemm) {
  return zero3d::make_backend(device, bf16_gemm != 0).release();
}
