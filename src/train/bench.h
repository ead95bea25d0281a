// train/bench.h: the GEMM rate of this machine through the backend the trainer uses (the MFU
// denominator on CPUs, where no vendor peak applies, and `zero3d bench gemm`), and the raw
// collective MPI-IO write rate of a file system (`zero3d bench io`, the baseline that checkpoint
// bandwidth is quoted against).
#pragma once
#include <mpi.h>

#include <cstdint>
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

// Every rank of `comm` writes bytes / size of one new file in DIR (contiguous, 16 MiB collective
// MPI_File_write_at_all calls), then MPI_File_sync and close; the file is removed. Returns the
// slowest rank's seconds from the first write to the end of the sync. Collective.
double measure_collective_write(MPI_Comm comm, const std::string& dir, uint64_t bytes);

}  // namespace zero3d
