// optim/lr_schedule.h: DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py), with its
// parameter names. (Gradient clipping is zero/grad_finish.h.)
//
// Timing (the non-obvious part). A DeepSpeed scheduler starts at last_batch_iteration = -1 and its
// constructor writes get_lr() at -1 into the optimizer (WarmupLR/WarmupDecayLR: warmup_min_lr;
// WarmupCosineLR: 0). The engine calls scheduler.step() *after* each applied optimizer step
// (not after a step skipped for fp16 overflow). So applied optimizer step s (1-based) runs with the
// schedule at last_batch_iteration = s - 2:
//   step 1 -> it = -1 (min lr, or 0 for WarmupCosineLR), step 2 -> it = 0, step 3 -> it = 1, ...
// lr_for_step() encodes this; lr_at() is the schedule itself.
// (DeepSpeed before PR #6597, Oct 2024, did not write the lr at construction, so its step 1 ran
// with optimizer.params.lr instead; we follow the current behaviour.)
#pragma once
#include <cstdint>

#include <string>

#include "config/config.h"

namespace zero3d {

// Learning rate at 0-based schedule iteration `it` (DeepSpeed's last_batch_iteration); it < 0 is
// the value a fresh scheduler writes at construction. `base_lr` is optimizer.params.lr:
// WarmupCosineLR scales it; WarmupLR/WarmupDecayLR use warmup_min_lr/warmup_max_lr; no scheduler
// (SchedulerType::none) returns base_lr. warmup_num_steps is raised to 2 as DeepSpeed does (max(2, W)).
double lr_at(const SchedulerConfig& sched, double base_lr, int64_t it);

// The lr DeepSpeed applies at optimizer step `step` (1-based count of *applied* steps, i.e.
// AdamW::step_count() after the step): lr_at(step - 2). See the timing note above.
double lr_for_step(const SchedulerConfig& sched, double base_lr, int64_t step);

// The schedule's position, described for a checkpoint (JSON: type, applied_steps, next_lr). Not
// read back: the position is the optimizer's applied steps, which the engine restores.
std::string schedule_state(const SchedulerConfig& sched, double base_lr, int64_t applied_steps);


}  // namespace zero3d
