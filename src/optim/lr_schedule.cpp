// optim/lr_schedule.cpp: the formulas of deepspeed/runtime/lr_schedules.py (WarmupLR._get_gamma,
// WarmupDecayLR._get_gamma, WarmupCosineLR.get_lr_ratio).
#include "optim/lr_schedule.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace zero3d {
namespace {

// Warmup fraction in [0, 1) for it < W (W already raised to >= 2):
//   log:    ln(it + 1) / ln(W)      (reaches 1 at it = W - 1)
//   linear: it / W                  (reaches (W-1)/W at it = W - 1, then jumps to 1)
double warmup_fraction(const SchedulerConfig& s, int64_t it, int64_t W) {
  if (s.warmup_type == WarmupType::linear) return static_cast<double>(it) / static_cast<double>(W);
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(W));
}

}  // namespace

double lr_at(const SchedulerConfig& s, double base_lr, int64_t it) {
  if (s.type == SchedulerType::none) return base_lr;
  const int64_t W = std::max<int64_t>(2, s.warmup_num_steps);
  const int64_t T = s.total_num_steps;

  if (s.type == SchedulerType::WarmupLR || s.type == SchedulerType::WarmupDecayLR) {
    // lr = min + (max - min) * gamma; before the first scheduler step, min.
    if (it < 0) return s.warmup_min_lr;
    double gamma = 1.0;
    if (it < W) {
      gamma = warmup_fraction(s, it, W);
    } else if (s.type == SchedulerType::WarmupDecayLR) {
      // linear decay from max at it = W to min at it = T, then held at min
      gamma = std::max(0.0, static_cast<double>(T - it) / std::max(1.0, static_cast<double>(T - W)));
    }
    return s.warmup_min_lr + (s.warmup_max_lr - s.warmup_min_lr) * gamma;
  }

  // WarmupCosineLR
  // lr = base_lr * ratio; before the first scheduler step the ratio is 0.
  if (it < 0) return 0.0;
  if (it < W) {
    const double f = warmup_fraction(s, it, W);
    return base_lr * (s.warmup_min_ratio + f * (1.0 - s.warmup_min_ratio));
  }
  // cosine from 1 to cos_min_ratio over (W, T]; progress clamped to 1 so the lr stays at the floor
  // past T (current DeepSpeed; releases without the clamp let the cosine climb back up).
  const double real_last_step = static_cast<double>(it - W + 1);
  const double real_total_steps = static_cast<double>(std::max<int64_t>(1, T - W));
  const double progress = std::min(1.0, real_last_step / real_total_steps);
  const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return base_lr * std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
}

double lr_for_step(const SchedulerConfig& sched, double base_lr, int64_t step) {
  return lr_at(sched, base_lr, step - 2);
}


std::string schedule_state(const SchedulerConfig& sched, double base_lr, int64_t applied_steps) {
  return nlohmann::json{{"type", name_of(sched.type)},
                        {"applied_steps", applied_steps},
                        {"next_lr", lr_for_step(sched, base_lr, applied_steps + 1)}}
      .dump();
}

}  // namespace zero3d
