// Rotary position embedding (RoPE, Llama and Hugging Face's "rotate half" layout): in each head of
// width hd, dimension i < hd/2 pairs with i + hd/2 and the pair turns by the angle t * f_i at
// position t, f_i = theta^(-2i/hd):
//   y_i = x_i cos - x_{i+hd/2} sin;   y_{i+hd/2} = x_{i+hd/2} cos + x_i sin.
// The backward turns the gradient back (the transpose of a rotation is its inverse):
//   dx_i = dy_i cos + dy_{i+hd/2} sin;   dx_{i+hd/2} = dy_{i+hd/2} cos - dy_i sin.
// The angles come from one table of (cos, sin) per (position, pair), computed once in double and
// rounded, so every backend turns by the same numbers.
#pragma once
#include <cmath>
#include <vector>
#include "kernels/math/common.h"

namespace zero3d::math {

// T x hd/2 pairs (cos, sin): 2 * T * (hd/2) floats, position-major.
inline std::vector<float> rope_table(int T, int hd, double theta) {
  const int half = hd / 2;
  std::vector<float> cs(2 * static_cast<size_t>(T) * half);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = t * std::pow(theta, -2.0 * i / hd);
      cs[2 * (static_cast<size_t>(t) * half + i)] = static_cast<float>(std::cos(angle));
      cs[2 * (static_cast<size_t>(t) * half + i) + 1] = static_cast<float>(std::sin(angle));
    }
  return cs;
}

// One head's pair i, in place: forward turns by +angle, backward by -angle.
Z3D_HD void rope_pair(float* x, int half, int i, float c, float s, bool backward) {
  const float a = x[i], b = x[i + half];
  if (backward) s = -s;
  x[i] = a * c - b * s;
  x[i + half] = b * c + a * s;
}

}  // namespace zero3d::math
