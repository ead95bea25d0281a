// zero/loss_scaler.h: DeepSpeed's fp16 loss scaling (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler.update_scale and LossScaler, as ZeRO stages 1-3 use them), with its parameter names.
//
// Invariant: update() is called once per optimizer step (never per micro-batch), skipped steps
// included, with the overflow flag already agreed over every rank (dp, tp and pp groups), so every
// rank's scaler holds the same state and takes the same decision, including the throw at the minimum.
//
// Modes. fp16.enabled = false (fp32, bf16): scale 1, update() never skips. fp16.loss_scale > 0:
// static; the scale never changes, but an overflowed step is still skipped (DeepSpeed's engine sets
// check_grad_overflow for any fp16 run; LossScaler.update_scale is a no-op). fp16.loss_scale = 0:
// dynamic, starting at 2^initial_scale_power, factor 2 both ways. update(overflow) on the dynamic state
// {scale, cur_iter (starts 0), last_overflow_iter (starts -1), cur_hysteresis (starts hysteresis)}:
//   overflow:
//     if hysteresis == 1 or cur_hysteresis == 1:
//       if scale == min_loss_scale: throw RunError(kExitLossScale), state untouched
//                                   (continue_at_min_scale = true: fall through, the scale stays)
//       scale = max(scale / 2, min_loss_scale)      (cur_hysteresis is NOT refilled here)
//     else: cur_hysteresis -= 1                     (scale unchanged)
//     last_overflow_iter = cur_iter
//   clean:
//     if consecutive_hysteresis: cur_hysteresis = hysteresis
//     stable = cur_iter - last_overflow_iter - 1    (clean updates before this one since the overflow)
//     if stable > 0 and stable % loss_scale_window == 0:
//       scale *= 2; if not consecutive_hysteresis: cur_hysteresis = hysteresis
//   cur_iter += 1
// So the scale first doubles on the (window + 1)-th consecutive clean step (after an overflow, and
// also from the start), then every `window` clean steps. The throw needs the hysteresis spent too:
// at the minimum with cur_hysteresis > 1 an overflow only spends hysteresis. `scale ==
// min_loss_scale` is an exact comparison, as in DeepSpeed: a run whose initial scale lies below the
// minimum is raised to the minimum by its first halving instead of stopping.
// (Older DeepSpeed releases tested (cur_iter - last_overflow_iter) % window == 0 in DynamicLossScaler,
// doubling one clean step earlier, while their ZeRO-0 optimizers already used `stable`; we follow the
// current code and its tests (test_zero_optim_overflow.py: "scale_window + 1" clean steps).
// DeepSpeed's ZeRO-0 FP16_Optimizer never throws at the minimum: continue_at_min_scale = true.)
//
// Caller's side of DeepSpeed's step: a skipped step applies no update, does not advance the
// optimizer's step count nor the lr scheduler (see optim/lr_schedule.h), but counts as a global step.
#pragma once
#include <cstdint>

#include <string>

#include "config/config.h"

namespace zero3d {

class LossScaler {
 public:
  // What a checkpoint must carry for a resumed run to continue the same schedule (DeepSpeed pickles
  // its whole DynamicLossScaler). Meaningful for the dynamic mode only.
  struct State {
    double scale = 1;
    int64_t cur_iter = 0;
    int64_t last_overflow_iter = -1;
    int cur_hysteresis = 1;
  };

  // Throws UserError naming the fp16 key for a value DeepSpeed rejects (loss_scale < 0 or not finite;
  // dynamic: loss_scale_window < 1, hysteresis < 1, min_loss_scale <= 0, 2^initial_scale_power not a
  // positive finite double). Values are not checked when fp16 is disabled.
  explicit LossScaler(const Fp16Config& cfg);

  bool enabled() const { return mode_ != Mode::off; }
  bool dynamic() const { return mode_ == Mode::dynamic; }

  // Multiply the loss (its gradient) by this before backward.
  double scale() const { return state_.scale; }

  // Called once per optimizer step with the overflow flag agreed over all ranks; `step` (the global
  // step being taken) only names the step in the error. Returns true when the step must be skipped
  // (= overflow, whenever fp16 is on). Throws RunError(kExitLossScale) on an overflow at
  // min_loss_scale with the hysteresis spent, unless continue_at_min_scale.
  // Note: DeepSpeed's ZeRO step unscales (and clips) the gradients with scale() *after* this call,
  // which on a growth step is twice the scale the backward used; the backward's scale is the value
  // of scale() before the call. Which one to divide by is the caller's choice.
  bool update(bool overflow, int64_t step);

  State state() const { return state_; }
  // Dynamic mode: continue from a checkpointed state (throws UserError for a state no run can
  // produce). Static and disabled modes: no-op; the scale comes from the config.
  void restore(const State& s);

  // Its checkpoint state, described by the scaler itself (ckpt/ stores the text as it is): JSON
  // {"dynamic", "scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"}.
  std::string save_state() const;
  // Continues from save_state()'s text: a dynamic scaler takes a dynamic one's state (restore);
  // any other pair changes nothing. check_state: the text's form alone, for the load to name the file.
  // Both throw UserError saying what is wrong.
  void load_state(const std::string& text);
  static void check_state(const std::string& text);

 private:
  enum class Mode { off, fixed, dynamic };
  Mode mode_ = Mode::off;
  int window_ = 1000;
  int hysteresis_ = 2;
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 1;
  bool continue_at_min_scale_ = false;
  State state_;
};

}  // namespace zero3d
