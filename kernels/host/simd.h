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
inline vf splat(float x) { return vf{} + x; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }

// Lane sums and maxima in a fixed pairwise order (8+8, 4+4, 2+2, 1+1).
inline float reduce_add(vf v) {
  float t[W];
  store(t, v);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}
inline float reduce_max(vf v) {
  float t[W];
  store(t, v);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] = t[i] > t[i + w] ? t[i] : t[i + w];
  return t[0];
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
