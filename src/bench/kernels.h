// bench/kernels.h: `zero3d bench kernels`, every host kernel of a training step against its bound
// at each ISA level this CPU runs (bench/kernels.cpp says how the bounds are taken).
#pragma once
#include <string>
#include <vector>

#include "config/config.h"

namespace zero3d {

// zero3d bench kernels: every host kernel of a step at one micro-batch
// of model m, at each of `levels` (empty: every level this CPU runs), against its bound.
void bench_kernels(const ModelConfig& m, int micro, const std::string& config, double seconds,
                   const std::vector<std::string>& levels);

}  // namespace zero3d
