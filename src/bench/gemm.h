// bench/gemm.h: `zero3d bench gemm` on the host: the GEMMs a training run makes, through every
// library side by side (what training runs under compute.gemm=auto, oneDNN, the CBLAS linked in,
// oneDNN's bf16), against the FMA peak of the rank's threads.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/job.h"

namespace zero3d {

// The machine and its libraries, then square GEMMs of each of `sizes` (at least `seconds` each),
// then with `cfg` every GEMM of one training micro-batch of its model (`config` names its file)
// and the fused attention. `ranks`: how many ranks measure at once (a node's load).
void bench_host_gemm(const std::vector<int>& sizes, double seconds, const Config* cfg, const std::string& config,
                     const JobInfo& job, int ranks);

}  // namespace zero3d
