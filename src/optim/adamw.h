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

// The update rule and the step count. Where m and v live is the caller's (zero/optimizer_state.h);
// the flat form below keeps its own, for one buffer of parameters.
class AdamW {
 public:
  AdamW(Backend& backend, const OptimizerConfig& config, size_t num_params = 0);  // num_params: the flat form's state

  // A step in parts: begin_step counts it and fixes lr and the bias corrections, then update()
  // runs on every piece of the state (in any order and any split: each element is independent).
  void begin_step(double lr);
  // Pieces of the state in one backend op (Backend::adam_steps: one launch for many runs), each
  // run's weight decay from decay(); p16 (the updated params rounded to 16 bits in the same pass)
  // fp16 when `fp16`, else bf16.
  void update(const std::vector<AdamRun>& runs, bool fp16) const;
  float decay(bool decays) const { return decays ? static_cast<float>(cfg_.weight_decay) : 0.0f; }

  // The flat form: one update of params[0..n) from grads with the state kept here; `segments`
  // covers [0, n) and says where weight decay applies.
  void step(float* params, const float* grads, double lr, const std::vector<DecaySegment>& segments);

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
  math::AdamParams a_{};  // this step's
};

}  // namespace zero3d
