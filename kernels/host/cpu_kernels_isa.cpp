// kernels/host/cpu_kernels_isa.cpp: the host loops, compiled once per ISA level (CMakeLists.txt
// passes ZERO3D_ISA and the level's -march), each copy in namespace zero3d::cpu::<level>.
//
// How they run fast:
//  - vector math on simd::vf (simd.h): exp by polynomial, GELU through the sigmoid form
//    x * sigmoid(2u) (the tanh form's 1 + tanh(u) loses digits for x << 0), row reductions in
//    W lanes, one register of the level (simd.h); the kernels built on exp kU registers a step,
//    so that their long chains interleave (simd::vn); plain loops (Adam's sqrt, casts, adds)
//    vectorize because the flags drop errno;
//  - threads (OpenMP) over rows, column blocks or fixed element blocks, only when the work is big
//    enough to pay for a parallel region; sums over threads' parts add in block order, so the bits
//    do not depend on the thread count;
//  - attention is one fused, blocked kernel per (batch, head) (flash-attention style): scores live
//    in a 64 x 64 tile, softmax is online, the T x T matrix is never stored; backward recomputes
//    the tile from the saved log-sum-exp. Causality skips every tile above the diagonal.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/host/cpu_kernels.h"
#include "kernels/host/simd.h"
#include "kernels/math/adamw.h"
#include "kernels/math/dtype.h"
#include "kernels/math/gelu.h"
#include "kernels/math/layernorm.h"
#include "kernels/math/rope.h"

#ifndef ZERO3D_ISA
#error "compile this file with -DZERO3D_ISA=<level> (see CMakeLists.txt)"
#endif

namespace zero3d::cpu::ZERO3D_ISA {
namespace {

using namespace simd;

#define Z3D_STR2(x) #x
#define Z3D_STR(x) Z3D_STR2(x)

// Below this many elements of work a parallel region costs more than it saves.
constexpr size_t kMinParallel = size_t{1} << 15;

template <typename F>
void for_rows(int rows, size_t per_row, F&& f) {
  const bool par = rows > 1 && static_cast<size_t>(rows) * per_row >= kMinParallel;
#pragma omp parallel for schedule(static) if (par)
  for (int r = 0; r < rows; ++r) f(r);
}

// f(begin, end) over fixed blocks of n: the blocks, not the threads, define any partial sums.
constexpr size_t kBlock = size_t{1} << 14;
template <typename F>
void for_blocks(size_t n, F&& f) {
  const long blocks = static_cast<long>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (n >= kMinParallel)
  for (long b = 0; b < blocks; ++b) f(static_cast<size_t>(b) * kBlock, std::min(n, static_cast<size_t>(b + 1) * kBlock));
}

// Row sweeps that also sum columns (bias and LayerNorm weight gradients): f(r, acc) handles row r
// and adds its contributions to acc[0, cols). Rows go in blocks of kSumRows, each block summed in
// row order into a partial of its own, and the partials are added in block order: one pass over
// the data, row-major, and the same bits for any thread count. Returns the column sums (valid
// until the next call).
constexpr int kSumRows = 128;
template <typename F>
const float* column_sums(int N, int cols, F&& f) {
  const int blocks = std::max(1, (N + kSumRows - 1) / kSumRows);
  const size_t stride = (static_cast<size_t>(cols) + W - 1) / W * W;
  static thread_local std::vector<float> partial;  // grown once, to the largest call
  if (partial.size() < blocks * stride) partial.resize(blocks * stride);
  float* part = partial.data();
  const bool par = blocks > 1 && static_cast<size_t>(N) * cols >= kMinParallel;
#pragma omp parallel for schedule(static) if (par)
  for (int b = 0; b < blocks; ++b) {
    float* acc = part + b * stride;
    std::fill(acc, acc + stride, 0.0f);
    for (int r = b * kSumRows; r < std::min(N, (b + 1) * kSumRows); ++r) f(r, acc);
  }
  for (int b = 1; b < blocks; ++b)
    for (size_t c = 0; c < stride; ++c) part[c] += part[b * stride + c];
  return part;
}

// A vf computation over n elements, Step at a time (W, or kWide for vw), the tail through a
// zero-padded one.
template <int Step = W, typename F>
void map_vf(size_t begin, size_t end, F&& f) {
  size_t i = begin;
  for (; i + Step <= end; i += Step) f(i, Step);
  if (i < end) f(i, static_cast<int>(end - i));
}
// p[0, n) = 0 by vector stores: attention's panels, where libc's memset (rep stosb) made the AVX-512
// backward 3-4% slower.
inline void zero_floats(float* p, size_t n) {
  size_t i = 0;
  for (; i + W <= n; i += W) store(p + i, vf{});
  for (; i < n; ++i) p[i] = 0.0f;
}
inline vf load_n(const float* p, int n) {
  if (n == W) return load(p);
  float t[W] = {};
  std::memcpy(t, p, sizeof(float) * n);
  return load(t);
}
inline void store_n(float* p, vf v, int n) {
  if (n == W) return store(p, v);
  float t[W];
  store(t, v);
  std::memcpy(p, t, sizeof(float) * n);
}
// dst[0, n) = s x[0, n): whole vectors, then the tail (x readable to a whole vector: a padded row).
inline void store_scaled(float* dst, const float* x, float s, int n) {
  const int whole = n - n % W;
  for (int k = 0; k < whole; k += W) store(dst + k, load(x + k) * s);
  if (whole < n) store_n(dst + whole, load(x + whole) * s, n - whole);
}

// The elementwise kernels built on exp (GELU, SwiGLU, the softmax rows of the cross-entropy) take kU
// vectors a step (simd.h's vn).
constexpr int kU = 4, kWide = kU * W;
using vw = vn<kU>;
Z3D_INLINE vw load_wide(const float* p, int k) {  // p[0, k), zero-padded to kWide
  vw v;
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) v.r[u] = k == kWide ? load(p + u * W) : load_n(p + u * W, std::clamp(k - u * W, 0, W));
  return v;
}
Z3D_INLINE void store_wide(float* p, vw v, int k) {
#pragma GCC unroll 8
  for (int u = 0; u < kU; ++u) {
    if (k == kWide)
      store(p + u * W, v.r[u]);
    else if (k > u * W)
      store_n(p + u * W, v.r[u], std::min(k - u * W, W));
  }
}

// Non-temporal stores, for outputs too large to be read again from the cache: a store to a line not
// in the cache first reads it (one extra pass over the output), a streaming one does not. SwiGLU's
// outputs from kStreamBytes on go this way (bench-cpu-llama's 12-25 MB a micro-batch: in its steps,
// Zen 5, 2 ranks, forward and backward took 34 -> 29 ms a step); smaller ones, which the next GEMM
// reads from L2, keep cached stores. GELU's 16 MB outputs lost (8 -> 10-12 ms: the next GEMM found
// them in L3) and are always cached. Same values, same bits. stream_fence after a row, in the
// thread that wrote it, orders its streaming stores before other threads' reads.
constexpr size_t kStreamBytes = size_t{4} << 20;
inline void stream(float* p, vf v) {
#if defined(__AVX512F__)
  _mm512_stream_ps(p, v);
#elif defined(__AVX2__)
  _mm256_stream_ps(p, v);
#elif defined(__SSE2__)
  _mm_stream_ps(p, v);
#else
  store(p, v);
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
// store_wide, streaming (where whole and aligned) if `streaming`.
Z3D_INLINE void store_wide(float* p, vw v, int k, bool streaming) {
  if (streaming && k == kWide && reinterpret_cast<uintptr_t>(p) % sizeof(vf) == 0) {
#pragma GCC unroll 8
    for (int u = 0; u < kU; ++u) stream(p + u * W, v.r[u]);
  } else {
    store_wide(p, v, k);
  }
}

// Folds f(i) over the whole vectors i = 0, W, 2W, ... below n in four independent chains, one
// chain waiting an add's latency per vector (a LayerNorm row ran at half the cache's speed on one
// chain). Chain k takes vectors k, k + 4, ...; the chains join as op(op(0, 1), op(2, 3)): a fixed
// order. Returns the folded value (a vector, or a struct of them); *end is the first element left over.
template <typename V, typename F, typename Op>
V fold_vectors(int n, int* end, V init, F&& f, Op op) {
  V a = init, b = init, c = init, d = init;
  int i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a = op(a, f(i));
    b = op(b, f(i + W));
    c = op(c, f(i + 2 * W));
    d = op(d, f(i + 3 * W));
  }
  for (; i + W <= n; i += W) a = op(a, f(i));
  *end = i;
  return op(op(a, b), op(c, d));
}
template <typename F>
vf sum_vectors(int n, int* end, F&& f) {
  return fold_vectors(n, end, vf{}, f, [](vf a, vf b) { return a + b; });
}

float row_sum(const float* x, int n) {
  int i;
  float t = reduce_add(sum_vectors(n, &i, [=](int j) { return load(x + j); }));
  for (; i < n; ++i) t += x[i];
  return t;
}
float row_max(const float* x, int n) {
  int i;
  const vf m = fold_vectors(
      n, &i, splat(-std::numeric_limits<float>::infinity()), [=](int j) { return load(x + j); },
      [](vf a, vf b) { return vmax(a, b); });
  float t = reduce_max(m);
  for (; i < n; ++i) t = x[i] > t ? x[i] : t;
  return t;
}
float row_dot(const float* x, const float* y, int n) {
  int i;
  float t = reduce_add(sum_vectors(n, &i, [=](int j) { return load(x + j) * load(y + j); }));
  for (; i < n; ++i) t += x[i] * y[i];
  return t;
}
// sum exp(x - mx); with e != nullptr the exponentials are stored there (may alias x). kU vectors a
// step (the exps interleave), summed in fold_vectors' chains and order.
float row_sumexp(float* e, const float* x, int n, float mx) {
  vw s{};
  int i = 0;
  for (; i + kWide <= n; i += kWide) {
    const vw v = vexp(load_wide(x + i, kWide) - mx);
    if (e) store_wide(e + i, v, kWide);
    s = s + v;
  }
  for (; i + W <= n; i += W) {
    const vf v = vexp(load(x + i) - mx);
    if (e) store(e + i, v);
    s.r[0] += v;
  }
  static_assert(kU == 4, "the chains join as fold_vectors' four");
  float t = reduce_add((s.r[0] + s.r[1]) + (s.r[2] + s.r[3]));
  for (; i < n; ++i) {
    const float v = sexp(x[i] - mx);
    if (e) e[i] = v;
    t += v;
  }
  return t;
}

// ---- embedding, LayerNorm, bias, GELU, elementwise ----

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                       int vocab_start, int vocab_rows) {
  for_rows(N, C, [=](int n) {
    const int row = tokens[n] - vocab_start;
    float* o = out + static_cast<size_t>(n) * C;
    const float* p = wpe ? wpe + static_cast<size_t>(n % T) * C : nullptr;
    if (row >= 0 && row < vocab_rows) {
      const float* e = wte + static_cast<size_t>(row) * C;
      if (p)
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      else
        std::memcpy(o, e, sizeof(float) * C);
    } else if (p) {
      std::memcpy(o, p, sizeof(float) * C);
    } else {
      std::memset(o, 0, sizeof(float) * C);
    }
  });
}

