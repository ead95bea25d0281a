// plan/plan.h: zero3d plan, which layouts of a config fit, before the job (issue #31, its first
// part: memory). Memory comes from the code, not a second formula: each rank position's ZeroEngine
// and its models (one per micro-batch 1F1B holds in flight) are built as a run builds them, on a
// sizing backend (kernels/backend.h: allocations reserve address space only and are counted) with
// process groups that never communicate. So a change to the engine's buffers changes the plan.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/mem.h"
#include "kernels/profile.h"
#include "parallel/comm.h"

namespace zero3d {

struct MachineRates;

// What one rank allocates, by role, as memory_breakdown reports it: the engine's accounts
// (zero/engine.h MemoryAccount), the models' activations and scratch, and everything else the
// engine and the models allocated (other).
struct RankMemory {
  int pp_rank = 0;
  uint64_t params = 0, grads = 0, optimizer = 0, buffers = 0, activations = 0, other = 0;
  uint64_t host = 0;  // offload from a device: optimizer state and its buffers in host memory (not in total)
  uint64_t swapped = 0;  // offload to nvme: bytes in this rank's swap files (not in memory, not in total)
  uint64_t total() const { return params + grads + optimizer + buffers + activations + other; }
};

// The memory of config c's rank at pipeline stage pp_rank with dp data-parallel ranks (tp rank 0,
// dp rank 0: the others hold the same shapes), with its buffers in `kind` memory.
RankMemory size_rank(const Config& c, int dp, int pp_rank, MemKind kind);

// The work of a step on config c's rank at pipeline stage pp_rank (tp rank 0, dp rank 0 of dp):
// the first micro-batch's forward and backward and, with gradient accumulation, a later one's (ZeRO-3's
// pool may still hold what the first gathered; the last one reduces ZeRO-0/1's gradients), then the step's end (the gradients' reduction, their
// norm, the optimizer and ZeRO's gathers of the updated weights). Each part lists the ops its code
// asks of the backend (calls, bytes, FLOPs: the host backend's own accounting) and the collectives
// of its tensor- and data-parallel groups ("tp all_reduce", "dp all_gather": the comms log's calls
// and bytes), counted by running the model's and the engine's code on the sizing backend and groups
// that move nothing; a step after the first (ZeRO-3's pool then prefetches along its trace). What
// zero3d plan's step time is to be priced from: a machine's GEMM, memory and link rates (#31).
// With offload to nvme the engine's swap files are sizing ones (storage/swap_file.h), so each part
// also counts the bytes they read and write; with offload_param cpu the parameters' are counted as
// if swapped: what a gather brings in from outside the device's memory.
struct StepWork {
  struct Part {
    std::map<std::string, OpStat> ops;
    std::map<std::string, CommOpStats> comms;
    uint64_t swap_read = 0, swap_written = 0;    // every swap file's bytes
    uint64_t param_read = 0, param_written = 0;  // of which the parameters'
  };
  uint64_t read_ahead = 0;  // of step_end's optimizer reads, those for the next step (behind its forward and backward)
  Part micro_batch;        // the step's first
  Part later_micro_batch;  // each of the gas - 1 others (gas > 1; it is the last, as count_step runs two)
  Part step_end;
};
StepWork count_step(const Config& c, int dp, int pp_rank);

// A layout's step time on a machine (bench/machine.h), priced from each stage's counted work: a
// micro-batch's GEMM (a bf16 run's at the bf16 rate) and attention FLOPs at the machine's rates, its
// other ops' bytes at its copy bandwidth, its collectives at their latency and bus bandwidth for the
// group's size (the network's when the group spans nodes), the pipeline's activations sent and
// received at the neighbour link's bandwidth; 1F1B runs gas + pp - 1 micro-batch slots of the slowest
// stage (pp - 1 of them the bubble), then the step's end. On a CPU nothing overlaps: the collectives
// run on the cores that compute. On a device with overlap_comm, a micro-batch's data-parallel
// collectives hide behind its compute (what exceeds it is exposed). Offload: stage 3's parameter
// slices come in (from host memory over the host link, or from the swap file) ahead of their use,
// so a micro-batch waits only for what exceeds its compute; at the step's end the optimizer's
// update streams beside its own traffic (the gradients down and the weights up over the host link,
// the state's records through the swap file): the slowest of them counts, and the parameters'
// swap writes after it.
struct StepTime {
  double compute_s = 0, comm_s = 0, bubble_s = 0, step_end_s = 0;
  // comm_s by group (the slowest stage's exposed tp, dp and pipeline sends), the step end's collectives
  // (part of step_end_s), and which groups cross nodes.
  double tp_s = 0, dp_s = 0, pp_s = 0, end_collectives_s = 0;
  // Of step_end_s, with anything offloaded: the optimizer's update with the traffic beside it, and
  // the parameters' swap writes.
  double offload_s = 0;
  double param_io_s = 0;  // offload_param: the micro-batches' waits for their slices (the slowest stage's)
  bool tp_across = false, dp_across = false, pp_across = false;
  double step_s() const { return compute_s + comm_s + param_io_s + bubble_s + step_end_s; }
};
StepTime price_step(const Config& c, int dp, const MachineRates& m);
// Whether price_step prices config c's layout on m: offload from a device needs its pcie_bytes_per_s
// and host_adam_bytes_per_s, offload to nvme its nvme_read/write_bytes_per_s. (On a CPU, offload to
// cpu leaves everything where it was.)
bool prices(const MachineRates& m, const Config& c);

// One candidate layout: its choices, and either why it is not valid or the worst rank's memory.
struct PlanLayout {
  int dp = 1, tp = 1, pp = 1, stage = 0, micro = 1, gas = 1;
  bool checkpointing = false;
  OffloadDevice offload = OffloadDevice::none;  // zero_optimization.offload_optimizer.device
  std::string nvme_path;                        // its nvme_path, for offload to nvme
  std::string excluded;  // why the config resolver refuses it ("" = valid)
  std::vector<RankMemory> stages;  // a rank of each pipeline stage
  RankMemory worst;                // the stage whose rank needs the most
  bool fits = true;      // within --mem-per-rank (always, without it)
  StepTime time;         // with --machine
  double tokens_per_s = 0;
};

// Every (tp, pp, dp = ranks / (tp pp), ZeRO stage, micro-batch, accumulation, activation
// checkpointing, optimizer offload: to host memory with kind device, to nvme where the config names
// an nvme_path) for the config's global batch on `ranks` ranks; each resolved by the config code
// (which refuses what it cannot run) and sized with its buffers in `kind` memory.
// With `machine`, each valid layout's step time on it too (where prices() says it can).
std::vector<PlanLayout> plan_layouts(const ConfigSources& sources, int ranks, uint64_t mem_per_rank, MemKind kind,
                                     const MachineRates* machine = nullptr);

// The seed's checklist for a layout that does not fit, with the plan's numbers: config c's own
// layout on `ranks` ranks (its worst stage, each part), then each single change (ZeRO stage,
// activation checkpointing, a smaller micro-batch, tp, pp) the config code accepts, with the
// total per rank it leaves, smallest first. `limit` (0: none) marks what fits.
// With `machine`, its step time there too.
std::string explain_layout(const ConfigSources& sources, int ranks, uint64_t limit, MemKind kind = MemKind::host,
                           const MachineRates* machine = nullptr);

// Before a run allocates: the ranks of each node sum their planned bytes (size_rank) and, on the
// host backend, a node whose ranks plan more than its available memory (MemAvailable, and the
// cgroup's limit where there is one) stops the run with a UserError that explains it, instead of
// the kernel's OOM killer ending it midway. Collective over the world.
void refuse_if_over_memory(const Config& c, const ConfigSources& sources, class ProcessGroups& g, MemKind kind);

}  // namespace zero3d
