// bench/rates.h: the GEMM rate of this machine through the backend the trainer uses (the MFU
// denominator on CPUs, where no vendor peak applies, and `zero3d bench gemm`), and the raw
// collective MPI-IO write rate of a file system (`zero3d bench io`, the baseline that checkpoint
// bandwidth is quoted against).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"

#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "parallel/comm.h"

namespace zero3d {

struct GemmRate {
  int m = 0, n = 0, k = 0;
  double seconds_per_call = 0;
  double flops_per_s = 0;
};

// Times C = A B^T (the layout of the model's linear layers) for at least `min_seconds` after
// one warm-up call.
GemmRate measure_gemm(Backend& be, int m, int n, int k, double min_seconds);

// One GEMM of a training step: C (m x n) = op(A) op(B), named as the layer and pass it serves.
struct GemmShape {
  std::string name;
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  double beta = 0;  // weight gradients accumulate
};
// The GEMMs of one micro-batch of `micro` sequences on one tensor-parallel rank of `tp`: each
// linear layer's forward (x W^T), input gradient (dy W) and weight gradient (dy^T x).
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& m, int micro, int tp);
// Times `call` (after one warm-up) for at least min_seconds; seconds per call.
double time_calls(Backend& be, const std::function<void()>& call, double min_seconds);
// Seconds per call of GEMM shape s on `be` (time_calls), its operands in be's memory stored
// row-major with the leading dimensions op(A) and op(B) imply.
double time_gemm(Backend& be, const GemmShape& s, const float* A, const float* B, float* C, double min_seconds);

// The ops `call` runs, summed as the backend's profile counts them (calls: the most of any op; its
// profile must be on): one warm-up call, then calls until they took at least `seconds`.
OpStat time_ops(Backend& be, const std::function<void()>& call, double seconds);

// Memory bandwidth through the backend: bytes read + written per second by copies of a 64 MiB
// buffer (the bound of the elementwise kernels in the wall_clock_breakdown profile).
double measure_copy_bandwidth(Backend& be, double min_seconds);

// The FMA peak of one core at the host loops' ISA level (cpu::select().fma_peak, the ceiling
// `bench gemm` quotes GEMM rates against): the best of `window_s` windows for `seconds`. A rank
// that shares its core with busy ranks (oversubscribed, or others still starting) thus still
// finds windows where it ran alone; one long window would average the sharing in. FLOP/s.
// `level`: that level's loops instead of the process's.
double best_fma_peak(double seconds, double window_s = 0.002, const cpu::Kernels* level = nullptr);

// Peak FLOP/s of a known accelerator from its name (dense bf16 tensor-core peaks from the vendor
// data sheets), or 0 when unknown.
double known_accelerator_peak(const std::string& device_name);

// The MFU denominator per rank of a run on `be` (MFU divides by the world): a known GPU's bf16 peak;
// else, with the world group (a run), on a CPU the FMA peak of one core (the best 2 ms window of any
// rank) x the cores the run computes on (JobInfo::compute_cores) / the world's ranks, on another
// device rank 0's sgemm rate. Without the world (a dry run) nothing is measured: flops 0 where it
// would be. Collective over the world when it measures.
struct PeakFlops {
  double flops = 0;
  std::string source;  // where it comes from, for the run record
};
PeakFlops mfu_peak(Backend& be, ProcessGroup* world, int compute_cores);

// Every rank of `comm` writes bytes / size of one new file in DIR (contiguous, 16 MiB collective
// MPI_File_write_at_all calls), then MPI_File_sync and close; the file is removed. Returns the
// slowest rank's seconds from the first write to the end of the sync. Collective.
double measure_collective_write(MPI_Comm comm, const std::string& dir, uint64_t bytes);

}  // namespace zero3d
