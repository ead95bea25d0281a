// zero/grad_finish.h: the gradient of a step finished in one place, after the last backward
// (Megatron-Core's finalize_model_grads):
//   1. the data-parallel reduction (the engine's GradSync: all-reduce or reduce-scatter, by stage);
//   2. the tied embedding's two copies summed over the embedding group (first and last pipeline
//      stage), so both hold one gradient;
//   3. the global norm of the unscaled gradient, each parameter counted once: the engine's sum of
//      squares over this rank's owned shard, summed over tp, then over pp (dp shards are disjoint
//      and the engine already summed them);
//   4. unscale (the fp16 loss scale) and clip (gradient_clipping) in one pass.
// Invariant: every rank of the world issues these collectives in this order, and an inf or nan on
// any rank makes the norm non-finite on every rank (an overflow everywhere).
#pragma once
#include "kernels/backend.h"
#include "parallel/groups.h"
#include "zero/engine.h"

namespace zero3d {

// DeepSpeed/PyTorch gradient clipping: coefficient = max_norm / (norm + 1e-6), applied only when
// below 1. Returns the factor to scale gradients by (1 when clipping is off, max_norm <= 0, or not
// needed). Note norm == max_norm still clips, by max_norm / (max_norm + 1e-6). An infinite norm
// gives 0; a NaN norm gives 1 (the caller's overflow check must skip such a step).
double clip_coefficient(double max_norm, double grad_norm);

class GradFinisher {
 public:
  GradFinisher(ZeroEngine& engine, Backend& be, ProcessGroups& groups) : engine_(engine), be_(be), groups_(groups) {}
  // Steps 1-2; collective over the dp and embedding groups.
  void reduce();
  // Step 3: the global norm of the unscaled gradient (loss_scale: what backward scaled the loss
  // by); collective over tp and pp.
  double global_norm(double loss_scale);
  // Step 4, on this rank's optimizer-owned gradient: one multiply by clip / loss_scale (none when 1).
  void unscale_and_clip(double max_norm, double grad_norm, double loss_scale);

 private:
  ZeroEngine& engine_;
  Backend& be_;
  ProcessGroups& groups_;
};

}  // namespace zero3d
