// bench/comm.h: `zero3d bench comm`, the collectives as nccl-tests measures them, and the timing
// of one collective that `zero3d bench machine` fits its links from.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace zero3d {

// zero3d bench comm: every collective through MPI and through shared
// memory, per type and size, with the memcpy rate of the same run. Returns the wrong elements
// found in all (0: every result was exact). Collective over the world.
struct CommBenchOptions {
  size_t min_bytes = 1024, max_bytes = 256u << 20;
  double factor = 4;                      // each size is the previous one times this
  double bytes_per_point = 2e9;           // calls per size: this many bytes, at least 3 and at most 1000
  int iters = 0;                          // > 0: this many calls per size instead (nccl-tests' -n)
  size_t chunk_bytes = 0;                 // 0: comm_context()'s
  int group_size = 0;                     // 0: the world; else groups of this many consecutive ranks, all at once
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  std::vector<std::string> types = {"float", "bf16"};  // float, bf16, half
};
int64_t bench_comm(const CommBenchOptions& o);
// Seconds per call of op ("all_reduce", "reduce_scatter", "all_gather") on fp32 comm buffers of `bytes`
// in all (all-gather's output, reduce-scatter's input) over g's ranks, through the collectives
// training uses; the slowest rank's, from calls for about `seconds`. Collective over g.
double time_collective(ProcessGroup& g, const std::string& op, size_t bytes, double seconds);

}  // namespace zero3d
