// train/trainer.h: owns the ZeRO engine, model and data loaders of one run and runs the step
// loop: for each step, gradient_accumulation_steps micro-batches of forward + backward on this
// rank's slice of the global batch, the gradient reduction, the global gradient norm, clipping,
// the LR schedule, one AdamW update, one metrics record (rank 0).
// Invariant: the global batch of step s is samples [s*G, (s+1)*G) of the loader's order whatever
// the micro-batch split, so the logged loss (the mean over the global batch) is layout-independent.
#pragma once
#include <memory>
#include <string>

#include "config/config.h"
#include "kernels/backend.h"
#include "parallel/groups.h"
#include "train/job.h"

namespace zero3d {

struct RunOptions {
  std::string run_dir;     // created by the trainer after every input has been validated
  double peak_flops = 0;   // MFU denominator per rank; 0 = known accelerator peak, else on a CPU its FMA peak
  std::string peak_source;
  std::string compute_choice;  // which precision the GEMMs run in, and why (commands.cpp)
  JobInfo job;             // launch facts: local rank, Slurm job and its time left, thread settings
};

class Trainer {
 public:
  // Validates everything (data files, layout) before anything is written; every rank agrees on
  // the outcome before any rank goes on. Throws UserError.
  Trainer(const Config& config, const RunOptions& options, Backend& backend, ProcessGroups& groups);
  ~Trainer();
  // Trains train_steps steps; returns the process exit code.
  int run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zero3d
