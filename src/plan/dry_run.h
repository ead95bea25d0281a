// plan/dry_run.h: the arithmetic of a run before it starts (`zero3d train --dry-run`): its
// parameters (in all, and per rank of each pipeline stage), tokens, model FLOPs, the FLOP/s it
// assumes per rank and the time that takes; for a run dir it would resume, how far that run got
// and how long the rest takes at its measured rate; and whether that fits the Slurm job.
// Invariant: every number comes from what the trainer itself uses (the resolved config,
// gpt_param_table, gpt_flops_per_token), so a dry run on N ranks and the run record of a real
// run on N ranks agree exactly. A dry run writes nothing and needs no MPI world of N ranks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/job.h"

namespace zero3d {

struct RunPlan {
  std::string config_file;
  int ranks = 1, dp = 1, tp = 1, pp = 1, zero_stage = 0;
  Precision precision = Precision::fp32;
  int64_t num_params = 0;                 // the whole model's
  std::vector<int64_t> params_per_rank;   // per pipeline stage: one tensor-parallel rank's share
  std::string architecture;  // describe_architecture
  std::vector<std::string> stage_layers;  // per pipeline stage: "layers 0-1", with what else it holds
  std::vector<uint64_t> memory_per_rank;  // per pipeline stage: zero3d plan's bytes (none with nvme offload)
  double flops_per_token = 0;             // model FLOPs (forward + backward), as the run record's
  int64_t train_batch_size = 0, seq_len = 0, train_steps = 0;
  uint64_t train_sequences = 0;           // sequences of seq_len in data.train (one epoch)
  double peak_flops = 0;                  // the MFU peak per rank; 0: measured at start (CPU)
  std::string peak_source;
  double flops_per_rank = 0;              // the sustained model FLOP/s per rank the estimate assumes
  std::string flops_per_rank_source;
  // A resumed run: the checkpoint it would continue from and the model FLOP/s its last steps
  // measured (metrics.jsonl; 0 when none).
  int64_t start_step = 0;
  std::string resume_from;
  double measured_flops_per_s = 0;
  int measured_steps = 0;
  double job_seconds_left = 0;  // the Slurm job's time left; infinity outside Slurm or without a limit
  std::vector<std::string> notices;  // keys accepted without effect (Config::notices)

  double tokens_per_step() const { return static_cast<double>(train_batch_size) * seq_len; }
  double flops_per_step() const { return flops_per_token * tokens_per_step(); }
  // Seconds for the steps still to run: at the measured rate when resuming with measurements,
  // else at flops_per_rank on every rank.
  double seconds_left() const;
};

// What a dry run takes besides the config: the MFU peak per rank as the trainer would get it
// (--peak-flops, a known GPU's; 0 = measured at start), the sustained FLOP/s per rank for the
// estimate (ZERO3D_FLOPS_PER_RANK; 0 = the default rule), the run dir and the launch facts.
struct DryRunInputs {
  std::string config_file, run_dir;
  int ranks = 1;
  double peak_flops = 0;
  std::string peak_source;
  double flops_per_rank = 0;
  JobInfo job;
  bool device = false;  // a GPU backend: the plan's memory is device memory
};

// Validates what a real run validates before it writes anything (the data files; the checkpoint a
// `checkpoint.load` path names); throws UserError as the real run does.
RunPlan plan_run(const Config& cfg, const DryRunInputs& in);
std::string format_plan(const RunPlan& p);  // the readable block, one fact a line
std::string plan_json(const RunPlan& p);    // one JSON object, the fields of RunPlan (README "Running")

}  // namespace zero3d