// Two rows may share a token (and every T-th row a position): threads split the columns (blocks of
// 64), and each column adds the rows in order.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int N, int T, int C,
                        int vocab_start, int vocab_rows) {
  const int blocks = (C + 63) / 64;
#pragma omp parallel for schedule(static) if (blocks > 1 && static_cast<size_t>(N) * C >= kMinParallel)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * 64, c1 = std::min(C, c0 + 64);
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<size_t>(n) * C;
      if (dwpe) {
        float* p = dwpe + static_cast<size_t>(n % T) * C;
        for (int c = c0; c < c1; ++c) p[c] += d[c];
      }
      const int row = tokens[n] - vocab_start;
      if (row < 0 || row >= vocab_rows) continue;
      float* e = dwte + static_cast<size_t>(row) * C;
      for (int c = c0; c < c1; ++c) e[c] += d[c];
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                       int C) {
  for_rows(N, C, [=](int n) {
    const float* xr = x + static_cast<size_t>(n) * C;
    float* o = out + static_cast<size_t>(n) * C;
    const float mu = row_sum(xr, C) / C;
    int i;
    float var = reduce_add(sum_vectors(C, &i, [=](int j) {
      const vf d = load(xr + j) - mu;
      return d * d;
    }));
    for (; i < C; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    const float rs = 1.0f / std::sqrt(var / C + math::kLayerNormEps);
    for (int c = 0; c < C; ++c) o[c] = (xr[c] - mu) * rs * w[c] + b[c];
    mean[n] = mu;
    rstd[n] = rs;
  });
}

// One pass per row: the row's two means, then dx, and dw, db summed per column (column_sums).
void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  const float* sums = column_sums(N, 2 * C, [=](int n, float* acc) {
    const size_t o = static_cast<size_t>(n) * C;
    const float mu = mean[n], rs = rstd[n];
    struct Sums {
      vf g, gx;
    };
    int i;
    const Sums s = fold_vectors(
        C, &i, Sums{},
        [=](int j) {
          const vf g = load(dy + o + j) * load(w + j);
          return Sums{g, g * ((load(x + o + j) - mu) * rs)};
        },
        [](Sums a, Sums b) { return Sums{a.g + b.g, a.gx + b.gx}; });
    float mg = reduce_add(s.g), mgx = reduce_add(s.gx);
    for (; i < C; ++i) {
      const float g = dy[o + i] * w[i];
      mg += g;
      mgx += g * ((x[o + i] - mu) * rs);
    }
    mg /= C;
    mgx /= C;
    float *aw = acc, *ab = acc + C;
    map_vf(0, C, [&](size_t c, int k) {
      const vf d = load_n(dy + o + c, k), xh = (load_n(x + o + c, k) - mu) * rs;
      store_n(dx + o + c, load_n(dx + o + c, k) + rs * (d * load_n(w + c, k) - mg - xh * mgx), k);
      store_n(aw + c, load_n(aw + c, k) + d * xh, k);
      store_n(ab + c, load_n(ab + c, k) + d, k);
    });
  });
  for (int c = 0; c < C; ++c) {
    dw[c] += sums[c];
    db[c] += sums[C + c];
  }
}

void add_bias(float* out, const float* bias, int N, int C) {
  for_rows(N, C, [=](int n) {
    float* o = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] += bias[c];
  });
}

void bias_backward(float* dbias, const float* dout, int N, int C) {
  const float* sums = column_sums(N, C, [=](int n, float* acc) {
    const float* d = dout + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) acc[c] += d[c];
  });
  for (int c = 0; c < C; ++c) dbias[c] += sums[c];
}

