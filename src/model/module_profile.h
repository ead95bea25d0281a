// model/module_profile.h: the GPT's modules as the flops profiler sees them, and their timers.
//
// A module is a leaf of DeepSpeed's module tree for GPT-2: embedding, per block ln_1, attn, ln_2,
// mlp, then ln_f and lm_head (a pipeline stage has its share). gpt_modules() describes them
// without a model instance, so rank 0 can describe every stage.
//
// MACs follow the model-FLOPs convention (gpt_flops_per_token: 6 per parameter per token plus
// causal attention): a forward pass costs one MAC per parameter per token in the module that
// multiplies with it (the tied wte in lm_head, not in the lookup; wpe in none), plus QK^T and AV
// over the causal half, B * (d_model/tp) * T * (T + 1). So on one rank the modules' MACs add up
// to the model's; with tp each rank counts its own slice, replicated LayerNorms and biases on
// every tp rank.
//
// Invariant: a timed module runs between two backend synchronizes, so module times never
// overlap and add up to the part of the step spent inside modules.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace zero3d {

struct ModelConfig;

struct ModuleStat {
  std::string name;     // "embedding", "h.3.attn", "ln_f", "lm_head"
  double params = 0;    // this rank's parameters in the module (lm_head: 0, its weight is wte)
  double macs = 0;      // forward MACs of one micro-batch on this rank
  double fwd_s = 0, bwd_s = 0;  // measured while the profile is on, summed over micro-batches
  double fwd_launches = 0, bwd_launches = 0;  // the backend's launches in them (Backend::launch_count)
};

// This rank's modules in forward order: its stage's share for tp rank `tp_rank` of `tp`.
std::vector<ModuleStat> gpt_modules(const ModelConfig& m, int micro_batch, int tp, int tp_rank, int pp, int pp_rank);

class ModuleProfile {
 public:
  bool on = false;  // timing now (the profile step)
  std::vector<ModuleStat> modules;

  void reset_times() {
    for (ModuleStat& s : modules) s.fwd_s = s.bwd_s = s.fwd_launches = s.bwd_launches = 0;
  }

  // Times a scope as module `index`'s forward or backward (when on).
  class Scope {
   public:
    Scope(ModuleProfile* p, Backend& be, size_t index, bool backward)
        : p_(p && p->on ? p : nullptr), be_(be), index_(index), backward_(backward) {
      if (!p_) return;
      be_.synchronize();
      t0_ = std::chrono::steady_clock::now();
      launches0_ = be_.launch_count();
    }
    ~Scope() {
      if (!p_) return;
      be_.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      const double launches = static_cast<double>(be_.launch_count() - launches0_);
      ModuleStat& m = p_->modules[index_];
      (backward_ ? m.bwd_s : m.fwd_s) += s;
      (backward_ ? m.bwd_launches : m.fwd_launches) += launches;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ModuleProfile* p_;
    Backend& be_;
    size_t index_;
    bool backward_;
    std::chrono::steady_clock::time_point t0_;
    uint64_t launches0_ = 0;
  };
};

}  // namespace zero3d
