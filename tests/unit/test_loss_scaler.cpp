// test_loss_scaler: LossScaler against schedules traced by hand through DeepSpeed's
// deepspeed/runtime/fp16/loss_scaler.py DynamicLossScaler.update_scale (current deepspeedai/DeepSpeed):
//
//   if overflow:
//       if delayed_shift == 1 or cur_hysteresis == 1:
//           if cur_scale == min_scale and raise_error_at_min_scale: raise Exception(...)
//           else: cur_scale = max(cur_scale / 2, min_scale)
//       else: cur_hysteresis -= 1
//       last_overflow_iter = cur_iter
//   else:
//       if consecutive_hysteresis: cur_hysteresis = delayed_shift
//       stable_interval = (cur_iter - last_overflow_iter) - 1
//       if stable_interval > 0 and stable_interval % scale_window == 0:
//           if not consecutive_hysteresis: cur_hysteresis = delayed_shift
//           cur_scale *= 2
//   cur_iter += 1
//
// with cur_iter = 0, last_overflow_iter = -1, cur_hysteresis = delayed_shift (= fp16.hysteresis) at
// construction. Traces below: "it" is cur_iter before the call, "h" cur_hysteresis, "last"
// last_overflow_iter, "st" stable_interval.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/check.h"
#include "zero/loss_scaler.h"

namespace zero3d {
namespace {

Fp16Config dynamic_cfg(int power, int window, int hysteresis, bool consecutive, double min_scale = 1) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 0;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

// One row of a hand trace: the flag passed in, then what update() returns and the state after it.
struct Row {
  bool overflow;
  bool skip;
  double scale;
  int hysteresis;
};
constexpr bool O = true;   // overflow
constexpr bool C = false;  // clean

void run_trace(LossScaler& ls, const std::vector<Row>& rows, int64_t first_step = 1) {
  int64_t step = first_step;
  for (const Row& r : rows) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(ls.update(r.overflow, step), r.skip);
    EXPECT_EQ(ls.scale(), r.scale);
    EXPECT_EQ(ls.state().cur_hysteresis, r.hysteresis);
    ++step;
  }
}

// Shared overflow pattern: O C O O C C C C C O O C C C C C C C C C (20 steps).
// window 4, hysteresis 2, initial 2^4 = 16, min 1.

// consecutive_hysteresis = false: hysteresis is refilled only when the scale grows.
//  step it  flag  trace                                               -> scale h
//   1    0   O    h=2 -> h=1; last=0                                    16   1
//   2    1   C    st=1-0-1=0: no growth (h stays 1)                     16   1
//   3    2   O    h==1, 16 != min -> max(8,1)=8; last=2                  8   1
//   4    3   O    h==1 -> 4; last=3                                      4   1
//   5    4   C    st=0                                                   4   1
//   6    5   C    st=1                                                   4   1
//   7    6   C    st=2                                                   4   1
//   8    7   C    st=3                                                   4   1
//   9    8   C    st=4, 4%4==0: h=2, scale 8                             8   2
//  10    9   O    h=2 -> 1; last=9                                       8   1
//  11   10   O    h==1 -> 4; last=10                                     4   1
//  12-15 11-14 C  st=0..3                                                4   1
//  16   15   C    st=4: h=2, scale 8 (the 5th = window+1-th clean step)  8   2
//  17-19 16-18 C  st=5,6,7                                               8   2
//  20   19   C    st=8, 8%4==0: scale 16                                16   2
TEST(LossScaler, DynamicHysteresisRefilledOnGrowth) {
  LossScaler ls(dynamic_cfg(4, 4, 2, false));
  ASSERT_TRUE(ls.enabled());
  ASSERT_TRUE(ls.dynamic());
  EXPECT_EQ(ls.scale(), 16.0);
  run_trace(ls, {{O, true, 16, 1}, {C, false, 16, 1}, {O, true, 8, 1},   {O, true, 4, 1},   {C, false, 4, 1},
                 {C, false, 4, 1}, {C, false, 4, 1},  {C, false, 4, 1},  {C, false, 8, 2},  {O, true, 8, 1},
                 {O, true, 4, 1},  {C, false, 4, 1},  {C, false, 4, 1},  {C, false, 4, 1},  {C, false, 4, 1},
                 {C, false, 8, 2}, {C, false, 8, 2},  {C, false, 8, 2},  {C, false, 8, 2},  {C, false, 16, 2}});
  const LossScaler::State s = ls.state();
  EXPECT_EQ(s.cur_iter, 20);
  EXPECT_EQ(s.last_overflow_iter, 10);
}

// consecutive_hysteresis = true: every clean step refills hysteresis, so the isolated overflow at
// step 3 is absorbed.
//  step it  flag  trace                                               -> scale h
//   1    0   O    h=2 -> 1; last=0                                      16   1
//   2    1   C    h=2; st=0                                             16   2
//   3    2   O    h=2 -> 1; last=2                                      16   1
//   4    3   O    h==1 -> 8; last=3                                      8   1
//   5    4   C    h=2; st=0                                              8   2
//   6-8  5-7 C    st=1,2,3                                               8   2
//   9    8   C    st=4: scale 16                                        16   2
//  10    9   O    h=2 -> 1; last=9                                      16   1
//  11   10   O    h==1 -> 8; last=10                                     8   1
//  12   11   C    h=2; st=0                                              8   2
//  13-15 12-14 C  st=1,2,3                                               8   2
//  16   15   C    st=4: scale 16                                        16   2
//  17-19 16-18 C  st=5,6,7                                              16   2
//  20   19   C    st=8: scale 32                                        32   2
TEST(LossScaler, DynamicConsecutiveHysteresis) {
  LossScaler ls(dynamic_cfg(4, 4, 2, true));
  run_trace(ls, {{O, true, 16, 1}, {C, false, 16, 2}, {O, true, 16, 1},  {O, true, 8, 1},   {C, false, 8, 2},
                 {C, false, 8, 2}, {C, false, 8, 2},  {C, false, 8, 2},  {C, false, 16, 2}, {O, true, 16, 1},
                 {O, true, 8, 1},  {C, false, 8, 2},  {C, false, 8, 2},  {C, false, 8, 2},  {C, false, 8, 2},
                 {C, false, 16, 2}, {C, false, 16, 2}, {C, false, 16, 2}, {C, false, 16, 2}, {C, false, 32, 2}});
}

// DeepSpeed's own test_zero_optim_overflow.py / test_dynamic_loss_scale.py test_no_overflow:
// window 2, initial 2^8, no overflow. last=-1, so st = it: growth at it = 2, 4, 6, 8, i.e. after
// steps 3, 5, 7, 9 (the first after window + 1 clean steps, then every window).
TEST(LossScaler, GrowthWithoutOverflow) {
  LossScaler ls(dynamic_cfg(8, 2, 2, false));
  const double expected[] = {256, 256, 512, 512, 1024, 1024, 2048, 2048, 4096, 4096};
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(ls.update(false, i + 1));
    EXPECT_EQ(ls.scale(), expected[i]) << "after step " << i + 1;
  }
  EXPECT_EQ(ls.state().cur_iter, 10);
}