// gelu(x) = x/2 (1 + tanh u) = x sigmoid(2u), u = s (x + 0.044715 x^3);
// gelu'(x) = sig + 2 x sig (1 - sig) s (1 + 3 * 0.044715 x^2). The constants are folded
// (-2u = x (a + b x^2)): the forward is bound by its arithmetic (exp's), not by memory.
constexpr float kS = math::kGeluScale, kK = math::kGeluCubic;
constexpr float kA = -2.0f * kS, kB = -2.0f * kS * kK, kD = 3.0f * kS * kK;
template <typename V>
Z3D_INLINE V gelu_v(V x) {
  return x / (1.0f + vexp_clamped(x * (kA + kB * (x * x))));
}
// dout (sig + y (1 - sig) 2 du): the derivative above with x sig = y, the forward's output, and
// sig = y / x; 1/2 where x^2 is below 1e-38 (there sig is 1/2 to float precision, and y / x could
// be 0 / 0). No exp: 9 operations a vector, so that the backward runs at memory speed (with an exp
// it took 1.6-2.0 G elements/s at AVX2, bound by its arithmetic). Against the double derivative
// over [-12, 12]: at most 3.5e-6 off (x near 4.7, where 1 - sig inherits y's rounding; (x - y) / x
// for it gained little and cost a second division), the exp form 2.0e-6.
inline vf gelu_grad_v(vf x, vf y, vf dout) {
  const vf x2 = x * x;
  const vf sig = x2 < splat(1e-38f) ? splat(0.5f) : y / x;
  return dout * (sig + y * (1.0f - sig) * (2.0f * kS + 2.0f * kD * x2));
}

void gelu_forward(float* out, const float* x, size_t n) {
  for_blocks(n, [=](size_t b, size_t e) {
    map_vf<kWide>(b, e, [=](size_t i, int k) { store_wide(out + i, gelu_v(load_wide(x + i, k)), k); });
  });
}

void gelu_backward(float* dx, float* dbias, const float* x, const float* y, const float* dout, int N, int C) {
  const size_t n = static_cast<size_t>(N) * C;
  if (!dbias) {
    for_blocks(n, [=](size_t b, size_t e) {
      map_vf(b, e, [=](size_t i, int k) {
        store_n(dx + i, gelu_grad_v(load_n(x + i, k), load_n(y + i, k), load_n(dout + i, k)), k);
      });
    });
    return;
  }
  // Fused with the bias gradient: dbias needs no second pass over dx.
  const float* sums = column_sums(N, C, [=](int r, float* acc) {
    const size_t o = static_cast<size_t>(r) * C;
    map_vf(0, C, [=](size_t c, int k) {
      const vf g = gelu_grad_v(load_n(x + o + c, k), load_n(y + o + c, k), load_n(dout + o + c, k));
      store_n(dx + o + c, g, k);
      store_n(acc + c, load_n(acc + c, k) + g, k);
    });
  });
  for (int c = 0; c < C; ++c) dbias[c] += sums[c];
}

// ---- the Llama family: RMSNorm, RoPE, SwiGLU ----

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps) {
  for_rows(N, C, [=](int n) {
    const float* xr = x + static_cast<size_t>(n) * C;
    float* o = out + static_cast<size_t>(n) * C;
    int i;
    float ss = reduce_add(sum_vectors(C, &i, [=](int j) {
      const vf v = load(xr + j);
      return v * v;
    }));
    for (; i < C; ++i) ss += xr[i] * xr[i];
    const float rs = 1.0f / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) o[c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  });
}

// One pass per row: the row's mean of g * xhat, then dx, and dw summed per column (column_sums).
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int N,
                      int C) {
  const float* sums = column_sums(N, C, [=](int n, float* acc) {
    const size_t o = static_cast<size_t>(n) * C;
    const float rs = rstd[n];
    int i;
    float mgx = reduce_add(sum_vectors(C, &i, [=](int j) { return load(dy + o + j) * load(w + j) * (load(x + o + j) * rs); }));
    for (; i < C; ++i) mgx += dy[o + i] * w[i] * (x[o + i] * rs);
    mgx /= C;
    map_vf(0, C, [&](size_t c, int k) {
      const vf d = load_n(dy + o + c, k), xh = load_n(x + o + c, k) * rs;
      store_n(dx + o + c, load_n(dx + o + c, k) + rs * (d * load_n(w + c, k) - xh * mgx), k);
      store_n(acc + c, load_n(acc + c, k) + d * xh, k);
    });
  });
  for (int c = 0; c < C; ++c) dw[c] += sums[c];
}

// The row's angles de-interleaved into cos and sin arrays (backward: sin negated), a chunk of up to
// 256 pairs at a time, then every head's pairs of the chunk a whole vector at a time.
void rope(float* x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) {
  const int half = hd / 2;
  constexpr int kChunk = 256;
  for_rows(N, static_cast<size_t>(heads) * hd, [=](int n) {
    const float* t = cs + 2 * static_cast<size_t>(n % T) * half;
    float* row = x + n * ld;
    alignas(64) float c[kChunk], sn[kChunk];
    for (int i0 = 0; i0 < half; i0 += kChunk) {
      const int m = std::min(kChunk, half - i0);
      for (int i = 0; i < m; ++i) c[i] = t[2 * (i0 + i)], sn[i] = backward ? -t[2 * (i0 + i) + 1] : t[2 * (i0 + i) + 1];
      for (int h = 0; h < heads; ++h) {
        float* r = row + h * hd + i0;
        map_vf(0, m, [&](size_t i, int k) {
          const vf a = load_n(r + i, k), b = load_n(r + half + i, k), cv = load_n(c + i, k), sv = load_n(sn + i, k);
          store_n(r + i, a * cv - b * sv, k);
          store_n(r + half + i, b * cv + a * sv, k);
        });
      }
    }
  });
}

template <typename V>
Z3D_INLINE V sigmoid_v(V g) {
  return 1.0f / (1.0f + vexp_clamped(-g));
}

// The row loops' bodies forced inline: GCC called them out of line per kWide chunk (AVX2 forward
// 68-75% -> 80-97% of the copy bound, backward 71-85% -> 81-93%; SSE2 forward 65-73% -> 73-83% of
// its exp bound; bench kernels, Zen 5, 1 thread, 3 runs each). GELU's and the cross-entropy's
// measured no gain inlined, and stay as GCC has them.
void swiglu_forward(float* out, const float* h, int N, int F) {
  const bool streaming = sizeof(float) * N * F >= kStreamBytes;
  for_rows(N, 2 * static_cast<size_t>(F), [=](int n) {
    const float* g = h + 2 * static_cast<size_t>(n) * F;
    float* o = out + static_cast<size_t>(n) * F;
    map_vf<kWide>(0, F, [=](size_t c, int k) Z3D_INLINE_LAMBDA {
      const vw gv = load_wide(g + c, k);
      store_wide(o + c, gv / (1.0f + vexp_clamped(-gv)) * load_wide(g + F + c, k), k, streaming);  // silu(gate) * up
    });
    if (streaming) stream_fence();
  });
}

void swiglu_backward(float* dh, const float* h, const float* dout, int N, int F) {
  const bool streaming = 2 * sizeof(float) * N * F >= kStreamBytes;
  for_rows(N, 2 * static_cast<size_t>(F), [=](int n) {
    const float* g = h + 2 * static_cast<size_t>(n) * F;
    const float* d = dout + static_cast<size_t>(n) * F;
    float* dg = dh + 2 * static_cast<size_t>(n) * F;
    map_vf<kWide>(0, F, [=](size_t c, int k) Z3D_INLINE_LAMBDA {
      const vw gv = load_wide(g + c, k), uv = load_wide(g + F + c, k), dv = load_wide(d + c, k), sg = sigmoid_v(gv);
      store_wide(dg + c, dv * uv * sg * (1.0f + gv * (1.0f - sg)), k, streaming);
      store_wide(dg + F + c, dv * gv * sg, k, streaming);
    });
    if (streaming) stream_fence();
  });
}

