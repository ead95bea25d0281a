// train/step_runner.h: the forward and backward half of a training step on this rank: the model
// replicas (one per micro-batch in flight), the 1F1B schedule as a list of operations, the
// activation sends still in flight, the data loaders, and the forward-only validation pass.
//
// Invariant: the global batch of step s is samples [cursor, cursor + G) of the loader's order
// whatever the layout; dp rank d takes [d*micro*gas, (d+1)*micro*gas) of it, so the mean loss
// over the global batch is layout-independent.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "config/config.h"
#include "data/loader.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "model/module_profile.h"
#include "parallel/groups.h"
#include "parallel/schedule.h"
#include "zero/engine.h"

namespace zero3d {

class StepRunner {
 public:
  StepRunner(const Config& c, Backend& be, ProcessGroups& groups, ZeroEngine& engine);

  // This step's micro-batches in the stage's 1F1B order, from global sample `cursor`; dloss: the
  // gradient of the loss sum (1 / tokens in the global batch, times the loss scale). Returns the
  // summed loss (on the last stage; 0 elsewhere) and adds to the forward and backward times.
  double forward_backward(uint64_t cursor, float dloss, double& t_fwd, double& t_bwd);
  // The validation loss: val_batches global batches of the val file, forward only (collective).
  double validate();
  bool can_validate() const { return val_data_ != nullptr && cfg_.data.val_batches > 0; }
  int64_t val_tokens() const {  // what validate() reads, over every rank
    return static_cast<int64_t>(cfg_.data.val_batches) * micro_ * dp_ * T_;
  }

  double idle_s() const { return pipeline_idle_s_; }  // this step's waits for the neighbours
  double take_recompute_s();                           // activation checkpointing's re-forwards
  uint64_t activation_bytes() const;                   // all replicas
  ModuleProfile& module_profile() { return module_profile_; }
  DataOrder data_order() const { return train_data_.order(); }  // what the cursor counts in

 private:
  // The pipeline's activations and gradients, as bytes (their type is the model's): a receive waits.
  void receive(View buf, int peer, int tag);
  PendingOp send(ConstView buf, int peer, int tag);
  void load(DataLoader& data, uint64_t first_sample);  // one micro-batch into inputs_/targets_

  const Config& cfg_;
  Backend& be_;
  ProcessGroups& groups_;
  int micro_, T_, dp_, dp_rank_;
  PipelineStage stage_;
  DataLoader train_data_;
  std::unique_ptr<DataLoader> val_data_;
  std::vector<std::unique_ptr<GPT>> models_;   // one per micro-batch in flight (1 without pp)
  std::vector<std::vector<PendingOp>> sends_;  // per model: p2p sends still in flight
  std::vector<PipeStep> schedule_;             // this stage's 1F1B operation list
  std::vector<int32_t> inputs_, targets_;
  double pipeline_idle_s_ = 0;
  ModuleProfile module_profile_;  // flops_profiler: the models' module timers
};

}  // namespace zero3d
