// train/bench.h: the GEMM rate of this machine through the backend the trainer uses. It is the
// MFU denominator on CPUs (where no vendor peak applies) and `zero3d bench gemm`'s measurement.
#pragma once
#include <string>

#include "kernels/backend.h"

namespace zero3d {

struct GemmRate {
  int m = 0, n = 0, k = 0;
  double seconds_per_call = 0;
  double flops_per_s = 0;
};

// Times C = A B^T (the layout of the model's linear layers) for at least `min_seconds` after
// one warm-up call.
GemmRate measure_gemm(Backend& be, int m, int n, int k, double min_seconds);

// Peak FLOP/s of a known accelerator from its name (dense bf16 tensor-core peaks from the vendor
// data sheets), or 0 when unknown.
double known_accelerator_peak(const std::string& device_name);

}  // namespace zero3d