// The exp alone (bench kernels' exp rate) at the step that runs it fastest: one vector at a time on
// AVX2 and AVX-512 (kU at a time measured AVX-512 8.0 -> 7.2 G/s, AVX2 3.9 -> 3.8), kU on SSE2
// (1.20 -> 1.32). Zen 5, 1 thread, in L2.
void exp(float* y, const float* x, size_t n) {
  for_blocks(n, [=](size_t b, size_t e) {
    if constexpr (W >= 8)
      map_vf(b, e, [=](size_t i, int k) { store_n(y + i, vexp(load_n(x + i, k)), k); });
    else
      map_vf<kWide>(b, e, [=](size_t i, int k) { store_wide(y + i, vexp(load_wide(x + i, k)), k); });
  });
}

void accumulate(float* out, const float* a, size_t n) {
  for_blocks(n, [=](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) out[i] += a[i];
  });
}
void scale(float* x, float s, size_t n) {
  for_blocks(n, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) x[i] *= s;
  });
}

// ---- attention ----

// Register tiles for the small products inside attention: kMR rows x kNV vectors of W columns,
// sized to the level's registers so that the accumulators, the broadcast and (where they fit) the
// B vectors stay in registers (no spill in the k loop).
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int kMR = 4, kNV = 4, kProduct = 0;  // 16 accumulators + 4 B + 1 broadcast of 32 registers
#elif defined(__FMA__)
constexpr int kMR = 6, kNV = 2, kProduct = 0;  // AVX2: 12 + 2 + 1 of 16
#else
// SSE2, no FMA (a product register too): 12 accumulators + broadcast + product of 16, B loaded again
// for each row (kHoldB): two broadcasts (a shuffle each) per 24 multiplies and adds. 64 x 64 operands
// in cache, Zen 5: 2 x 4 with B held 44-45 GFLOP/s, 2 x 6 45-48; 4 x 2 took four broadcasts per 16.
constexpr int kMR = 2, kNV = 6, kProduct = 1;
#endif
// An MR x NV tile holds B's NV vectors in registers where they fit beside its accumulators, the
// broadcast and the product; else each row loads them again.
template <int MR, int NV>
constexpr bool kHoldB = MR * NV + NV + 1 + kProduct <= kRegs;
static_assert(kMR * kNV + 1 + kProduct <= kRegs, "a tile's accumulators must fit the level's registers");

// C[i, 0:NV*W] (+)= sum_k A(i, k) B[k, 0:NV*W] for MR rows: A(i, k) at A[i*sa + k*sk] (any
// strides: it is broadcast), B rows at B + k*ldb, C rows at C + i*ldc.
template <int MR, int NV>
void tile(float* C, long ldc, const float* A, long sa, long sk, const float* B, long ldb, int K, bool acc) {
  vf c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = acc ? load(C + r * ldc + v * W) : vf{};
  for (int k = 0; k < K; ++k) {
    vf b[NV];
    if constexpr (kHoldB<MR, NV>)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) b[v] = load(B + k * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const vf a = splat(A[r * sa + k * sk]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] += a * (kHoldB<MR, NV> ? b[v] : load(B + k * ldb + v * W));
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store(C + r * ldc + v * W, c[r][v]);
}

using TileFn = void (*)(float*, long, const float*, long, long, const float*, long, int, bool);
template <int MR, int... NV>
constexpr auto tile_row(std::integer_sequence<int, NV...>) {
  return std::array<TileFn, sizeof...(NV)>{&tile<MR, NV + 1>...};
}
template <int... MR>
constexpr auto tile_table(std::integer_sequence<int, MR...>) {
  return std::array<std::array<TileFn, kNV>, sizeof...(MR)>{tile_row<MR + 1>(std::make_integer_sequence<int, kNV>())...};
}
constexpr auto kTiles = tile_table(std::make_integer_sequence<int, kMR>());

// C[M x N] (+)= A[M x K] B[K x N], N a multiple of W (the packed head width and key blocks are).
void small_gemm(float* C, long ldc, const float* A, long sa, long sk, const float* B, long ldb, int M, int N, int K,
                bool acc) {
  for (int i = 0; i < M; i += kMR) {
    const int mr = std::min(kMR, M - i);
    for (int j = 0; j < N; j += kNV * W) {
      const int nv = std::min(kNV, (N - j) / W);
      kTiles[mr - 1][nv - 1](C + i * ldc + j, ldc, A + i * sa, sa, sk, B + j, ldb, K, acc);
    }
  }
}

constexpr int kTileT = 64;  // query rows and key columns per attention tile
int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The causal triangle inside a diagonal tile: small_gemm in groups of kMR rows, each group with
// its own extent, so nothing right of the diagonal is computed beyond one vector.
// extent(r0, r1) for the group's rows [r0, r1) gives {n, kb, ke}: its column count (a multiple of
// W) and its range [kb, ke) of the summed index. A group with an empty range is left as it is.
struct Extent {
  int n, kb, ke;
};
template <typename F>
void causal_gemm(float* C, long ldc, const float* A, long sa, long sk, const float* B, long ldb, int M, bool acc,
                 F&& extent) {
  for (int i = 0; i < M; i += kMR) {
    const int mr = std::min(kMR, M - i);
    const Extent e = extent(i, i + mr);
    if (e.ke > e.kb && e.n > 0)
      small_gemm(C + i * ldc, ldc, A + i * sa + e.kb * sk, sa, sk, B + e.kb * ldb, ldb, mr, e.n, e.ke - e.kb, acc);
  }
}

// ts, the row stride of a transposed head (K^T, V^T): T padded to the tile, plus one cache line.
// A tile reads 64 of its rows per key block; 1 KB apart (T = 256) they fell into 16 of L1's 64
// sets and evicted each other (the q . k tile at 71% of the FMA peak on AVX-512, 92% with the line).
// Columns of packed rows [q (H heads) | k (Hkv heads) | v (Hkv heads)], ld apart: query head h
// at q(h), its key/value head's at k(h / group), v(h / group).
struct AttnDims {
  int T, H, Hkv, A, hd, hp, ts;  // hp: head width padded to W
  AttnDims(int T_, int H_, int Hkv_, int A_)
      : T(T_), H(H_), Hkv(Hkv_), A(A_), hd(A_ / H_), hp(round_up(hd, W)), ts(round_up(T_, kTileT) + kAttnRowPad) {}
  size_t panel() const { return static_cast<size_t>(ts) * hp; }
  bool direct() const { return hd % W == 0; }  // head rows are whole vectors: tiles read them in place
  long ld() const { return A + 2L * Hkv * hd; }
  int group() const { return H / Hkv; }
  int q(int h) const { return h * hd; }
  int k(int kvh) const { return A + kvh * hd; }
  int v(int kvh) const { return A + (Hkv + kvh) * hd; }
};

// A head's rows as a tile operand: where row t starts, and the stride between rows.
struct Rows {
  const float* p;
  long ld;
  const float* row(int t) const { return p + t * ld; }
};

// Head h (columns col.. of rows of stride ld) as rows of hp floats. A tile's broadcast operand
// (kMR rows at a time) is read in place when hd is a whole number of vectors; a streamed operand
// (64 rows of vectors per tile) is copied into `panel`, contiguous: rows 3A floats apart fall into
// a few L1 sets and evict each other. The padding of a copy is zero (the tiles read it).
Rows head_rows(const float* X, long ld, int col, const AttnDims& d, float* panel, bool streamed) {
  if (d.direct() && !streamed) return {X + col, ld};
  for (int t = 0; t < d.T; ++t) {
    float* row = panel + static_cast<size_t>(t) * d.hp;
    std::memcpy(row, X + t * ld + col, sizeof(float) * d.hd);
    std::fill(row + d.hd, row + d.hp, 0.0f);
  }
  zero_floats(panel + static_cast<size_t>(d.T) * d.hp, d.panel() - static_cast<size_t>(d.T) * d.hp);
  return {panel, d.hp};
}

// A W x W block transposed in registers: log2(W) rounds, each interleaving row i with row
// i + W/2 (the lanes of their low halves, a0 b0 a1 b1 ..., into row 2i; of their high halves into
// row 2i + 1).
template <size_t... J>
inline vf interleave_low(vf a, vf b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, (J % 2 ? W + J / 2 : J / 2)...);
}
template <size_t... J>
inline vf interleave_high(vf a, vf b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, (J % 2 ? W + W / 2 + J / 2 : W / 2 + J / 2)...);
}
inline void transpose_block(vf (&r)[W]) {
  constexpr auto lanes = std::make_index_sequence<W>();
#pragma GCC unroll 4
  for (int round = 1; round < W; round *= 2) {
    vf t[W];
#pragma GCC unroll 16
    for (int i = 0; i < W / 2; ++i) {
      t[2 * i] = interleave_low(r[i], r[i + W / 2], lanes);
      t[2 * i + 1] = interleave_high(r[i], r[i + W / 2], lanes);
    }
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) r[i] = t[i];
  }
}