// DeepSpeed's test_some_overflow: window 2, hysteresis 1, initial 2^8.
//   it0 O: delayed_shift==1 -> 128, last=0;  it1 O: -> 64, last=1
//   it2 C: st=0;  it3 C: st=1;  it4 C: st=2 -> 128   ("scale_window + 1" clean steps)
//   it5 O: -> 64
TEST(LossScaler, DeepSpeedSomeOverflow) {
  LossScaler ls(dynamic_cfg(8, 2, 1, false));
  run_trace(ls, {{O, true, 128, 1}, {O, true, 64, 1}, {C, false, 64, 1}, {C, false, 64, 1}, {C, false, 128, 1},
                 {O, true, 64, 1}});
}

// DeepSpeed's TestZeroStage0Hysteresis: hysteresis 3, four overflows -> [256, 256, 128, 64]
//   it0 h 3->2;  it1 h 2->1;  it2 h==1 -> 128;  it3 -> 64
// and with hysteresis 2 + consecutive, 4 x (O, C) never lowers the scale (O: h 2->1, C: h=2).
TEST(LossScaler, DeepSpeedHysteresisCases) {
  LossScaler a(dynamic_cfg(8, 1000, 3, false));
  run_trace(a, {{O, true, 256, 2}, {O, true, 256, 1}, {O, true, 128, 1}, {O, true, 64, 1}});

  LossScaler b(dynamic_cfg(8, 1000, 2, true));
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(b.update(true, 2 * i + 1));
    EXPECT_FALSE(b.update(false, 2 * i + 2));
  }
  EXPECT_EQ(b.scale(), 256.0);
}

