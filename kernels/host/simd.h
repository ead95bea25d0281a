// kernels/host/simd.h: the vector type the host kernels are written in, and the math on it.
// `vf` is one register of the ISA level the file is compiled for (kernels/host/cpu_kernels_isa.cpp
// is compiled once per level): 16 floats in a zmm on AVX-512, 8 in a ymm on AVX2, 4 in an xmm on
// SSE2 and on the generic level (NEON's width on aarch64). A vector wider than the registers
// would be split by the compiler into several, and kernels that keep a dozen vectors live (tiles,
// exp's constants, the FMA peak's chains) would spill on the narrower levels; one register per vf
// keeps each kernel's register count what its comment says. `kRegs` is the level's vector register
// count, which the tile shapes are chosen against.
//
// Reductions add lanes in one fixed tree order (lane i with i + W/2, then i + W/4, ...), so a
// result does not depend on the thread count (threads split rows, never a row's sum); it does
// depend on the level, as W does (and FMA contraction): bits are fixed for a given machine and level.
//
// vexp is Cody-Waite range reduction (x = n ln2 + r, |r| <= ln2/2), a degree-6 polynomial for
// e^r fitted to minimise the relative error over that interval (1.9e-9, well under float's 6e-8),
// then 2^n: vscalefps on AVX-512, elsewhere n added into the exponent bits of the scale. Within 2
// ulp of expf over [-87.3, 88.3] (1 ulp measured at every level; tested against double exp in
// test_kernels). Below -87.3 (and for -inf) it returns exactly 0, above 88.3 it saturates at
// e^88.3 (finite); NaN stays NaN. Its cost sets the rate of every softmax and of GELU: 13 vector
// ops on AVX-512, 16 on AVX2 (the degree-7 Taylor form it replaced took 18).
// It takes one vf or a vn<U> (U registers, the operations interleaved; see vn below).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace zero3d::cpu::simd {

#if defined(__AVX512F__)
constexpr int W = 16, kRegs = 32;
#elif defined(__AVX2__)
constexpr int W = 8, kRegs = 16;
#elif defined(__aarch64__)
constexpr int W = 4, kRegs = 32;
#else
constexpr int W = 4, kRegs = 16;  // SSE2 (x86-64 has 16 xmm) and any other target
#endif
typedef float vf __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// A broadcast, written as the initializer {x, x, ..., x}: one vbroadcastss. (vf{} + x would add
// 0.0: not foldable, -0 + 0 = +0; a loop over the lanes compiles to W masked inserts.)
template <size_t... I>
inline vf splat_lanes(float x, std::index_sequence<I...>) {
  return vf{((void)I, x)...};
}
inline vf splat(float x) { return splat_lanes(x, std::make_index_sequence<W>()); }
template <size_t... I>
inline vi lane_index(std::index_sequence<I...>) {
  return vi{static_cast<int32_t>(I)...};
}
inline vi lane_index() { return lane_index(std::make_index_sequence<W>()); }  // {0, 1, ..., W - 1}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }

// Lane sums and maxima in the fixed pairwise order (the low half with the high half, down to two
// lanes), in registers: the halves are shuffles. (Copying them out with memcpy takes the vector's
// address, and GCC then kept a row sum's accumulator in memory for the whole loop: a store and a
// reload per vector, which cut LayerNorm's forward to a third on AVX-512.)
template <typename V, size_t... I>
inline auto low_half(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...);
}
template <typename V, size_t... I>
inline auto high_half(V v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}
template <typename V, typename Op>
inline float reduce(V v, Op op) {
  constexpr size_t n = sizeof(V) / sizeof(float);
  if constexpr (n == 2) {
    return op(v[0], v[1]);
  } else {
    constexpr auto half = std::make_index_sequence<n / 2>();
    return reduce(op(low_half(v, half), high_half(v, half)), op);
  }
}
inline float reduce_add(vf v) {
  return reduce(v, [](auto x, auto y) { return x + y; });
}
inline float reduce_max(vf v) {
  return reduce(v, [](auto x, auto y) { return x > y ? x : y; });
}