// Head h transposed into hp rows of ts (K^T, V^T: the tiles broadcast along the other operand and need
// keys contiguous), zeros in the padding: W x W blocks in registers, the edges element by element
// (a scalar transpose was a tenth of attention's time).
void pack_transposed(float* dst, const float* X, long ld, int col, const AttnDims& d) {
  auto at = [&](int t, int k) -> float& { return dst[static_cast<size_t>(k) * d.ts + t]; };
  const int T = d.T - d.T % W, hd = d.hd - d.hd % W;  // the whole blocks
  for (int t0 = 0; t0 < T; t0 += W)
    for (int k0 = 0; k0 < hd; k0 += W) {
      vf r[W];
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) r[i] = load(X + (t0 + i) * ld + col + k0);
      transpose_block(r);
#pragma GCC unroll 16
      for (int j = 0; j < W; ++j) store(&at(t0, k0 + j), r[j]);
    }
  for (int t = 0; t < d.T; ++t)
    for (int k = t < T ? hd : 0; k < d.hd; ++k) at(t, k) = X[t * ld + col + k];
  for (int k = 0; k < d.hd; ++k) std::fill(&at(d.T, k), &at(0, k + 1), 0.0f);
  zero_floats(dst + static_cast<size_t>(d.hd) * d.ts, d.panel() - static_cast<size_t>(d.hd) * d.ts);
}

// f(b, h, w) for every (batch, head) of `heads` heads, spread over the threads; w: the thread's
// workspace. One thread computes all of a head, so its bits do not depend on the thread count.
template <typename F>
void for_each_head(const AttnDims& d, int B, int heads, float* work, F&& f) {
  const size_t per_thread = attention_work_floats(d.T, d.hd);
  const bool par = B * heads > 1 && static_cast<size_t>(d.T) * d.T * d.hd >= kMinParallel / 8;
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bh = 0; bh < B * heads; ++bh)
    f(bh / heads, bh % heads, work + per_thread * static_cast<size_t>(omp_get_thread_num()));
}

// Rows [0, MR) of a score tile (online softmax): row r's scores s[0, valid[r]) of the nc columns
// (a multiple of W) the q . k tile wrote for its group of rows. With the row's running maximum m of
// the scaled scores alpha s and its running sum of exps kept as a vector l (lanes summed once, at
// the row's end), p = exp(alpha s - m_new) there, 0 in the rest of the nc columns (Masked; else
// every row has all nc). corr[r] = exp(m_old - m_new): the factor that rescales the row's output so
// far. Column by column over the rows, so that their exp chains interleave. The max pass only reads
// (alpha > 0 keeps the max).
template <int MR, bool Masked>
void softmax_rows(float* S, int nc, const int* valid, float alpha, float* m, float* l, float* corr) {
  const vf neg_inf = splat(-std::numeric_limits<float>::infinity());
  float m_new[MR];
  vf sum[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const float* s = S + r * kTileT;
    vf mx = neg_inf;
    for (int c = 0; c < nc; c += W) mx = vmax(mx, !Masked || lane_index() + c < valid[r] ? load(s + c) : neg_inf);
    m_new[r] = std::max(m[r], alpha * reduce_max(mx));
    sum[r] = vf{};
  }
  for (int c = 0; c < nc; c += W) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* s = S + r * kTileT + c;
      const vf e = vexp(load(s) * alpha - m_new[r]);
      const vf p = !Masked || lane_index() + c < valid[r] ? e : vf{};
      store(s, p);
      sum[r] += p;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const bool first = m[r] == -std::numeric_limits<float>::infinity();  // the row's first key tile: l unset
    corr[r] = first ? 0.0f : sexp(m[r] - m_new[r]);
    store(l + r * W, first ? sum[r] : load(l + r * W) * corr[r] + sum[r]);
    m[r] = m_new[r];
  }
}
using SoftmaxFn = void (*)(float*, int, const int*, float, float*, float*, float*);
template <int... MR>
constexpr auto softmax_table(std::integer_sequence<int, MR...>) {
  return std::array<SoftmaxFn, sizeof...(MR)>{&softmax_rows<MR + 1, true>...};
}
constexpr auto kDiagonalRows = softmax_table(std::make_integer_sequence<int, kMR>());

