// 16-bit floating point formats as raw bits, convertible on host and device alike.
// float -> 16 bit rounds to nearest even; NaN stays NaN; overflow becomes inf (fp16) as in CUDA.
#pragma once
#include <cstdint>
#include <cstring>
#include "kernels/math/common.h"

namespace zero3d::math {

Z3D_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
Z3D_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

Z3D_HD uint16_t bf16_from_float(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
Z3D_HD float float_from_bf16(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

Z3D_HD uint16_t fp16_from_float(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // subnormal or zero in fp16: scale into integer units of 2^-24
    float v = bits_float(a) * 16777216.0f;  // exact: a power-of-two scale
    uint32_t q = static_cast<uint32_t>(v);
    float rem = v - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xfffu + mant_odd;  // round to nearest even on the 13 dropped bits
  a -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (a >> 13));
}

Z3D_HD float float_from_fp16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 127u - 15u) << 23) | (m << 13));
}

// An activation element as the templated kernels (CUDA, Kokkos) keep it: fp32, or bf16 carried as
// its bits; read widened, written rounded once, so the math between stays fp32.
Z3D_HD float load(const float* p) { return *p; }
Z3D_HD float load(const uint16_t* p) { return float_from_bf16(*p); }
Z3D_HD void store(float* p, float v) { *p = v; }
Z3D_HD void store(uint16_t* p, float v) { *p = bf16_from_float(v); }

}  // namespace zero3d::math
