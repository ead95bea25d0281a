// train/machine.h: a machine's rates, what zero3d plan prices a layout's counted work with (issue
// #31): measured by `zero3d bench machine` on the ranks of one node at once (as a training job loads
// it) and kept as a JSON file, so a plan can be made away from the machine.
#pragma once
#include <map>
#include <string>

#include "kernels/backend.h"

namespace zero3d {

struct MachineRates {
  std::string name;              // the CPU (and its GEMM path) or the device
  int ranks_per_node = 1;        // measured with this many ranks at once
  double gemm_flops = 0;         // FLOP/s per rank: fp32 GEMMs of training's shapes through the trainer's backend
  double attention_flops = 0;    // FLOP/s per rank: the fused causal attention, forward and backward
  double copy_bytes = 0;         // bytes/s per rank: the elementwise ops' bound (bytes read + written)
  double adam_bytes = 0;         // bytes/s per rank of the optimizer's update (its arithmetic can be the bound)
  struct Link {
    double latency_s = 0;  // per call
    double busbw = 0;      // bytes/s, nccl-tests' bus bandwidth
  };
  std::map<std::string, Link> collectives;  // "all_reduce", "reduce_scatter", "all_gather" among a node's ranks
  std::string measured;                     // when and how

  // Seconds of one call of `op` on a buffer of msg_bytes (the comms log's message size) over a group of
  // `size` ranks: latency + msg_bytes x the ring's share (2(p-1)/p for all-reduce, (p-1)/p for the
  // others) / busbw. 0 for one rank; an op it has no rate for is priced as an all-reduce.
  double collective_seconds(const std::string& op, double msg_bytes, int size) const;
};

// Every rank of the world measures at once; rank 0's numbers, the collectives over the world (one node).
MachineRates measure_machine(Backend& be, double seconds);
void save_machine(const MachineRates& m, const std::string& path);
MachineRates load_machine(const std::string& path);  // UserError naming what is missing

}  // namespace zero3d