// softmax_rows for a group of mr rows of the tile products, nc = its columns. On the diagonal (rows
// of different lengths) the group at once: a row-by-row pass ended each short row on a mispredicted
// branch and ran its one exp chain alone (T 64: +7% at AVX2). Whole rows one at a time: their
// vectors are chains enough, and the group's registers slowed AVX-512 4% at T 256.
void softmax_group(float* S, int mr, int nc, const int* valid, float alpha, float* m, float* l, float* corr) {
  if (valid[0] < nc) return kDiagonalRows[mr - 1](S, nc, valid, alpha, m, l, corr);
  for (int r = 0; r < mr; ++r) softmax_rows<1, false>(S + r * kTileT, nc, valid + r, alpha, m + r, l + r * W, corr + r);
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int H, int Hkv, int A, float* work) {
  const AttnDims d(T, H, Hkv, A);
  const float alpha = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const long ld = d.ld();
  // A task per key/value head, its query heads in turn, K and V packed once, where that leaves each
  // thread several tasks to balance; else a task per query head, its key/value head packed again
  // (the same bits either way).
  const bool per_kv = B * Hkv >= 4 * omp_get_max_threads();
  for_each_head(d, B, per_kv ? Hkv : H, work, [&](int b, int task, float* w) {
    const int kvh = per_kv ? task : task / d.group(), h0 = per_kv ? kvh * d.group() : task,
              h1 = per_kv ? h0 + d.group() : task + 1;
    float *Kt = w, *panel_q = Kt + d.panel(), *panel_v = panel_q + d.panel(), *S = panel_v + d.panel();
    float *O = S + kTileT * kTileT, *m = O + static_cast<size_t>(kTileT) * d.hp;
    float* l = m + kTileT;  // a vector per row
    const float* rows = qkv + static_cast<size_t>(b) * T * ld;
    const Rows V = head_rows(rows, ld, d.v(kvh), d, panel_v, true);
    pack_transposed(Kt, rows, ld, d.k(kvh), d);
    for (int h = h0; h < h1; ++h) {
      const Rows Q = head_rows(rows, ld, d.q(h), d, panel_q, false);
      for (int i0 = 0; i0 < T; i0 += kTileT) {
        const int nq = std::min(kTileT, T - i0);
        std::fill(m, m + kTileT, -std::numeric_limits<float>::infinity());  // (the first key tile writes l and O)
        for (int j0 = 0; j0 < i0 + nq; j0 += kTileT) {  // key tiles up to the diagonal
          const int nk = std::min(kTileT, i0 + nq - j0);
          // rows [r0, r1) meet keys j < i0 + r1 (tile columns below i0 + r1 - j0)
          auto keys = [&](int r1) { return std::min(nk, i0 + r1 - j0); };
          causal_gemm(S, kTileT, Q.row(i0), Q.ld, 1, Kt + j0, d.ts, nq, false,  // q . k
                      [&](int, int r1) { return Extent{round_up(keys(r1), W), 0, d.hd}; });
          for (int r0 = 0; r0 < nq; r0 += kMR) {  // in the q . k tile's groups of rows; keys j <= i only
            const int mr = std::min(kMR, nq - r0);
            int valid[kMR];
            float corr[kMR];
            for (int r = 0; r < mr; ++r) valid[r] = keys(r0 + r + 1);
            softmax_group(S + r0 * kTileT, mr, round_up(valid[mr - 1], W), valid, alpha, m + r0, l + r0 * W, corr);
            for (int r = 0; r < mr; ++r) {
              float* o = O + (r0 + r) * d.hp;
              if (j0 > 0 && corr[r] != 1.0f)
                for (int k = 0; k < d.hp; k += W) store(o + k, load(o + k) * corr[r]);
            }
          }
          causal_gemm(O, d.hp, S, kTileT, 1, V.row(j0), V.ld, nq, j0 > 0,  // (+)= p v
                      [&](int, int r1) { return Extent{d.hp, 0, keys(r1)}; });
        }
        for (int r = 0; r < nq; ++r) {
          const int t = i0 + r;
          const float sum = reduce_add(load(l + r * W));
          store_scaled(out + (static_cast<size_t>(b) * T + t) * A + h * d.hd, O + r * d.hp, 1.0f / sum, d.hd);
          lse[(static_cast<size_t>(b) * H + h) * T + t] = m[r] + std::log(sum);
        }
      }
    }
  });
}

// FlashAttention-2's backward: per key tile j, over the query tiles i >= j: P = exp(S - lse),
// dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P (dP - D_i) with D_i = dO_i . O_i, dQ_i += dS K_j,
// dK_j += dS^T Q_i; then dq = alpha dQ, dk = alpha dK. One thread per key/value head: it runs the
// query heads that share it one after another, summing their dK and dV in head order.
void attention_backward(float* dqkv, const float* dout, const float* out, const float* lse, const float* qkv, int B,
                        int T, int H, int Hkv, int A, float* work) {
  const AttnDims d(T, H, Hkv, A);
  const float alpha = 1.0f / std::sqrt(static_cast<float>(d.hd));
  const long ld = d.ld();
  const size_t P = d.panel();
  for_each_head(d, B, Hkv, work, [&](int b, int kvh, float* w) {
    float *Kt = w, *Vt = Kt + P, *dQ = Vt + P, *dK = dQ + P, *dV = dK + P, *panel_q = dV + P, *panel_k = panel_q + P,
          *panel_do = panel_k + P;
    float *Pt = panel_do + P, *dP = Pt + kTileT * kTileT, *D = dP + kTileT * kTileT;
    const float* rows = qkv + static_cast<size_t>(b) * T * ld;
    const Rows K = head_rows(rows, ld, d.k(kvh), d, panel_k, true);
    pack_transposed(Kt, rows, ld, d.k(kvh), d);
    pack_transposed(Vt, rows, ld, d.v(kvh), d);
    for (int h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
      const float* row_lse = lse + (static_cast<size_t>(b) * H + h) * T;
      const Rows Q = head_rows(rows, ld, d.q(h), d, panel_q, true),
                 dO = head_rows(dout + static_cast<size_t>(b) * T * A, A, d.q(h), d, panel_do, true);
      for (int t = 0; t < T; ++t) D[t] = row_dot(dO.row(t), out + (static_cast<size_t>(b) * T + t) * A + d.q(h), d.hd);
      for (int j0 = 0; j0 < T; j0 += kTileT) {
        const int nk = std::min(kTileT, T - j0), nkp = round_up(nk, W);
        float *dKj = dK + static_cast<size_t>(j0) * d.hp, *dVj = dV + static_cast<size_t>(j0) * d.hp;
        for (int i0 = j0; i0 < T; i0 += kTileT) {
          const int nq = std::min(kTileT, T - i0);
          auto keys = [&](int r1) { return std::min(nk, i0 + r1 - j0); };  // of query rows [.., r1)
          auto scores = [&](int, int r1) { return Extent{round_up(keys(r1), W), 0, d.hd}; };
          causal_gemm(Pt, kTileT, Q.row(i0), Q.ld, 1, Kt + j0, d.ts, nq, false, scores);    // q . k
          causal_gemm(dP, kTileT, dO.row(i0), dO.ld, 1, Vt + j0, d.ts, nq, false, scores);  // do . v
          for (int r = 0; r < nq; ++r) {
            float *p = Pt + r * kTileT, *dp = dP + r * kTileT;
            const int valid = std::min(nk, i0 + r - j0 + 1);
            const float lr = row_lse[i0 + r], Dr = D[i0 + r];
            int c = 0;
            for (; c < valid; c += W) {
              const vi live = lane_index() + c < valid;
              const vf pv = live ? vexp(load(p + c) * alpha - lr) : vf{};  // masked lanes: later keys (selected away)
              store(p + c, pv);
              store(dp + c, live ? pv * (load(dp + c) - Dr) : vf{});
            }
            for (; c < nkp; c += W) store(p + c, vf{}), store(dp + c, vf{});
          }
          // key rows [c0, ..) meet queries i >= j0 + c0 (tile rows from j0 + c0 - i0)
          auto queries = [&](int c0, int) { return Extent{d.hp, std::max(0, j0 + c0 - i0), nq}; };
          // Each sum's first term writes (no zeroing): dQ_i's at j = 0, dK_j's and dV_j's at the group's
          // first head and i = j, where every key row below nk meets a query.
          const bool kv_acc = h > kvh * d.group() || i0 > j0;
          causal_gemm(dVj, d.hp, Pt, 1, kTileT, dO.row(i0), dO.ld, nkp, kv_acc, queries);  // (+)= P^T dO
          causal_gemm(dQ + static_cast<size_t>(i0) * d.hp, d.hp, dP, kTileT, 1, K.row(j0), K.ld, nq, j0 > 0,
                      [&](int, int r1) { return Extent{d.hp, 0, keys(r1)}; });               // (+)= dS K
          causal_gemm(dKj, d.hp, dP, 1, kTileT, Q.row(i0), Q.ld, nkp, kv_acc, queries);     // (+)= dS^T Q
        }
      }
      for (int t = 0; t < T; ++t)
        store_scaled(dqkv + (static_cast<size_t>(b) * T + t) * ld + d.q(h), dQ + static_cast<size_t>(t) * d.hp, alpha,
                     d.hd);
    }
    for (int t = 0; t < T; ++t) {
      float* g = dqkv + (static_cast<size_t>(b) * T + t) * ld;
      store_scaled(g + d.k(kvh), dK + static_cast<size_t>(t) * d.hp, alpha, d.hd);
      store_scaled(g + d.v(kvh), dV + static_cast<size_t>(t) * d.hp, 1.0f, d.hd);
    }
  });
}

