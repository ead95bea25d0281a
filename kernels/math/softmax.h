// Causal softmax over one row t of a (T x T) attention score matrix: keys j <= t take part,
// keys j > t get probability 0. The 1/sqrt(head_dim) scale is applied by the GEMM (alpha), so the
// row holds already-scaled scores. Backward: dpre_j = p_j * (dp_j - sum_k dp_k p_k) for j <= t.
#pragma once
#include <cmath>
#include "kernels/common.h"

namespace zero3d::math {

Z3D_HD void softmax_causal_row_forward(float* p, const float* pre, int t, int T) {
  float maxv = pre[0];
  for (int j = 1; j <= t; ++j) maxv = pre[j] > maxv ? pre[j] : maxv;
  float sum = 0.0f;
  for (int j = 0; j <= t; ++j) {
    float e = expf(pre[j] - maxv);
    p[j] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
  for (int j = 0; j <= t; ++j) p[j] *= inv;
  for (int j = t + 1; j < T; ++j) p[j] = 0.0f;
}

// dpre may alias dp.
Z3D_HD void softmax_causal_row_backward(float* dpre, const float* dp, const float* p, int t, int T) {
  float dot = 0.0f;
  for (int j = 0; j <= t; ++j) dot += dp[j] * p[j];
  for (int j = 0; j <= t; ++j) dpre[j] = p[j] * (dp[j] - dot);
  for (int j = t + 1; j < T; ++j) dpre[j] = 0.0f;
}

}  // namespace zero3d::math
