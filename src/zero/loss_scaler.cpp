// zero/loss_scaler.cpp: DynamicLossScaler.update_scale of deepspeed/runtime/fp16/loss_scaler.py,
// line for line (see the header for the rules), plus the static and disabled modes.
#include "zero/loss_scaler.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "config/json_tree.h"
#include "core/check.h"

namespace zero3d {
namespace {

constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor, fixed at 2 in DynamicLossScaler

}  // namespace

LossScaler::LossScaler(const Fp16Config& cfg) {
  if (!cfg.enabled) return;  // mode off, scale 1
  if (!(std::isfinite(cfg.loss_scale) && cfg.loss_scale >= 0))
    throw UserError(strprintf("fp16.loss_scale = %g is not valid (use 0 for dynamic loss scaling, or a finite "
                              "static scale > 0)", cfg.loss_scale));
  if (cfg.loss_scale > 0) {
    mode_ = Mode::fixed;
    state_.scale = cfg.loss_scale;
    return;
  }
  mode_ = Mode::dynamic;
  if (cfg.loss_scale_window < 1)
    throw UserError(strprintf("fp16.loss_scale_window = %d is not valid (use an integer >= 1)", cfg.loss_scale_window));
  if (cfg.hysteresis < 1)
    throw UserError(strprintf("fp16.hysteresis = %d is not valid (use an integer >= 1)", cfg.hysteresis));
  if (!(std::isfinite(cfg.min_loss_scale) && cfg.min_loss_scale > 0))
    throw UserError(strprintf("fp16.min_loss_scale = %g is not valid (use a finite value > 0)", cfg.min_loss_scale));
  const double initial = std::ldexp(1.0, cfg.initial_scale_power);
  if (!(std::isfinite(initial) && initial > 0))
    throw UserError(strprintf("fp16.initial_scale_power = %d is not valid (2^power must be a finite double > 0)",
                              cfg.initial_scale_power));
  window_ = cfg.loss_scale_window;
  hysteresis_ = cfg.hysteresis;
  consecutive_hysteresis_ = cfg.consecutive_hysteresis;
  min_scale_ = cfg.min_loss_scale;
  continue_at_min_scale_ = cfg.continue_at_min_scale;
  state_ = State{initial, 0, -1, cfg.hysteresis};
}

bool LossScaler::update(bool overflow, int64_t step) {
  if (mode_ == Mode::off) return false;
  if (mode_ == Mode::fixed) return overflow;

  State& s = state_;
  if (overflow) {
    if (hysteresis_ == 1 || s.cur_hysteresis == 1) {
      if (s.scale == min_scale_ && !continue_at_min_scale_)
        throw RunError(strprintf("fp16 gradient overflow at step %lld with the loss scale already at "
                                 "fp16.min_loss_scale = %g: it cannot be lowered further, so the run stops (as "
                                 "DeepSpeed does); set fp16.continue_at_min_scale=true to keep training at this "
                                 "scale, skipping overflowed steps, or lower fp16.min_loss_scale",
                                 static_cast<long long>(step), s.scale),
                       kExitLossScale);
      s.scale = std::max(s.scale / kScaleFactor, min_scale_);
    } else {
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
    const int64_t stable = s.cur_iter - s.last_overflow_iter - 1;
    if (stable > 0 && stable % window_ == 0) {
      if (!consecutive_hysteresis_) s.cur_hysteresis = hysteresis_;
      s.scale *= kScaleFactor;
    }
  }
  s.cur_iter += 1;
  return overflow;
}

void LossScaler::restore(const State& s) {
  if (mode_ != Mode::dynamic) return;
  if (!(std::isfinite(s.scale) && s.scale > 0) || s.cur_iter < 0 || s.last_overflow_iter < -1 ||
      s.last_overflow_iter >= s.cur_iter || s.cur_hysteresis < 1)
    throw UserError(strprintf("checkpoint: fp16 loss scaler state is not valid (scale %g, cur_iter %lld, "
                              "last_overflow_iter %lld, cur_hysteresis %d)",
                              s.scale, static_cast<long long>(s.cur_iter),
                              static_cast<long long>(s.last_overflow_iter), s.cur_hysteresis));
  state_ = s;
}

namespace {
struct Saved {
  bool dynamic = false;
  LossScaler::State state;
};
Saved parse_saved(const std::string& text) {
  const auto j = config_json::parse_text(text, "the checkpoint's loss scaler record");
  try {
    return {j.at("dynamic").get<bool>(),
            {j.at("scale").get<double>(), j.at("cur_iter").get<int64_t>(), j.at("last_overflow_iter").get<int64_t>(),
             j.at("cur_hysteresis").get<int>()}};
  } catch (const nlohmann::json::exception&) {
    throw UserError("the checkpoint's loss scaler record " + config_json::show(j) +
                    " lacks one of dynamic, scale, cur_iter, last_overflow_iter, cur_hysteresis or has a value of the "
                    "wrong type");
  }
}
}  // namespace

std::string LossScaler::save_state() const {
  return nlohmann::json{{"dynamic", dynamic()},
                        {"scale", state_.scale},
                        {"cur_iter", state_.cur_iter},
                        {"last_overflow_iter", state_.last_overflow_iter},
                        {"cur_hysteresis", state_.cur_hysteresis}}
      .dump();
}

void LossScaler::check_state(const std::string& text) { parse_saved(text); }

void LossScaler::load_state(const std::string& text) {
  const Saved s = parse_saved(text);
  if (s.dynamic && dynamic()) restore(s.state);
}

}  // namespace zero3d