// ---- cross-entropy ----

void crossentropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int N, int V, int ld,
                  float dloss) {
  for_rows(N, V, [=](int n) {
    const float* z = logits + static_cast<size_t>(n) * ld;
    const float mx = row_max(z, V), zt = z[targets[n]];  // read before dz (may alias z) is written
    float* dz = dlogits ? dlogits + static_cast<size_t>(n) * ld : nullptr;
    const float sum = row_sumexp(dz, z, V, mx);
    if (dz) {
      const float s = dloss / sum;
      for (int i = 0; i < V; ++i) dz[i] *= s;
      dz[targets[n]] -= dloss;
      std::fill(dz + V, dz + ld, 0.0f);  // the padding: no gradient
    }
    losses[n] = std::log(sum) + (mx - zt);
  });
}

void vocab_row_max(float* rmax, const float* logits, int N, int V, int ld) {
  for_rows(N, V, [=](int n) { rmax[n] = row_max(logits + static_cast<size_t>(n) * ld, V); });
}

void vocab_sumexp(float* sumexp, float* target_logit, const float* logits, const float* rmax, const int32_t* targets,
                  int vocab_start, int N, int V, int ld) {
  for_rows(N, V, [=](int n) {
    const float* z = logits + static_cast<size_t>(n) * ld;
    sumexp[n] = row_sumexp(nullptr, z, V, rmax[n]);
    const int t = targets[n] - vocab_start;
    target_logit[n] = t >= 0 && t < V ? z[t] : 0.0f;
  });
}

void vocab_crossentropy_grad(float* dlogits, const float* logits, const float* rmax, const float* sumexp,
                             const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) {
  for_rows(N, V, [=](int n) {
    const size_t o = static_cast<size_t>(n) * ld;
    const float s = dloss / sumexp[n], mx = rmax[n];
    map_vf<kWide>(0, V, [=](size_t i, int k) {
      store_wide(dlogits + o + i, vexp(load_wide(logits + o + i, k) - mx) * s, k);
    });
    const int t = targets[n] - vocab_start;
    if (t >= 0 && t < V) dlogits[o + t] -= dloss;
    std::fill(dlogits + o + V, dlogits + o + ld, 0.0f);  // the padding: no gradient
  });
}

// ---- optimizer, 16-bit casts ----

typedef uint32_t vu __attribute__((vector_size(4 * W)));
inline vu bits_of(vf v) {
  vu u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
inline vf from_bits(vu u) {
  vf v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// math::bf16_from_float / fp16_from_float / float_from_fp16 (dtype.h), lane-wise and branch-free:
// every branch of the scalar code is computed and the lanes pick theirs.
// bf16: the result in each lane's high half (the low half is left as it falls; store_high16 and
// load_high16 move high halves), rounded to nearest even, NaN (one float compare) kept quiet. SSE2
// has no blend (a select is three operations): a NaN lane's rounding is masked off instead.
inline vu bf16_high(vf v) {
  const vu u = bits_of(v);
#if defined(__SSE2__) && !defined(__AVX__)
  const vu nan = reinterpret_cast<vu>(v != v);
  return (u + ((0x7fffu + ((u >> 16) & 1u)) & ~nan)) | (nan & 0x400000u);
#else
  return v != v ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
#endif
}
inline vu fp16_bits(vu u) {
  const vu sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // subnormal in fp16: |f| * 2^24 rounded half to even
  const vf v = from_bits(a) * 16777216.0f;
  vu q = __builtin_convertvector(__builtin_convertvector(v, vi), vu);
  const vf rem = v - __builtin_convertvector(__builtin_convertvector(q, vi), vf);
  q += (rem > 0.5f) | ((rem == 0.5f) & ((q & 1u) != 0)) ? vu{} + 1u : vu{};
  const vu normal = (a + 0xfffu + ((a >> 13) & 1u) - ((127u - 15u) << 23)) >> 13;
  vu r = a < 0x38800000u ? q : normal;
  r = a >= 0x477ff000u ? vu{} + 0x7c00u : r;
  r = a > 0x7f800000u ? vu{} + 0x7e00u : r;
  return sign | r;
}
inline vf fp16_value(vu h) {
  const vu sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  const vu normal = sign | ((e + (127u - 15u)) << 23) | (m << 13);
  const vu special = sign | 0x7f800000u | (m << 13);
  const vu sub = sign | bits_of(__builtin_convertvector(__builtin_convertvector(m, vi), vf) * 5.9604644775390625e-8f);
  return from_bits(e == 0u ? sub : e == 31u ? special : normal);
}

template <typename F>
void cast_loop(size_t n, F&& f) {  // f(i, k): lanes [i, i + k)
  for_blocks(n, [&f](size_t b, size_t e) { map_vf(b, e, f); });
}
// Whole vectors widen and narrow by __builtin_convertvector: unpacks and packs at every level (the
// lane loop below, kept for tails, compiled to a scalar extract per lane on SSE2: 32% of the copy
// bound there). Narrowing keeps the low 16 bits; the values are below 2^16 already.
typedef uint16_t vh __attribute__((vector_size(2 * W)));
inline vu load_u16(const uint16_t* p, int k) {
  if (k == W) {
    vh h;
    std::memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, vu);
  }
  uint16_t t[W] = {};
  std::memcpy(t, p, sizeof(uint16_t) * k);
  vu v;
  for (int i = 0; i < W; ++i) v[i] = t[i];
  return v;
}
inline void store_u16(uint16_t* p, vu v, int k) {
#if defined(__SSE2__) && !defined(__AVX__)
  if (k == W) {  // the low halves sign-extended, then one signed pack (GCC's convert: 5 unpacks)
    const __m128i w = _mm_srai_epi32(_mm_slli_epi32(reinterpret_cast<__m128i>(v), 16), 16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(w, w));
    return;
  }
#endif
  if (k == W) {
    const vh h = __builtin_convertvector(v, vh);
    std::memcpy(p, &h, sizeof h);
    return;
  }
  uint16_t t[W];
  for (int i = 0; i < W; ++i) t[i] = static_cast<uint16_t>(v[i]);
  std::memcpy(p, t, sizeof(uint16_t) * k);
}

// The 16-bit values at p as the high halves of 32-bit lanes (low halves 0), and back.
inline vu load_high16(const uint16_t* p, int k) {
#if defined(__SSE2__) && !defined(__AVX__)
  if (k == W) {  // one unpack with zeros (GCC's convert and shift: three ops)
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return reinterpret_cast<vu>(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
  }
#endif
  return load_u16(p, k) << 16;
}
#if defined(__SSE2__) && !defined(__AVX__)
// a's then b's high halves as 8 16-bit values: sign-extended, one signed pack (GCC's shift and
// convert: six ops a vector).
inline __m128i high_halves(vu a, vu b) {
  return _mm_packs_epi32(_mm_srai_epi32(reinterpret_cast<__m128i>(a), 16), _mm_srai_epi32(reinterpret_cast<__m128i>(b), 16));
}
#endif
inline void store_high16(uint16_t* p, vu v, int k) {
#if defined(__SSE2__) && !defined(__AVX__)
  if (k == W) return _mm_storel_epi64(reinterpret_cast<__m128i*>(p), high_halves(v, v));
#endif
  store_u16(p, v >> 16, k);
}

// bf16 results f(i, k) (in high halves) stored at out + i. On SSE2 two vectors at a time: one
// signed pack and one 16-byte store for 8 values.
template <typename F>
void narrow_bf16_loop(uint16_t* out, size_t n, F&& f) {
  for_blocks(n, [&f, out](size_t b, size_t e) {
    size_t i = b;
#if defined(__SSE2__) && !defined(__AVX__)
    for (; i + 2 * W <= e; i += 2 * W)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), high_halves(f(i, W), f(i + W, W)));
#endif
    map_vf(i, e, [&f, out](size_t j, int k) { store_high16(out + j, f(j, k), k); });
  });
}
void cast_to_bf16(uint16_t* out, const float* x, size_t n) {
  narrow_bf16_loop(out, n, [=](size_t i, int k) { return bf16_high(load_n(x + i, k)); });
}
void cast_from_bf16(float* out, const uint16_t* x, size_t n) {
  cast_loop(n, [=](size_t i, int k) { store_n(out + i, from_bits(load_high16(x + i, k)), k); });
}
void cast_to_fp16(uint16_t* out, const float* x, size_t n) {
  cast_loop(n, [=](size_t i, int k) { store_u16(out + i, fp16_bits(bits_of(load_n(x + i, k))), k); });
}
void cast_from_fp16(float* out, const uint16_t* x, size_t n) {
  cast_loop(n, [=](size_t i, int k) { store_n(out + i, fp16_value(load_u16(x + i, k)), k); });
}
void accumulate_bf16(uint16_t* acc, const float* x, size_t n) {
  narrow_bf16_loop(acc, n, [=](size_t i, int k) { return bf16_high(from_bits(load_high16(acc + i, k)) + load_n(x + i, k)); });
}
void accumulate_fp16(uint16_t* acc, const float* x, size_t n) {
  cast_loop(n, [=](size_t i, int k) {
    const vf sum = fp16_value(load_u16(acc + i, k)) + load_n(x + i, k);
    store_u16(acc + i, fp16_bits(bits_of(sum)), k);
  });
}

