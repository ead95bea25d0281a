// train/records.h: what a run says about itself. Rank 0 writes metrics.jsonl (the run record, one
// "train" record per step, "val", "checkpoint", "kernels", "memory" records) and the progress
// lines; DeepSpeed's monitors hang off the same part: csv_monitor, comms_logger,
// memory_breakdown, the flops profiler, and wall_clock_breakdown's per-op kernel profile.
// Invariant: records are written, never read back during the run; a resumed run's file holds each
// step once (the records after the checkpoint it continues from are dropped at open).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/writer.h"
#include "config/config.h"
#include "core/clock.h"
#include "kernels/backend.h"
#include "parallel/groups.h"
#include "train/metrics.h"
#include "train/monitors.h"
#include "train/run_options.h"
#include "train/step_runner.h"
#include "zero/engine.h"

namespace zero3d {

// What one step measured and decided, for the records and the step boundary.
struct StepResult {
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool skipped = false;
  double t_fwd = 0, t_bwd = 0, t_reduce = 0, t_opt = 0, t_gather = 0, step_time = 0, idle_s = 0, recompute = 0;
  int64_t faults = 0, comm_bytes = 0;
  CommTime comm;  // wall_clock_breakdown: the data collectives' time and its exposed part (slowest rank's)
  SwapIo swap;    // offload: the slowest rank's waits and I/O time, and the bytes of all ranks
};

class RunRecords {
 public:
  RunRecords(const Config& c, const RunOptions& o, Backend& be, ProcessGroups& g);
  // Rank 0: config.json, and metrics.jsonl opened for append without the records after
  // `resumed_step` (-1: a fresh start drops every step record); the csv monitor.
  void open(int64_t resumed_step, uint64_t cursor);
  // The engine's memory, agreed over the world; then the run record and the start line.
  struct RunFacts {
    uint64_t activation_bytes = 0;
    double flops_per_token = 0, time_budget_s = 0;
    int64_t start_step = 0;
    std::string resumed_from, checkpoint_writes;
  };
  void start(const ZeroEngine& engine, const RunFacts& f);
  // The profilers' bounds and steps, before the first step (first_step: the run's first).
  void start_profiles(int first_step);
  bool profiled(int step) const { return step == profiled_step_; }
  bool swaps() const { return swapped_any_ || host_any_; }  // some rank offloads: gather swap I/O per step

  void checkpoint(const char* action, int64_t step, const CheckpointIO& io, const SaveResult* save = nullptr,
                  bool async = false);
  void val(int step, double loss, int64_t tokens);
  // The step's records: metrics.jsonl, the flops profile, csv_monitor, memory_breakdown, the
  // progress line. Collective over the world (the memory and flops reports gather).
  void step(int step, const StepResult& r, StepRunner& runner, double flops_per_token, double tokens_per_step);
  void begin_step();                  // the comms log and the op profile cover what follows
  void end_step();                    // until here: the step's compute and communication
  void after_step(double step_time);  // wall_clock_breakdown: profiled from step 2 on
  void finish();                      // the kernel and comms reports (rank 0)
  MetricsLog* metrics() { return metrics_.get(); }

 private:
  void report_kernels();
  void report_comms();
  void report_memory(int step, uint64_t activation_bytes);

  const Config& cfg_;
  const RunOptions& opt_;
  Backend& be_;
  ProcessGroups& groups_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0 only
  std::unique_ptr<CsvMonitor> csv_;      // rank 0, csv_monitor
  MemoryAccount mem_;
  int64_t mem_bytes_ = 0;               // the largest rank's model states
  bool swapped_any_ = false, host_any_ = false;
  Clock::time_point run_start_;
  int first_step_ = 1, profiled_step_ = 0;  // flops_profiler's step (0: none)
  int comm_steps_ = 0;                      // steps the comms log covers
  uint64_t launches_ = 0;                   // the backend's launches in the step (Backend::launch_count)
  OpProfile* op_profile() const;  // the backend's, with wall_clock_breakdown; else nullptr
  bool profiling_ = false;        // wall_clock_breakdown: the op profile is on inside the steps from now
  int profiled_steps_ = 0;                  // wall_clock_breakdown
  double profiled_s_ = 0, mem_bandwidth_ = 0, compute_peak_ = 0;
};

}  // namespace zero3d
