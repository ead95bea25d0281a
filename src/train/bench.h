// train/bench.h: the GEMM rate of this machine through the backend the trainer uses (the MFU
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

// zero3d bench kernels (train/bench_kernels.cpp): every host kernel of a step at one micro-batch
// of model m, at each of `levels` (empty: every level this CPU runs), against its bound.
void bench_kernels(const ModelConfig& m, int micro, const std::string& config, double seconds,
                   const std::vector<std::string>& levels);

// Peak FLOP/s of a known accelerator from its name (dense bf16 tensor-core peaks from the vendor
// data sheets), or 0 when unknown.
double known_accelerator_peak(const std::string& device_name);

// Every rank of `comm` writes bytes / size of one new file in DIR (contiguous, 16 MiB collective
// MPI_File_write_at_all calls), then MPI_File_sync and close; the file is removed. Returns the
// slowest rank's seconds from the first write to the end of the sync. Collective.
double measure_collective_write(MPI_Comm comm, const std::string& dir, uint64_t bytes);

// zero3d bench comm (train/bench_comm.cpp): every collective through MPI and through shared
// memory, per type and size, with the memcpy rate of the same run. Returns the wrong elements
// found in all (0: every result was exact). Collective over the world.
struct CommBenchOptions {
  size_t min_bytes = 1024, max_bytes = 256u << 20;
  double factor = 4;                      // each size is the previous one times this
  double bytes_per_point = 2e9;           // calls per size: this many bytes, at least 3 and at most 1000
  size_t chunk_bytes = 0;                 // 0: comm_context()'s
  int group_size = 0;                     // 0: the world; else groups of this many consecutive ranks, all at once
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  std::vector<std::string> types = {"float", "bf16"};  // float, bf16, half
};
int64_t bench_comm(const CommBenchOptions& o);
// Seconds per call of op ("all_reduce", "reduce_scatter", "all_gather") on fp32 comm buffers of `bytes`
// in all (all-gather's output, reduce-scatter's input) over g's ranks, through the collectives
// training uses; the slowest rank's. Collective over g.
double time_collective(ProcessGroup& g, const std::string& op, size_t bytes);

}  // namespace zero3d
