// RMSNorm over the last dimension C of one row (Llama): y = x * rstd * w, rstd = 1/sqrt(mean(x^2)
// + eps); no mean is subtracted and there is no bias. The forward saves rstd per row.
// Backward of one row (xhat = x * rstd, g = dy * w):
//   dx = rstd * (g - xhat * mean(g * xhat));   dw += dy * xhat.
// dw is a column sum over rows: launchers choose the loop order, as for LayerNorm.
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

Z3D_HD float rmsnorm_row_forward(float* out, const float* x, const float* w, int C, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < C; ++i) ss += x[i] * x[i];
  const float rstd = 1.0f / sqrtf(ss / C + eps);
  for (int i = 0; i < C; ++i) out[i] = x[i] * rstd * w[i];
  return rstd;
}

}  // namespace zero3d::math
