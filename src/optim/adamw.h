// optim/adamw.h: AdamW on one flat fp32 buffer with DeepSpeed's FusedAdam semantics (see
// kernels/math/adamw.h for the update), with weight decay applied per segment: matrices and
// embeddings decay, biases and LayerNorm parameters do not (the GPT-2/Megatron convention).
// As DeepSpeed's engine does, the update is decoupled (AdamW) when type == "AdamW" or adam_w_mode
// is set, so only type "Adam" with adam_w_mode = false is Adam + L2. The step count starts at 0
// and is incremented before the update, so the first update uses t = 1 in the bias corrections,
// which are computed in double from the fp32-rounded betas the kernel uses (as multi_tensor_adam.cu).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "kernels/backend.h"

namespace zero3d {

struct DecaySegment {
  size_t offset = 0;
  size_t size = 0;
  bool decay = true;
};

// One contiguous run of parameters updated with one decay setting: params and grads where they
// live (a ZeRO shard's slice of a bucket, say), state_offset into the optimizer's m and v.
struct AdamSegment {
  float* params = nullptr;
  const float* grads = nullptr;
  size_t state_offset = 0;
  size_t size = 0;
  bool decay = true;
};

class AdamW {
 public:
  AdamW(Backend& backend, const OptimizerConfig& config, size_t num_params);

  // One update of params[0..n) from grads; lr from the schedule; increments the step count.
  // `segments` covers [0, n) and says where weight decay applies.
  void step(float* params, const float* grads, double lr, const std::vector<DecaySegment>& segments);
  // The general form: one step over segments that together cover the optimizer state once.
  void step(const std::vector<AdamSegment>& segments, double lr);

  int64_t step_count() const { return step_; }  // applied updates so far
  bool decoupled() const { return cfg_.type == OptimizerType::AdamW || cfg_.adam_w_mode; }
  void set_step_count(int64_t s) { step_ = s; }
  float* exp_avg() { return m_.data(); }
  float* exp_avg_sq() { return v_.data(); }
  size_t size() const { return m_.size(); }

 private:
  Backend& be_;
  OptimizerConfig cfg_;
  DeviceBuffer<float> m_, v_;
  int64_t step_ = 0;
};

}  // namespace zero3d