// Minimum scale. hysteresis 2, initial 2^2 = 4, min 1, window 1000:
//   it0 O: h 2->1, last=0                  -> 4
//   it1 O: h==1, 4 != 1 -> 2, last=1       -> 2
//   it2 O: 2 != 1 -> 1, last=2             -> 1
//   it3 O: h==1 and 1 == min -> raise (DeepSpeed: Exception, nothing updated, cur_iter stays 3)
TEST(LossScaler, ThrowsAtMinimumScale) {
  LossScaler ls(dynamic_cfg(2, 1000, 2, false));
  run_trace(ls, {{O, true, 4, 1}, {O, true, 2, 1}, {O, true, 1, 1}});
  try {
    ls.update(true, 4);
    FAIL() << "expected RunError";
  } catch (const RunError& e) {
    EXPECT_EQ(e.code, kExitLossScale);
    EXPECT_EQ(e.code, 5);
    const std::string what = e.what();
    EXPECT_NE(what.find("step 4"), std::string::npos) << what;
    EXPECT_NE(what.find("fp16.min_loss_scale = 1"), std::string::npos) << what;
    EXPECT_NE(what.find("fp16.continue_at_min_scale=true"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line";
    EXPECT_EQ(what.find("rank"), std::string::npos) << "rank-agnostic: " << what;
  }
  const LossScaler::State s = ls.state();
  EXPECT_EQ(s.scale, 1.0);
  EXPECT_EQ(s.cur_iter, 3);
  EXPECT_EQ(s.last_overflow_iter, 2);
}

// The throw needs the hysteresis spent: initial 2^0 = 1 = min, hysteresis 2.
//   it0 O: h 2->1 (no check of the scale in this branch)  -> no throw, skip
//   it1 O: h==1 and 1 == min                              -> throw
// With consecutive hysteresis, alternating O, C at the minimum never throws (h: 2->1, refilled).
TEST(LossScaler, AtMinimumHysteresisStillAbsorbs) {
  LossScaler ls(dynamic_cfg(0, 1000, 2, false));
  EXPECT_TRUE(ls.update(true, 1));
  EXPECT_EQ(ls.scale(), 1.0);
  EXPECT_THROW(ls.update(true, 2), RunError);

  LossScaler alt(dynamic_cfg(0, 1000, 2, true));
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(alt.update(true, 2 * i + 1));
    EXPECT_FALSE(alt.update(false, 2 * i + 2));
  }
  EXPECT_EQ(alt.scale(), 1.0);
}

// A minimum that halving does not hit: initial 16, min 3, hysteresis 1.
//   16 -> 8 -> 4 -> max(2, 3) = 3 -> 3 == min: throw
TEST(LossScaler, MinimumNotAPowerOfTwo) {
  LossScaler ls(dynamic_cfg(4, 1000, 1, false, 3));
  run_trace(ls, {{O, true, 8, 1}, {O, true, 4, 1}, {O, true, 3, 1}});
  EXPECT_THROW(ls.update(true, 4), RunError);
}

// DeepSpeed compares `cur_scale == min_scale` exactly: an initial scale below the minimum
// (2^0 = 1 < min 2, hysteresis 1) is not "at the minimum"; the overflow sets max(0.5, 2) = 2.
TEST(LossScaler, InitialScaleBelowMinimumIsRaisedByFirstOverflow) {
  LossScaler ls(dynamic_cfg(0, 1000, 1, false, 2));
  EXPECT_TRUE(ls.update(true, 1));
  EXPECT_EQ(ls.scale(), 2.0);
  EXPECT_THROW(ls.update(true, 2), RunError);
}

// continue_at_min_scale (DeepSpeed's raise_error_at_min_scale = False): same trace as
// ThrowsAtMinimumScale, then
//   it3 O: max(1/2, 1) = 1, last=3                       -> skip, 1
//   it4 O: -> 1, last=4                                  -> skip, 1
//   it5..7 C: st=0,1,2 (window 3), it8 C: st=3 -> 2     (growth still works from the minimum)
TEST(LossScaler, ContinueAtMinimumScale) {
  Fp16Config c = dynamic_cfg(2, 3, 2, false);
  c.continue_at_min_scale = true;
  LossScaler ls(c);
  run_trace(ls, {{O, true, 4, 1}, {O, true, 2, 1}, {O, true, 1, 1}, {O, true, 1, 1}, {O, true, 1, 1},
                 {C, false, 1, 1}, {C, false, 1, 1}, {C, false, 1, 1}, {C, false, 2, 2}});
  EXPECT_EQ(ls.state().last_overflow_iter, 4);
}

// Static scale (fp16.loss_scale > 0): DeepSpeed's LossScaler.update_scale does nothing, but the
// ZeRO step still checks overflow for fp16 (check_grad_overflow = True) and skips. Never throws.
TEST(LossScaler, StaticScaleSkipsButNeverChanges) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 128;
  c.min_loss_scale = 128;  // irrelevant for a static scale
  LossScaler ls(c);
  EXPECT_TRUE(ls.enabled());
  EXPECT_FALSE(ls.dynamic());
  EXPECT_EQ(ls.scale(), 128.0);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(ls.update(true, i + 1));
  for (int i = 0; i < 3000; ++i) EXPECT_FALSE(ls.update(false, 51 + i));
  EXPECT_EQ(ls.scale(), 128.0);
  ls.restore(LossScaler::State{4096, 10, 5, 1});  // no-op: the config's scale stands
  EXPECT_EQ(ls.scale(), 128.0);
}

