// optim/adamw.cpp: the host side of FusedAdam (deepspeed/ops/adam/fused_adam.py and
// csrc/adam/multi_tensor_adam.cu): step count, bias corrections, the runs of a step handed to the
// backend together (Backend::adam_steps: not one launch per run).
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace zero3d {
namespace {

// Segments must tile [0, n) exactly: a gap would leave parameters un-updated, an overlap would
// update them twice.
bool tiles(std::vector<DecaySegment> segs, size_t n) {
  std::sort(segs.begin(), segs.end(), [](const DecaySegment& a, const DecaySegment& b) { return a.offset < b.offset; });
  size_t end = 0;
  for (const DecaySegment& s : segs) {
    if (s.offset != end) return false;
    end += s.size;
  }
  return end == n;
}

}  // namespace

AdamW::AdamW(Backend& backend, const OptimizerConfig& config, size_t num_params)
    : be_(backend), cfg_(config), m_(backend, num_params), v_(backend, num_params) {}  // alloc zeroes

void AdamW::step(float* params, const float* grads, double lr, const std::vector<DecaySegment>& segments) {
  Z3D_ASSERT(tiles(segments, m_.size()),
             strprintf("AdamW::step: decay segments do not tile the %zu parameters", m_.size()));
  begin_step(lr);
  std::vector<AdamRun> runs;
  for (const DecaySegment& d : segments)
    runs.push_back({params + d.offset, m_.data() + d.offset, v_.data() + d.offset, grads + d.offset, d.size,
                    decay(d.decay), nullptr});
  update(runs, false);
}

void AdamW::begin_step(double lr) {
  ++step_;
  a_ = math::adam_params(lr, cfg_.betas[0], cfg_.betas[1], cfg_.eps, 0.0, step_, cfg_.bias_correction, decoupled());
}

void AdamW::update(const std::vector<AdamRun>& runs, bool fp16) const {
  if (!runs.empty()) be_.adam_steps(runs.data(), runs.size(), a_, fp16);
}

}  // namespace zero3d
