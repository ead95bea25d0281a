// GELU, tanh approximation (GPT-2): gelu(x) = x/2 * (1 + tanh(s*(x + 0.044715 x^3))), s = sqrt(2/pi).
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

Z3D_HD float gelu_forward(float x) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx = (1 + tanh u)/2 + x/2 * (1 - tanh^2 u) * s * (1 + 3*0.044715 x^2)
Z3D_HD float gelu_backward(float x, float dout) {
  float u = kGeluScale * (x + kGeluCubic * x * x * x);
  float t = tanhf(u);
  float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

}  // namespace zero3d::math
