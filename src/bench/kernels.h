// bench/kernels.h: `zero3d bench kernels`, every host kernel of a training step against its bound
// at each ISA level this CPU runs, or every kernel and GEMM of a step on one backend (a GPU's)
// against that device's bounds (bench/kernels.cpp says how the bounds are taken).
#pragma once
#include <string>
#include <vector>

#include "bench/rates.h"
#include "config/config.h"
#include "kernels/backend.h"

namespace zero3d {

// zero3d bench kernels: every host kernel of a step at one micro-batch
// of model m, at each of `levels` (empty: every level this CPU runs), against its bound.
void bench_kernels(const ModelConfig& m, int micro, const std::string& config, double seconds,
                   const std::vector<std::string>& levels);
// zero3d bench kernels --backend NAME: every kernel of a step on `be`, each call timed there
// (synchronized), rated against `peak` (FLOPs) or the copy bandwidth measured through `be`
// (bytes), what a call must move or compute counted by a count-only host backend running the same
// call; then every GEMM of the micro-batch against `peak`.
void bench_backend_kernels(Backend& be, const PeakFlops& peak, const ModelConfig& m, int micro,
                           const std::string& config, double seconds);

}  // namespace zero3d
