// bench/machine.h: a machine's rates, what zero3d plan prices a layout's counted work with (issue
// #31): measured by `zero3d bench machine` on the ranks of one node at once (as a training job loads
// it) and kept as a JSON file, so a plan can be made away from the machine.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace zero3d {

struct MachineRates {
  std::string name;              // the CPU (and its GEMM path) or the device
  int ranks_per_node = 1;        // measured with this many ranks at once (a node's ranks)
  bool device = false;           // a GPU: collectives run on their own stream, beside the compute
  double gemm_flops = 0;         // FLOP/s per rank: fp32 GEMMs of training's shapes through the trainer's backend
  double gemm_bf16_flops = 0;    // FLOP/s per rank of bf16 GEMMs (a bf16 run's), 0: at gemm_flops
  double attention_flops = 0;    // FLOP/s per rank: the fused causal attention, forward and backward
  double copy_bytes = 0;         // bytes/s per rank: the elementwise ops' bound (bytes read + written)
  double adam_bytes = 0;         // bytes/s per rank of the optimizer's update (its arithmetic can be the bound)
  double p2p_bytes = 0;          // bytes/s per rank sent to a pipeline neighbour in the node, 0: at copy_bytes
  // Optimizer offload from a device (0: not priced): bytes/s per rank between device and host memory
  // (each way), and of AdamW on the CPU with the rank's share of the node's host.
  double pcie_bytes = 0, host_adam_bytes = 0;
  // Offload to nvme (0: not priced): bytes/s per rank read from and written to swap files, every
  // rank of a node at once (zero3d's own swap files, O_DIRECT where the file system takes it).
  double nvme_read_bytes = 0, nvme_write_bytes = 0;
  struct Link {
    double latency_s = 0;  // per call
    double busbw = 0;      // bytes/s, nccl-tests' bus bandwidth
  };
  std::map<std::string, Link> collectives;  // "all_reduce", "reduce_scatter", "all_gather" among a node's ranks
  // Between nodes: the collectives of a group with all ranks_per_node ranks of each of its nodes (one
  // network link per rank: a group with k ranks a node gets k / ranks_per_node of that bandwidth, at
  // most the node's own), and what a rank sends to a pipeline neighbour on another node. Empty: one
  // node only (a group that spans nodes is priced as if it did not).
  struct InterNode {
    double p2p_bytes = 0;
    std::map<std::string, Link> collectives;
  } inter_node;
  std::string measured;              // when and how
  std::vector<std::string> sources;  // a preset's: where each figure comes from

  // Seconds of one call of `op` on a buffer of msg_bytes (the comms log's message size) over a group of
  // `size` ranks, `per_node` of them on each node it spans: latency + msg_bytes x the ring's share
  // (2(p-1)/p for all-reduce, (p-1)/p for the others) / busbw, the node's link within one node, the
  // network's between nodes. 0 for one rank; an op it has no rate for is priced as an all-reduce.
  double collective_seconds(const std::string& op, double msg_bytes, int size, int per_node) const;
  double collective_seconds(const std::string& op, double msg_bytes, int size) const {
    return collective_seconds(op, msg_bytes, size, size);
  }
};

// Every rank of the world measures at once (the slowest rank's rates); the collectives within each
// node, and with more than one node over the world as the inter-node rates. Nodes must be alike.
// With an nvme_path, swap files there too (swap_bytes a rank written, then read back).
MachineRates measure_machine(Backend& be, double seconds, const std::string& nvme_path = "",
                             uint64_t swap_bytes = uint64_t(256) << 20);
void save_machine(const MachineRates& m, const std::string& path);
// A machine file (save_machine's keys; device, gemm_bf16_flops_per_s, p2p_bytes_per_s, pcie_bytes_per_s,
// host_adam_bytes_per_s, nvme_read_bytes_per_s, nvme_write_bytes_per_s, inter_node and sources optional, as the presets in input/machines/ use them). UserError naming what is missing.
MachineRates load_machine(const std::string& path);

}  // namespace zero3d
