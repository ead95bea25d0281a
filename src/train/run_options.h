// train/run_options.h: what a run takes from its command line besides the config, decided once
// before the trainer is built and read by its parts (records, checkpoint policy).
#pragma once
#include <string>

#include "parallel/job.h"

namespace zero3d {

// What the command line (app/train.cpp) decided for the run before it starts.
struct RunOptions {
  std::string run_dir;     // created by the trainer after every input has been validated
  double peak_flops = 0;   // MFU denominator per rank (bench/rates.h mfu_peak, or --peak-flops)
  std::string peak_source;
  std::string compute_choice;  // which precision the GEMMs run in, and why (app/train.cpp)
  JobInfo job;             // launch facts: local rank, Slurm job and its time left, thread settings
};

}  // namespace zero3d
