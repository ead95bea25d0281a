// Softmax cross-entropy over one row of V logits with integer target:
//   loss = logsumexp(z) - z[target];   dz = (softmax(z) - onehot(target)) * dloss.
// dloss is the weight of this row in the mean loss (1 / tokens in the global batch), so the
// gradient of the whole batch is already normalised. dlogits may alias logits.
#pragma once
#include <cmath>
#include "kernels/math/common.h"

namespace zero3d::math {

Z3D_HD float crossentropy_row_forward(const float* z, int target, int V) {
  float maxv = z[0];
  for (int i = 1; i < V; ++i) maxv = z[i] > maxv ? z[i] : maxv;
  float sum = 0.0f;
  for (int i = 0; i < V; ++i) sum += expf(z[i] - maxv);
  return logf(sum) + (maxv - z[target]);
}

// One pass of exp: e_i is stored in dz, then normalised in place (z[target] is read first in
// case dz aliases z).
Z3D_HD float crossentropy_row_forward_backward(float* dz, const float* z, int target, int V, float dloss) {
  float maxv = z[0];
  for (int i = 1; i < V; ++i) maxv = z[i] > maxv ? z[i] : maxv;
  const float z_target = z[target];
  float sum = 0.0f;
  for (int i = 0; i < V; ++i) {
    float e = expf(z[i] - maxv);
    dz[i] = e;
    sum += e;
  }
  float scale = dloss / sum;
  for (int i = 0; i < V; ++i) dz[i] *= scale;
  dz[target] -= dloss;
  return logf(sum) + (maxv - z_target);
}

// The vocab-parallel pieces: the same math split so the max and the sum can be all-reduced.
Z3D_HD float row_max(const float* z, int V) {
  float maxv = z[0];
  for (int i = 1; i < V; ++i) maxv = z[i] > maxv ? z[i] : maxv;
  return maxv;
}
Z3D_HD float row_sumexp(const float* z, int V, float maxv) {
  float sum = 0.0f;
  for (int i = 0; i < V; ++i) sum += expf(z[i] - maxv);
  return sum;
}
// local_target: the target's index in this slice of the vocabulary, or -1.
Z3D_HD void crossentropy_row_grad(float* dz, const float* z, int V, float maxv, float sum, int local_target,
                                  float dloss) {
  float scale = dloss / sum;
  for (int i = 0; i < V; ++i) dz[i] = expf(z[i] - maxv) * scale;
  if (local_target >= 0) dz[local_target] -= dloss;
}

}  // namespace zero3d::math
