// model/init_weights.h: a model's initial weights for any range of its flat layout, so that each
// rank makes exactly the part it keeps and every layout starts from the same weights: the seeded
// draw (gpt_init_tensor, model/gpt.h), or weights from outside (checkpoint.init_from).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/flat_layout.h"

namespace zero3d {

// Elements [begin, end) of the flat layout's initial parameters (padding 0), on the host: a rank
// calls it for exactly the range it keeps.
void gpt_initial_params(const FlatLayout& layout, int n_layer, uint64_t seed, size_t begin, size_t end, float* out);

// Initial weights from outside (checkpoint.init_from): every tensor of the whole model by name, in
// its logical (tp 1, row-major) layout. While set, gpt_initial_params copies each rank's elements
// from them (logical_index) instead of drawing them, so any layout starts from the same weights.
struct InitialWeights {
  std::map<std::string, std::vector<float>> tensors;
};
void set_initial_weights(std::shared_ptr<const InitialWeights> w);  // nullptr: the seeded draw again

}  // namespace zero3d
