// Softmax cross-entropy over one row of V logits with integer target:
//   loss = logsumexp(z) - z[target];   dz = (softmax(z) - onehot(target)) * dloss.
// dloss is the weight of this row in the mean loss (1 / tokens in the global batch), so the
// gradient of the whole batch is already normalised. dlogits may alias logits.
#pragma once
#include <cmath>
#include "kernels/common.h"

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

}  // namespace zero3d::math