// min(hi, x), NaN passing through: one minps (which returns its second operand when either is
// NaN). GCC compiles the portable `hi < x ? hi : x` to a compare and a blend on AVX-512.
inline vf clamp_above(vf x, vf hi) {
#if defined(__AVX512F__)
  return _mm512_maskz_min_ps(0xffff, hi, x);  // all lanes: _mm512_min_ps trips GCC 12's -Wmaybe-uninitialized
#elif defined(__AVX2__)
  return _mm256_min_ps(hi, x);
#elif defined(__SSE2__)
  return _mm_min_ps(hi, x);
#else
  return hi < x ? hi : x;
#endif
}

// vn<U>: U registers of the level as one value, each operation applied to all U before the next.
// An elementwise kernel built on exp is one long chain of dependent operations per vector (exp's
// 16, then GELU's or SiLU's); one vector at a time, the core found too few independent operations
// in its window. Written U at a time, the chains interleave in the program.
// GELU's backward (1 thread, Zen 5, in L2, best of 3 rounds), U = 4 against one vector:
// AVX2 1.63 -> 2.03 G elements/s, SSE2 0.58 -> 0.73, AVX-512 3.23 -> 3.78; U = 2 gained half of
// that or less. The same operations in the same order per lane: the same bits.
template <int U>
struct vn {
  vf r[U];
};
// Forced inline: GCC otherwise calls vexp<vn<4>> out of line, passing U registers through the stack.
#define Z3D_INLINE inline __attribute__((always_inline))
#define Z3D_INLINE_LAMBDA __attribute__((always_inline))  // after a lambda's parameter list
#define Z3D_VN_BINARY(op)                                                          \
  template <int U>                                                                 \
  Z3D_INLINE vn<U> operator op(vn<U> a, vn<U> b) {                                 \
    _Pragma("GCC unroll 8") for (int u = 0; u < U; ++u) a.r[u] = a.r[u] op b.r[u]; \
    return a;                                                                      \
  }                                                                                \
  template <int U>                                                                 \
  Z3D_INLINE vn<U> operator op(vn<U> a, float b) {                                 \
    _Pragma("GCC unroll 8") for (int u = 0; u < U; ++u) a.r[u] = a.r[u] op b;      \
    return a;                                                                      \
  }                                                                                \
  template <int U>                                                                 \
  Z3D_INLINE vn<U> operator op(float a, vn<U> b) {                                 \
    _Pragma("GCC unroll 8") for (int u = 0; u < U; ++u) b.r[u] = a op b.r[u];      \
    return b;                                                                      \
  }
Z3D_VN_BINARY(+)
Z3D_VN_BINARY(-)
Z3D_VN_BINARY(*)
Z3D_VN_BINARY(/)
#undef Z3D_VN_BINARY
// f applied to each of the U registers.
template <int U, typename F>
Z3D_INLINE vn<U> each_register(vn<U> x, F f) {
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) x.r[u] = f(x.r[u]);
  return x;
}
template <int U>
Z3D_INLINE vn<U> operator-(vn<U> a) {
  return each_register(a, [](vf v) { return -v; });
}
// max(lo, x), NaN passing through, as clamp_above.
inline vf clamp_below(vf x, vf lo) {
#if defined(__AVX512F__)
  return _mm512_maskz_max_ps(0xffff, lo, x);
#elif defined(__AVX2__)
  return _mm256_max_ps(lo, x);
#elif defined(__SSE2__)
  return _mm_max_ps(lo, x);
#else
  return lo > x ? lo : x;
#endif
}
inline vf clamp_below(vf x, float lo) { return clamp_below(x, splat(lo)); }
inline vf clamp_above(vf x, float hi) { return clamp_above(x, splat(hi)); }
template <int U>
Z3D_INLINE vn<U> clamp_below(vn<U> x, float lo) {
  return each_register(x, [=](vf v) { return clamp_below(v, lo); });
}
template <int U>
Z3D_INLINE vn<U> clamp_above(vn<U> x, float hi) {
  return each_register(x, [=](vf v) { return clamp_above(v, hi); });
}

