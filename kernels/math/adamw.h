// AdamW, one element, DeepSpeed's update in adam_w_mode (decoupled weight decay):
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd * p )
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t (both 1 without bias correction). With adam_w_mode off
// (classic Adam with L2), wd * p is added to g before the moments instead.
// Computed as DeepSpeed's CPU Adam (csrc/includes/cpu_adam.h) orders it: the decay first, then
// p -= (lr / bc1) * m / (sqrt(v) * (1 / sqrt(bc2)) + eps), the two scalars taken once a step. One
// division and one square root an element, where FusedAdam's order takes three divisions; the
// divider bounded the loop (alone, 1 thread, Zen 5, 65536 elements in cache: SSE2 1.04 -> 1.87 G
// elements/s, AVX2 2.0 -> 3.5, AVX-512 3.9 -> 5.1). The same real-number update; the roundings
// differ from FusedAdam's within an ulp or two.
#pragma once
#include <cmath>
#include <cstdint>
#include "kernels/math/common.h"

namespace zero3d::math {

// The bytes one element's update moves: p, m, v read and written, g read (the backends' profiles
// count adam_step so).
constexpr double kAdamBytesPerElement = 28;

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;               // lr / bc1, bc1 = 1 - beta1^t
  float bias_correction2_rsqrt;  // 1 / sqrt(bc2), bc2 = 1 - beta2^t
  bool decoupled;                // AdamW (true) or Adam + L2 (false)
};

// Step t's parameters (t >= 1). The bias corrections as multi_tensor_adam.cu takes them: pow in
// double of the fp32-rounded betas; both 1 without bias correction.
inline AdamParams adam_params(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
                              bool bias_correction, bool decoupled) {
  AdamParams a{};
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.eps = static_cast<float>(eps);
  a.weight_decay = static_cast<float>(weight_decay);
  const double bc1 = bias_correction ? 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(t)) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(t)) : 1.0;
  a.step_size = static_cast<float>(lr / bc1);
  a.bias_correction2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  a.decoupled = decoupled;
  return a;
}

Z3D_HD void adam_element(float* p, float* m, float* v, float g, const AdamParams& a) {
  float pv = *p;
  if (!a.decoupled) g += a.weight_decay * pv;
  float mv = a.beta1 * *m + (1.0f - a.beta1) * g;
  float vv = a.beta2 * *v + (1.0f - a.beta2) * g * g;
  float denom = sqrtf(vv) * a.bias_correction2_rsqrt + a.eps;
  if (a.decoupled) pv -= a.lr * a.weight_decay * pv;
  *p = pv - a.step_size * (mv / denom);
  *m = mv;
  *v = vv;
}

}  // namespace zero3d::math
