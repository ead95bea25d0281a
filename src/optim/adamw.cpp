// optim/adamw.cpp: the host side of FusedAdam (deepspeed/ops/adam/fused_adam.py and
// csrc/adam/multi_tensor_adam.cu): step count, bias corrections, one kernel launch per segment.
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
  for (const DecaySegment& d : segments)
    update(params + d.offset, m_.data() + d.offset, v_.data() + d.offset, grads + d.offset, d.size, d.decay);
}

void AdamW::begin_step(double lr) {
  ++step_;
  a_ = math::adam_params(lr, cfg_.betas[0], cfg_.betas[1], cfg_.eps, 0.0, step_, cfg_.bias_correction, decoupled());
}

void AdamW::update(float* params, float* m, float* v, const float* grads, size_t n, bool decay, Weights16 w16) const {
  if (n == 0) return;
  math::AdamParams a = a_;
  a.weight_decay = decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
  be_.adam_step(params, m, v, grads, n, a, w16);
}

}  // namespace zero3d