// exp's last step without the cut: p 2^n, the argument clamped at -87.3 so that 2^n stays a normal
// float. big holds n in its low mantissa bits.
inline vf exp_scale_clamped(vf p, vf n, vf big) {
#if defined(__AVX512F__)
  (void)big;
  return _mm512_maskz_scalef_ps(0xffff, p, n);
#else
  (void)n;
  vi bits;
  std::memcpy(&bits, &big, sizeof bits);
  const vi e = (bits + 127) << 23;  // (n + 127) << 23: the shift drops magic's own bits
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
#endif
}
// With the cut: exactly 0 where x (the argument, before clamping) is below -87.3 or -inf.
inline vf exp_scale(vf p, vf n, vf big, vf x) {
  const vf lo = splat(-87.3f);
#if defined(__AVX512F__)
  (void)big;
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // not below lo: NaN is kept
  return _mm512_maskz_scalef_ps(keep, p, n);
#else
  return x < lo ? vf{} : exp_scale_clamped(p, n, big);  // also -inf; those lanes' arithmetic is discarded
#endif
}
template <int U>
Z3D_INLINE vn<U> exp_scale(vn<U> p, vn<U> n, vn<U> big, vn<U> x) {
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p.r[u] = exp_scale(p.r[u], n.r[u], big.r[u], x.r[u]);
  return p;
}
template <int U>
Z3D_INLINE vn<U> exp_scale_clamped(vn<U> p, vn<U> n, vn<U> big) {
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) p.r[u] = exp_scale_clamped(p.r[u], n.r[u], big.r[u]);
  return p;
}

// Cut: e^x, 0 below -87.3 (vexp). Else the argument is clamped to [-87.3, 88.3] first, so that below
// -87.3 it gives e^-87.3 (1.2e-38) in place of 0: for a sigmoid's 1 + e^x, where 1 + either is 1,
// and one operation fewer on AVX2 and SSE2 (a max for the compare and the select). AVX-512 cuts
// with a mask in its scalef for free: there the clamp made GELU and SwiGLU 10% slower, so
// vexp_clamped is vexp (AVX2 GELU forward +9%, SwiGLU +7-12%; SSE2 +3-5%; 1 thread, Zen 5).
template <bool Cut, typename V>  // vf or vn<U>
Z3D_INLINE V vexp_impl(V x) {
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V c = Cut ? clamp_above(x, 88.3f) : clamp_below(clamp_above(x, 88.3f), -87.3f);
  const V big = c * 1.44269504088896341f + magic;  // its low mantissa bits hold n
  const V n = big - magic;
  V r = c - n * 0.693359375f;  // ln2 split: hi part exact in 9 bits, so n * hi is exact
  r = r - n * -2.12194440e-4f;
  V p = r * 1.384365372e-3f + 8.374155499e-3f;
  p = p * r + 4.166800156e-2f;
  p = p * r + 1.666643173e-1f;
  p = p * r + 4.999999404e-1f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  if constexpr (Cut) return exp_scale(p, n, big, x);
  else return exp_scale_clamped(p, n, big);
}
template <typename V>
Z3D_INLINE V vexp(V x) {
  return vexp_impl<true>(x);
}
template <typename V>
Z3D_INLINE V vexp_clamped(V x) {  // for 1 + e^x
#if defined(__AVX512F__)
  return vexp_impl<true>(x);
#else
  return vexp_impl<false>(x);
#endif
}

// Scalar twin for row tails: the same polynomial through one lane.
inline float sexp(float x) {
  vf v = splat(x);
  return vexp(v)[0];
}

}  // namespace zero3d::cpu::simd
