// AdamW, one element, as DeepSpeed's FusedAdam in adam_w_mode (decoupled weight decay):
//   m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd * p )
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t (both 1 without bias correction). With adam_w_mode off
// (classic Adam with L2), wd * p is added to g before the moments instead.
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

// The bytes one element's update moves: p, m, v read and written, g read (the backends' profiles
// count adam_step so).
constexpr double kAdamBytesPerElement = 28;

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  bool decoupled;               // AdamW (true) or Adam + L2 (false)
};

Z3D_HD void adam_element(float* p, float* m, float* v, float g, const AdamParams& a) {
  float pv = *p;
  if (!a.decoupled) g += a.weight_decay * pv;
  float mv = a.beta1 * *m + (1.0f - a.beta1) * g;
  float vv = a.beta2 * *v + (1.0f - a.beta2) * g * g;
  float denom = sqrtf(vv) / a.bias_correction2_sqrt + a.eps;
  float update = (mv / a.bias_correction1) / denom;
  if (a.decoupled) update += a.weight_decay * pv;
  *p = pv - a.lr * update;
  *m = mv;
  *v = vv;
}

}  // namespace zero3d::math
