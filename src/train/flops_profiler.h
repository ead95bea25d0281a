// train/flops_profiler.h: DeepSpeed's flops profiler (flops_profiler.*) for the GPT.
//
// At profile_step the trainer switches the models' module timers on (model/module_profile.h)
// for one step; this file turns what they measured into DeepSpeed's profile summary: world, dp
// and mp sizes, params, forward MACs and flops, fwd/bwd/step/iter latency and the FLOPS of
// each, the top modules per depth, and the per-module tree (embedding, each block's ln_1, attn,
// ln_2, mlp, ln_f, lm_head), limited by module_depth and top_modules.
//
// Every rank times its own slice; the tp rank 0 of dp rank 0 of each pipeline stage speaks for
// its stage, and world rank 0 prints the stages in order (one text, not interleaved), writes
// output_file and the "profile" / "profile_module" records.
//
// Invariant: nothing is estimated. Latencies are measured; "bwd latency" is the modules'
// backward plus the gradient reduction after it, "step latency" the optimizer step plus the
// parameter all-gather; what the step spent outside all of them (pipeline waits, data, control
// reductions) is printed as such, so fwd + bwd + step + outside = iter exactly.
#pragma once
#include <string>

#include "config/config.h"
#include "model/module_profile.h"
#include "parallel/groups.h"
#include "train/metrics.h"

namespace zero3d {

// What the trainer measured on this rank in the profiled step, besides the modules.
struct ProfiledStep {
  int step = 0;
  int micro_batch = 1, accumulation = 1;
  double reduce_s = 0;     // gradient reduction after backward (finish_gradients, tied embedding)
  double optimizer_s = 0;  // gradient norm, clipping, the update
  double gather_s = 0;     // ZeRO-1/2 all-gather of the updated parameters
  double idle_s = 0;       // pipeline waits for the neighbours
  double step_s = 0;       // the whole step (the slowest rank's)
};

// Collective over the world group: every rank calls it once, after the profiled step. Returns
// the printed text on world rank 0 ("" elsewhere).
std::string report_flops_profile(const FlopsProfilerConfig& cfg, const ModelConfig& model, ProcessGroups& groups,
                                 const ModuleProfile& mine, const ProfiledStep& step, MetricsLog* metrics);

}  // namespace zero3d
