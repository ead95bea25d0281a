// LayerNorm over the last dimension C of one row: y = (x - mean) * rstd * w + b,
// rstd = 1/sqrt(var + eps), var the biased variance (as PyTorch). The forward saves mean and rstd
// per row so the backward never recomputes them.
// Backward of one row (xhat = (x-mean)*rstd, g = dy*w):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat));   dw += dy * xhat;   db += dy.
// dw/db are column sums over rows: launchers choose the loop order (row-major on host, chunks of
// rows per column on CUDA); the per-element math is layernorm_xhat.
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

constexpr float kLayerNormEps = 1e-5f;

Z3D_HD void layernorm_row_forward(float* out, float* mean_out, float* rstd_out, const float* x,
                                  const float* w, const float* b, int C) {
  float sum = 0.0f;
  for (int i = 0; i < C; ++i) sum += x[i];
  float mean = sum / C;
  float var = 0.0f;
  for (int i = 0; i < C; ++i) {
    float d = x[i] - mean;
    var += d * d;
  }
  var /= C;
  float rstd = 1.0f / sqrtf(var + kLayerNormEps);
  for (int i = 0; i < C; ++i) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
  *mean_out = mean;
  *rstd_out = rstd;
}

Z3D_HD float layernorm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }

// dx for one row, accumulated into dx (+=) because the residual stream already holds a gradient.
Z3D_HD void layernorm_row_backward_input(float* dx, const float* dy, const float* x, const float* w,
                                         float mean, float rstd, int C) {
  float mean_g = 0.0f, mean_gx = 0.0f;
  for (int i = 0; i < C; ++i) {
    float g = dy[i] * w[i];
    mean_g += g;
    mean_gx += g * layernorm_xhat(x[i], mean, rstd);
  }
  mean_g /= C;
  mean_gx /= C;
  for (int i = 0; i < C; ++i) {
    float g = dy[i] * w[i];
    dx[i] += rstd * (g - mean_g - layernorm_xhat(x[i], mean, rstd) * mean_gx);
  }
}

}  // namespace zero3d::math
