#include "model/init_weights.h"

#include <algorithm>

#include "model/gpt.h"

namespace zero3d {

namespace {
std::shared_ptr<const InitialWeights> g_initial;  // set around ZeroEngine::init_weights (one thread)
}  // namespace

void set_initial_weights(std::shared_ptr<const InitialWeights> w) { g_initial = std::move(w); }

void gpt_initial_params(const FlatLayout& layout, int n_layer, uint64_t seed, size_t begin, size_t end, float* out) {
  std::fill(out, out + (end - begin), 0.0f);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const ParamInfo& p = layout.tensors[i];
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.size);
    if (lo >= hi) continue;
    if (!g_initial) {
      gpt_init_tensor(layout.tensors, i, n_layer, seed, lo - p.offset, hi - p.offset, out + (lo - begin));
      continue;
    }
    const std::vector<float>& w = g_initial->tensors.at(p.name);  // read_hf_weights checked every name
    for (size_t k = lo; k < hi; ++k) out[k - begin] = w[logical_index(p, k - p.offset)];
  }
}

}  // namespace zero3d
