// Rotary position embedding (RoPE, Llama and Hugging Face's "rotate half" layout): in each head of
// width hd, dimension i < hd/2 pairs with i + hd/2 and the pair turns by the angle t * f_i at
// position t, f_i = theta^(-2i/hd):
//   y_i = x_i cos - x_{i+hd/2} sin;   y_{i+hd/2} = x_{i+hd/2} cos + x_i sin.
// The backward turns the gradient back (the transpose of a rotation is its inverse):
//   dx_i = dy_i cos + dy_{i+hd/2} sin;   dx_{i+hd/2} = dy_{i+hd/2} cos - dy_i sin.
// The angles come from one table of (cos, sin) per (position, pair), computed once in double and
// rounded, so every backend turns by the same numbers.
// Llama 3.1's scaling (transformers' rope_type "llama3") changes only f_i, by its wavelength
// w = 2 pi / f_i against the pretraining context L:
//   w < L / high_freq_factor: f_i kept;   w > L / low_freq_factor: f_i / factor;
//   between: (1 - s) f_i / factor + s f_i,   s = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor).
#pragma once
#include <cmath>
#include <vector>
#include "kernels/math/common.h"
#include "kernels/math/dtype.h"

namespace zero3d::math {

// Llama 3.1's numbers (high_freq_factor > low_freq_factor); L = original_max_position_embeddings.
struct RopeLlama3 {
  double factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
};

// Pair i's frequency f_i, scaled when `llama3` is given.
inline double rope_frequency(int i, int hd, double theta, const RopeLlama3* llama3) {
  const double f = std::pow(theta, -2.0 * i / hd);
  if (!llama3) return f;
  const double L = llama3->original_max_position_embeddings, wavelength = 6.283185307179586476925 / f;  // 2 pi / f
  if (wavelength < L / llama3->high_freq_factor) return f;
  if (wavelength > L / llama3->low_freq_factor) return f / llama3->factor;
  const double s = (L / wavelength - llama3->low_freq_factor) / (llama3->high_freq_factor - llama3->low_freq_factor);
  return (1 - s) * f / llama3->factor + s * f;
}

// T x hd/2 pairs (cos, sin): 2 * T * (hd/2) floats, position-major.
inline std::vector<float> rope_table(int T, int hd, double theta, const RopeLlama3* llama3 = nullptr) {
  const int half = hd / 2;
  std::vector<float> cs(2 * static_cast<size_t>(T) * half);
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) f[i] = rope_frequency(i, hd, theta, llama3);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = t * f[i];
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

// Pair i of the head at xh in its storage (fp32, or bf16 as its bits: math::load/store), by the
// table's (cos, sin) at cs: read, turned in fp32, each value rounded once.
template <typename S>
Z3D_HD void rope_pair_stored(S* xh, int half, int i, const float* cs, bool backward) {
  float pair[2] = {load(xh + i), load(xh + i + half)};
  rope_pair(pair, 1, 0, cs[0], cs[1], backward);
  store(xh + i, pair[0]);
  store(xh + i + half, pair[1]);
}

}  // namespace zero3d::math
