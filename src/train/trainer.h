// train/trainer.h: owns the model, optimizer and data loaders of one run and runs the step loop:
// for each step, gradient_accumulation_steps micro-batches of forward + backward, the global
// gradient norm, clipping, the LR schedule, one AdamW update, one metrics record.
// Invariant: the global batch of step s is samples [s*G, (s+1)*G) of the loader's order whatever
// the micro-batch split, so the logged loss (the mean over the global batch) is layout-independent.
#pragma once
#include <memory>
#include <string>

#include "config/config.h"
#include "kernels/backend.h"

namespace zero3d {

struct RunOptions {
  std::string run_dir;     // created by the trainer after every input has been validated
  double peak_flops = 0;   // MFU denominator; 0 = known accelerator peak or measured GEMM rate
  std::string peak_source;
};

class Trainer {
 public:
  // Validates everything (data files, layout) before anything is written. Throws UserError.
  Trainer(const Config& config, const RunOptions& options, Backend& backend);
  ~Trainer();
  // Trains train_steps steps; returns the process exit code.
  int run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zero3d
