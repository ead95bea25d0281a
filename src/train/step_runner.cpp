#include "train/step_runner.h"

#include <algorithm>

#include "core/check.h"
#include "core/clock.h"

namespace zero3d {

StepRunner::StepRunner(const Config& c, Backend& be, ProcessGroups& g, ZeroEngine& engine)
    : cfg_(c), be_(be), groups_(g), micro_(c.train_micro_batch_size_per_gpu), T_(c.model.seq_len), dp_(g.topo.dp),
      dp_rank_(g.coord.dp), stage_(pipeline_stage(c.model, g.topo.pp, g.coord.pp)),
      train_data_(c.data.train, c.model.seq_len, c.model.vocab_size, c.seed, /*shuffle=*/true, "data.train") {
  const int slots = one_f_one_b_in_flight(g.coord.pp, g.topo.pp, c.gradient_accumulation_steps);
  const GPTOptions o = gpt_options(c, be.kind() == BackendKind::cuda, slots);
  for (int k = 0; k < slots; ++k) models_.push_back(std::make_unique<GPT>(be, c.model, micro_, engine, o, g.tp.get(), stage_));
  sends_.resize(slots);
  if (c.flops_profiler.enabled) {
    module_profile_.modules = gpt_modules(c.model, micro_, g.topo.tp, g.coord.tp, g.topo.pp, g.coord.pp);
    for (auto& m : models_) m->set_module_profile(&module_profile_);
  }
  schedule_ = one_f_one_b(g.coord.pp, g.topo.pp, c.gradient_accumulation_steps);
  if (!c.data.val.empty())
    val_data_ = std::make_unique<DataLoader>(c.data.val, c.model.seq_len, c.model.vocab_size, c.seed, false, "data.val");
  inputs_.resize(static_cast<size_t>(micro_) * T_);
  targets_.resize(inputs_.size());
}

PendingOp StepRunner::send(ConstView buf, int peer, int tag) {
  return groups_.pp->isend_bytes(be_.mem(buf.data), buf.bytes(), peer, tag);
}

// A token file that fails under the run (changed, an id out of range, the storage) is known to
// this rank only, in the middle of the step's collectives: the job ends here with one line, not
// through main's agreement, which the other ranks would never reach.
void StepRunner::load(DataLoader& data, uint64_t first_sample) {
  try {
    data.load(first_sample, micro_, inputs_.data(), targets_.data());
  } catch (const UserError& e) {
    abort_job(e.what(), kExitUserError);
  } catch (const RunError& e) {
    abort_job(e.what(), e.code);
  }
}

double StepRunner::take_recompute_s() {
  double s = 0;
  for (auto& m : models_) s += m->take_recompute_seconds();
  return s;
}

uint64_t StepRunner::activation_bytes() const { return models_.size() * models_[0]->activation_bytes(); }

void StepRunner::receive(View buf, int peer, int tag) {
  const auto t0 = Clock::now();
  groups_.pp->irecv_bytes(be_.mem(buf.data), buf.bytes(), peer, tag).wait();
  pipeline_idle_s_ += seconds_since(t0);
}

// The validation set: global batch k is val samples [k*micro*dp, (k+1)*micro*dp), each rank
// taking its slice; the loss is the mean over all of them.
double StepRunner::validate() {
  const int batches = cfg_.data.val_batches;
  ProcessGroup& pp = *groups_.pp;
  GPT& model = *models_[0];
  double sum = 0;
  for (int k = 0; k < batches; ++k) {  // a forward-only pipeline: each stage waits for the previous
    load(*val_data_, (static_cast<uint64_t>(k) * dp_ + dp_rank_) * micro_);
    if (!stage_.first()) receive(model.input_activation(), pp.rank() - 1, 0);
    sum += model.forward(inputs_.data(), targets_.data(), 0.0f);
    if (!stage_.last()) send(model.output_activation(), pp.rank() + 1, 0).wait();
  }
  sum = pp.all_reduce_sum(sum);  // the loss is known on the last stage only
  return groups_.dp->all_reduce_sum(sum) / (static_cast<double>(batches) * dp_);
}

double StepRunner::forward_backward(uint64_t cursor, float dloss, double& t_fwd, double& t_bwd) {
  const int gas = cfg_.gradient_accumulation_steps;
  const int K = static_cast<int>(models_.size());
  auto sample = [&](int m) { return cursor + (static_cast<uint64_t>(dp_rank_) * gas + m) * micro_; };
  // Tags: activations 2m, gradients 2m + 1 (one stream per neighbour and direction, in order).
  double loss_sum = 0;
  pipeline_idle_s_ = 0;
  for (const PipeStep& op : schedule_) {
    const int slot = op.micro_batch % K;
    GPT& model = *models_[slot];
    const bool sending = op.op == PipeOp::send_activation || op.op == PipeOp::send_grad;
    if (!sending) {  // anything that writes a slot's buffers waits for the sends still reading them
      for (auto& s : sends_[slot]) s.wait();
      sends_[slot].clear();
    }
    switch (op.op) {
      case PipeOp::recv_activation:
        receive(model.input_activation(), op.peer_stage, 2 * op.micro_batch);
        break;
      case PipeOp::forward: {
        load(train_data_, sample(op.micro_batch));
        const auto t0 = Clock::now();
        model.run_forward(inputs_.data(), targets_.data(), dloss);  // its loss read at the step's end
        t_fwd += seconds_since(t0);
        break;
      }
      case PipeOp::send_activation:
        sends_[slot].push_back(send(model.output_activation(), op.peer_stage, 2 * op.micro_batch));
        break;
      case PipeOp::recv_grad:
        receive(model.output_gradient(), op.peer_stage, 2 * op.micro_batch + 1);
        break;
      case PipeOp::backward: {
        const auto t0 = Clock::now();
        model.backward();
        if (cfg_.wall_clock_breakdown) be_.synchronize();
        t_bwd += seconds_since(t0);
        break;
      }
      case PipeOp::send_grad:
        sends_[slot].push_back(send(model.input_gradient(), op.peer_stage, 2 * op.micro_batch + 1));
        break;
    }
  }
  for (auto& slot_sends : sends_) {
    for (auto& s : slot_sends) s.wait();
    slot_sends.clear();
  }
  for (auto& m : models_) loss_sum += m->take_losses();  // one copy from the device per model, per step
  return loss_sum;
}

}  // namespace zero3d
