// kernels/host/simd.h: the vector type the host kernels are written in, and the math on it.
// `vf` is 16 floats as a GCC vector: one zmm register where the ISA level has AVX-512, two ymm
// on AVX2, four xmm on SSE2; kernels/host/cpu_kernels_isa.cpp is compiled once per level, so the
// same source becomes each level's code. Reductions add lanes in one fixed tree order, so a
// result does not depend on the thread count (threads split rows, never a row's sum).
//
// vexp is Cody-Waite range reduction (x = n ln2 + r, |r| <= ln2/2) and the degree-7 Taylor
// polynomial of e^r (truncation r^8/8! < 6e-9 relative), then 2^n put into the exponent bits:
// within 2 ulp of expf over [-87.3, 88.3] (tested against double exp in test_kernels). Below
// -87.3 (and for -inf) it returns exactly 0, above 88.3 it saturates at e^88.3 (finite); NaN stays NaN.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zero3d::cpu::simd {

constexpr int W = 16;  // lanes of vf
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float x) {  // a broadcast (vf{} + x would add 0.0: not foldable, -0 + 0 = +0)
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }

// Lane sums and maxima in a fixed pairwise order (lane i with i+8, then i+4, i+2, i+1), in
// registers.
template <typename Op>
inline float reduce(vf v, Op op) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  typedef float v2 __attribute__((vector_size(8)));
  const v8 a = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  const v4 b = op(__builtin_shufflevector(a, a, 0, 1, 2, 3), __builtin_shufflevector(a, a, 4, 5, 6, 7));
  const v2 c = op(__builtin_shufflevector(b, b, 0, 1), __builtin_shufflevector(b, b, 2, 3));
  return op(c[0], c[1]);
}
inline float reduce_add(vf v) {
  return reduce(v, [](auto x, auto y) { return x + y; });
}
inline float reduce_max(vf v) {
  return reduce(v, [](auto x, auto y) { return x > y ? x : y; });
}

inline vf vexp(vf x) {
  const vf lo = splat(-87.3f), hi = splat(88.3f);
  const vi underflow = x < lo;  // also -inf
  x = x > hi ? hi : x;  // written so that NaN passes both (comparisons with NaN are false)
  x = x < lo ? lo : x;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf n = x * 1.44269504088896341f + magic;
  n -= magic;
  vf r = x - n * 0.693359375f;  // ln2 split: hi part exact in 9 bits, so n * hi is exact
  r -= n * -2.12194440e-4f;
  vf p = splat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  const vf y = p * scale;
  return underflow ? vf{} : y;
}

// Scalar twin for row tails: the same polynomial through one lane.
inline float sexp(float x) {
  vf v = splat(x);
  return vexp(v)[0];
}

}  // namespace zero3d::cpu::simd
