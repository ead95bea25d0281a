// SwiGLU (Llama's MLP activation) on a row of 2F: h = [gate | up], out = silu(gate) * up with
// silu(g) = g * sigmoid(g). Backward, with s = sigmoid(g):
//   d gate = dout * up * s * (1 + g (1 - s));   d up = dout * silu(g).
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

Z3D_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

Z3D_HD float swiglu_forward(float gate, float up) { return gate * sigmoid(gate) * up; }

Z3D_HD void swiglu_backward(float* dgate, float* dup, float gate, float up, float dout) {
  const float s = sigmoid(gate);
  *dgate = dout * up * s * (1.0f + gate * (1.0f - s));
  *dup = dout * gate * s;
}

}  // namespace zero3d::math