// fp32 / bf16: no scaling, never skips (the overflow flag is ignored).
TEST(LossScaler, DisabledIsIdentity) {
  Fp16Config c;  // enabled = false
  c.loss_scale = -5;  // not validated when fp16 is off
  LossScaler ls(c);
  EXPECT_FALSE(ls.enabled());
  EXPECT_FALSE(ls.dynamic());
  EXPECT_EQ(ls.scale(), 1.0);
  EXPECT_FALSE(ls.update(true, 1));
  EXPECT_FALSE(ls.update(false, 2));
  EXPECT_EQ(ls.scale(), 1.0);
}

// A resumed run continues the same schedule: run A for 11 steps of the first trace, carry its state
// into a fresh B, then feed both the remaining 9 flags: identical results, matching the trace.
// And DeepSpeed's test_hysteresis_survives_a_checkpoint: hysteresis 3, one overflow, restore ->
// cur_hysteresis 2, so the next overflow is still absorbed and the one after halves.
TEST(LossScaler, StateRestoreRoundTrip) {
  const Fp16Config c = dynamic_cfg(4, 4, 2, false);
  const bool head[] = {O, C, O, O, C, C, C, C, C, O, O};
  LossScaler a(c);
  for (int i = 0; i < 11; ++i) a.update(head[i], i + 1);
  const LossScaler::State s = a.state();
  EXPECT_EQ(s.scale, 4.0);
  EXPECT_EQ(s.cur_iter, 11);
  EXPECT_EQ(s.last_overflow_iter, 10);
  EXPECT_EQ(s.cur_hysteresis, 1);

  LossScaler b(c);
  b.restore(s);
  const std::vector<Row> tail = {{C, false, 4, 1}, {C, false, 4, 1}, {C, false, 4, 1}, {C, false, 4, 1},
                                 {C, false, 8, 2}, {C, false, 8, 2}, {C, false, 8, 2}, {C, false, 8, 2},
                                 {C, false, 16, 2}};
  run_trace(a, tail, 12);
  run_trace(b, tail, 12);
  EXPECT_EQ(b.state().cur_iter, a.state().cur_iter);
  EXPECT_EQ(b.state().last_overflow_iter, a.state().last_overflow_iter);

  LossScaler h(dynamic_cfg(8, 100, 3, false));
  h.update(true, 1);
  LossScaler h2(dynamic_cfg(8, 100, 3, false));
  h2.restore(h.state());
  EXPECT_EQ(h2.state().cur_hysteresis, 2);
  run_trace(h2, {{O, true, 256, 1}, {O, true, 128, 1}}, 2);

  EXPECT_THROW(b.restore(LossScaler::State{0.0, 3, 1, 1}), UserError);   // scale 0
  EXPECT_THROW(b.restore(LossScaler::State{8.0, 3, 3, 1}), UserError);   // overflow at the current iter
  EXPECT_THROW(b.restore(LossScaler::State{8.0, 3, 1, 0}), UserError);   // hysteresis below 1
}

TEST(LossScaler, RejectsInvalidConfig) {
  auto make = [](Fp16Config c) { LossScaler ls(c); };
  Fp16Config c = dynamic_cfg(16, 1000, 2, false);
  c.loss_scale_window = 0;
  EXPECT_THROW(make(c), UserError);
  c = dynamic_cfg(16, 1000, 0, false);
  EXPECT_THROW(make(c), UserError);
  c = dynamic_cfg(16, 1000, 2, false, 0);
  EXPECT_THROW(make(c), UserError);
  c = dynamic_cfg(2000, 1000, 2, false);  // 2^2000 is not a finite double
  EXPECT_THROW(make(c), UserError);
  c = dynamic_cfg(16, 1000, 2, false);
  c.loss_scale = -1;
  EXPECT_THROW(make(c), UserError);
  try {
    c.loss_scale_window = 1000;
    c.loss_scale = 0;
    c.hysteresis = 0;
    make(c);
    ADD_FAILURE() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("fp16.hysteresis"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero3d