// The update of a block, then (with p16) its rounding to 16 bits while the block is in cache.
void adam_step(float* p, float* m, float* v, const float* g, size_t n, const math::AdamParams& a, uint16_t* p16,
               bool fp16) {
  const math::AdamParams prm = a;
  for_blocks(n, [=, &prm](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) math::adam_element(p + i, m + i, v + i, g[i], prm);
    if (!p16) return;
    if (fp16) map_vf(b, e, [=](size_t i, int k) { store_u16(p16 + i, fp16_bits(bits_of(load_n(p + i, k))), k); });
    else map_vf(b, e, [=](size_t i, int k) { store_high16(p16 + i, bf16_high(load_n(p + i, k)), k); });
  });
}

// ---- reductions: per fixed block, then the blocks in order ----

// Floats widen to doubles a register at a time: 4 in a ymm on AVX2 and up, 2 in an xmm on SSE2 and
// the generic level. (One 8-double vector was split lane by lane on AVX2, 8% of the copy bound; a
// 4-double one on SSE2 kept its accumulators on the stack, 43-53%.)
constexpr int kDW = W >= 8 ? 4 : 2, kParts = 8 / kDW;  // doubles a register, registers for 8 floats
typedef double vd __attribute__((vector_size(8 * kDW)));
typedef float vfd __attribute__((vector_size(4 * kDW)));  // the floats one vd holds widened
inline void widen8(const float* p, vd (&v)[kParts]) {  // p[0, 8) as doubles, in order
#if defined(__SSE2__) && !defined(__AVX__)
  for (int h = 0; h < 2; ++h) {  // (GCC converts a 2-float vector by two scalar cvtss2sd)
    const vf f = load(p + 4 * h);
    v[2 * h] = _mm_cvtps_pd(f);
    v[2 * h + 1] = _mm_cvtps_pd(_mm_movehl_ps(f, f));
  }
#else
  for (int q = 0; q < kParts; ++q) {
    vfd f;
    std::memcpy(&f, p + q * kDW, sizeof f);
    v[q] = __builtin_convertvector(f, vd);
  }
#endif
}

template <typename F>
double block_sum(size_t n, F&& f) {  // f(begin, end) -> double
  const size_t blocks = (n + kBlock - 1) / kBlock;
  double partial_stack[4096];  // 64 Mi elements; beyond, a heap array
  std::vector<double> partial_heap;
  double* partial = blocks <= 4096 ? partial_stack : (partial_heap.resize(blocks), partial_heap.data());
#pragma omp parallel for schedule(static) if (n >= kMinParallel)
  for (long b = 0; b < static_cast<long>(blocks); ++b)
    partial[b] = f(static_cast<size_t>(b) * kBlock, std::min(n, static_cast<size_t>(b + 1) * kBlock));
  double s = 0;
  for (size_t b = 0; b < blocks; ++b) s += partial[b];
  return s;
}

// kPairs accumulator groups: an add's latency times its ports on AVX2 and up; on SSE2 two (8 of its
// 16 xmm). Group p takes the 8 floats at i + 8p; the groups join in index order, then the 8 lanes
// in one fixed tree.
constexpr int kPairs = W >= 8 ? 4 : 2;
double sum_squares(const float* x, size_t n) {
  return block_sum(n, [=](size_t b, size_t e) {
    vd acc[kPairs][kParts] = {};
    size_t i = b;
    auto add8 = [&](int p, size_t j) {
      vd v[kParts];
      widen8(x + j, v);
#pragma GCC unroll 4
      for (int q = 0; q < kParts; ++q) acc[p][q] += v[q] * v[q];
    };
    for (; i + 8 * kPairs <= e; i += 8 * kPairs)
#pragma GCC unroll 4
      for (int p = 0; p < kPairs; ++p) add8(p, i + 8 * p);
    for (; i + 8 <= e; i += 8) add8(0, i);
#pragma GCC unroll 4
    for (int p = 1; p < kPairs; ++p)
#pragma GCC unroll 4
      for (int q = 0; q < kParts; ++q) acc[0][q] += acc[p][q];
    double t[8];  // the double of float i + k in t[k]
    std::memcpy(t, acc[0], sizeof t);
    double s = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    for (; i < e; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  });
}

// ---- the FMA ceiling ----

double fma_peak(double seconds) {
  constexpr int kChains = 12;  // independent accumulators: enough to cover FMA latency x ports
  vf acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = splat(1.0f + c * 1e-3f);
  const vf a = splat(0.999999f), b = splat(1e-7f);
  const double t0 = omp_get_wtime();
  long iters = 0;
  double elapsed = 0;
  do {
    for (int r = 0; r < 4096; ++r) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;  // a dependency chain each: no shortcut
    }
    iters += 4096;
    elapsed = omp_get_wtime() - t0;
  } while (elapsed < seconds);
  vf s{};
  for (int c = 0; c < kChains; ++c) s += acc[c];
  volatile float sink = reduce_add(s);
  (void)sink;
  return 2.0 * W * kChains * static_cast<double>(iters) / elapsed;
}

}  // namespace

extern const Kernels kernels;  // found by cpu_kernels.cpp
const Kernels kernels = {
    Z3D_STR(ZERO3D_ISA),
    embedding_forward, embedding_backward, layernorm_forward, layernorm_backward, add_bias, bias_backward,
    gelu_forward, gelu_backward, accumulate, scale, attention_forward, attention_backward, rmsnorm_forward,
    rmsnorm_backward, rope, swiglu_forward, swiglu_backward, crossentropy,
    vocab_row_max, vocab_sumexp, vocab_crossentropy_grad, adam_step, cast_to_bf16, cast_from_bf16, cast_to_fp16,
    cast_from_fp16, accumulate_bf16, accumulate_fp16, exp, sum_squares, fma_peak,
};

}  // namespace zero3d::cpu::ZERO3D_ISA
