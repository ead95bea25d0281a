// train/trainer.h: one training run, as a thin loop over parts that own their state:
//   StepRunner       (train/step_runner.h) the models, the 1F1B schedule, the micro-batches, validation
//   GradFinisher     (zero/grad_finish.h)  the gradient finished: dp, tied embedding, norm, clip
//   ZeroEngine       (zero/engine.h)       parameters, gradients and optimizer state, sharded
//   RunRecords       (train/records.h)     metrics.jsonl, the monitors and profilers, progress lines
//   CheckpointPolicy (train/ckpt_policy.h) directories and locks, saves, the time budget, how a run ends
//   FaultInjector    (train/fault.h)       ZERO3D_FAULT's hooks, for the safety tests
// A step: forward and backward of gradient_accumulation_steps micro-batches, the gradient
// finished, one AdamW update (skipped on overflow), the parameters gathered, one record; then the
// step boundary: divergence and consistency checks, validation, a stop or a save.
// Invariant: the global batch of step s is samples [s*G, (s+1)*G) of the loader's order whatever
// the micro-batch split, so the logged loss (the mean over the global batch) is layout-independent.
#pragma once
#include <memory>
#include <string>

#include "config/config.h"
#include "kernels/backend.h"
#include "parallel/groups.h"
#include "train/run_options.h"

namespace zero3d {

class Trainer {
 public:
  // Validates everything (data files, layout, the checkpoint to load, storage) before anything is
  // written; every rank agrees on the outcome before any rank goes on. Throws UserError.
  Trainer(const Config& config, const RunOptions& options, Backend& backend, ProcessGroups& groups);
  ~Trainer();
  // Trains train_steps steps; returns the process exit code.
  int run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zero3d
