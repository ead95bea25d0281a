// test_optim: DeepSpeed's LR schedules against values worked out by hand from
// deepspeed/runtime/lr_schedules.py, the clipping coefficient of deepspeed/runtime/utils.py, and
// AdamW on the host backend against a plain double-precision FusedAdam written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "kernels/backend.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "zero/grad_finish.h"

namespace zero3d {
namespace {

// ------------------------------------------------------------------------------------------------
// LR schedules. Shared setting: warmup_min_lr 1e-4, warmup_max_lr 1e-3 (delta 9e-4),
// warmup_num_steps W = 10, total_num_steps T = 30; WarmupCosineLR: base lr 2e-3,
// warmup_min_ratio 0.1, cos_min_ratio 0.01.

SchedulerConfig sched(const std::string& type, const std::string& warmup_type) {
  SchedulerConfig s;
  s.type = type == "WarmupLR"        ? SchedulerType::WarmupLR
           : type == "WarmupDecayLR" ? SchedulerType::WarmupDecayLR
                                     : SchedulerType::WarmupCosineLR;
  s.warmup_type = warmup_type == "log" ? WarmupType::log : WarmupType::linear;
  s.warmup_min_lr = 1e-4;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 10;
  s.total_num_steps = 30;
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  return s;
}

void expect_lr(double got, double want, int64_t it) {
  EXPECT_NEAR(got, want, 1e-12 * std::abs(want) + 1e-18) << "at iteration " << it;
}

TEST(LrSchedule, NoSchedulerIsConstantBaseLr) {
  SchedulerConfig s;  // type ""
  for (int64_t it : {-1, 0, 1, 10, 100000}) expect_lr(lr_at(s, 6e-4, it), 6e-4, it);
}

TEST(LrSchedule, WarmupLRLog) {
  // gamma = ln(it + 1) / ln(10) for it < 10, then 1; lr = 1e-4 + 9e-4 * gamma
  const SchedulerConfig s = sched("WarmupLR", "log");
  expect_lr(lr_at(s, 5.0, -1), 1e-4, -1);                   // before the first scheduler step: min
  expect_lr(lr_at(s, 5.0, 0), 1e-4, 0);                     // ln 1 = 0
  expect_lr(lr_at(s, 5.0, 1), 3.7092699609758304e-4, 1);    // 1e-4 + 9e-4 * 0.30102999566
  expect_lr(lr_at(s, 5.0, 4), 7.290730039024168e-4, 4);     // 1e-4 + 9e-4 * 0.69897000434
  expect_lr(lr_at(s, 5.0, 9), 1e-3, 9);                     // ln 10 / ln 10 = 1: warmup end
  expect_lr(lr_at(s, 5.0, 10), 1e-3, 10);
  expect_lr(lr_at(s, 5.0, 1000000), 1e-3, 1000000);         // WarmupLR never decays
}

TEST(LrSchedule, WarmupLRLinear) {
  // gamma = it / 10 for it < 10, then 1
  const SchedulerConfig s = sched("WarmupLR", "linear");
  expect_lr(lr_at(s, 5.0, 0), 1e-4, 0);
  expect_lr(lr_at(s, 5.0, 1), 1.9e-4, 1);   // 1e-4 + 9e-4 * 0.1
  expect_lr(lr_at(s, 5.0, 5), 5.5e-4, 5);   // 1e-4 + 9e-4 * 0.5
  expect_lr(lr_at(s, 5.0, 9), 9.1e-4, 9);   // 1e-4 + 9e-4 * 0.9: linear warmup never reaches max...
  expect_lr(lr_at(s, 5.0, 10), 1e-3, 10);   // ...it jumps there at it = W
  expect_lr(lr_at(s, 5.0, 500), 1e-3, 500);
}

TEST(LrSchedule, WarmupDecayLR) {
  // after warmup: gamma = max(0, (30 - it) / max(1, 30 - 10))
  for (const char* wt : {"log", "linear"}) {
    SCOPED_TRACE(wt);
    const SchedulerConfig s = sched("WarmupDecayLR", wt);
    expect_lr(lr_at(s, 5.0, -1), 1e-4, -1);
    expect_lr(lr_at(s, 5.0, 0), 1e-4, 0);
    expect_lr(lr_at(s, 5.0, 1), std::string(wt) == "log" ? 3.7092699609758304e-4 : 1.9e-4, 1);
    expect_lr(lr_at(s, 5.0, 9), std::string(wt) == "log" ? 1e-3 : 9.1e-4, 9);
    expect_lr(lr_at(s, 5.0, 10), 1e-3, 10);      // (30-10)/20 = 1
    expect_lr(lr_at(s, 5.0, 20), 5.5e-4, 20);    // (30-20)/20 = 0.5
    expect_lr(lr_at(s, 5.0, 25), 3.25e-4, 25);   // 0.25
    expect_lr(lr_at(s, 5.0, 30), 1e-4, 30);      // 0: decays to warmup_min_lr, not to 0
    expect_lr(lr_at(s, 5.0, 40), 1e-4, 40);      // max(0, -0.5) = 0
  }
}

TEST(LrSchedule, WarmupDecayLRTotalShorterThanWarmup) {
  // T = 5 < W = 10: after warmup gamma = max(0, (5 - it) / max(1, -5)) = 0
  SchedulerConfig s = sched("WarmupDecayLR", "linear");
  s.total_num_steps = 5;
  expect_lr(lr_at(s, 5.0, 5), 5.5e-4, 5);  // still warming up
  expect_lr(lr_at(s, 5.0, 10), 1e-4, 10);
}

TEST(LrSchedule, WarmupCosineLRLog) {
  // warmup: ratio = 0.1 + 0.9 * ln(it+1)/ln(10); cosine: progress = min(1, (it - 9) / 20),
  // ratio = 0.01 + 0.99 * (1 + cos(pi * progress)) / 2; lr = 2e-3 * ratio
  const SchedulerConfig s = sched("WarmupCosineLR", "log");
  const double base = 2e-3;
  expect_lr(lr_at(s, base, -1), 0.0, -1);                       // ratio 0 before the first step
  expect_lr(lr_at(s, base, 0), 2e-4, 0);                        // warmup_min_ratio
  expect_lr(lr_at(s, base, 1), 7.418539921951661e-4, 1);        // 0.1 + 0.9 * 0.30103 = 0.370927
  expect_lr(lr_at(s, base, 4), 1.4581460078048338e-3, 4);       // 0.1 + 0.9 * 0.69897
  expect_lr(lr_at(s, base, 9), 2e-3, 9);                        // warmup end: ratio 1
  expect_lr(lr_at(s, base, 10), 1.9878114571891866e-3, 10);     // progress 0.05: 0.01 + 0.99 * 0.9938442
  expect_lr(lr_at(s, base, 19), 1.01e-3, 19);                   // progress 0.5: 0.01 + 0.99 * 0.5
  expect_lr(lr_at(s, base, 20), 8.551298796101713e-4, 20);      // progress 0.55
  expect_lr(lr_at(s, base, 29), 2e-5, 29);                      // progress 1: cos_min_ratio
  expect_lr(lr_at(s, base, 30), 2e-5, 30);                      // clamped past the end
  expect_lr(lr_at(s, base, 40), 2e-5, 40);                      // (unclamped DeepSpeed: 1.16e-3)
}

TEST(LrSchedule, WarmupCosineLRLinear) {
  const SchedulerConfig s = sched("WarmupCosineLR", "linear");
  const double base = 2e-3;
  expect_lr(lr_at(s, base, 0), 2e-4, 0);
  expect_lr(lr_at(s, base, 1), 3.8e-4, 1);     // 0.1 + 0.9 * 0.1 = 0.19
  expect_lr(lr_at(s, base, 5), 1.1e-3, 5);     // 0.1 + 0.9 * 0.5 = 0.55
  expect_lr(lr_at(s, base, 9), 1.82e-3, 9);    // 0.1 + 0.9 * 0.9 = 0.91
  expect_lr(lr_at(s, base, 10), 1.9878114571891866e-3, 10);
  expect_lr(lr_at(s, base, 19), 1.01e-3, 19);
  expect_lr(lr_at(s, base, 29), 2e-5, 29);
  expect_lr(lr_at(s, base, 100), 2e-5, 100);
}

TEST(LrSchedule, WarmupNumStepsRaisedToTwo) {
  // DeepSpeed: warmup_num_steps = max(2, warmup_num_steps)
  SchedulerConfig s = sched("WarmupLR", "linear");
  s.warmup_num_steps = 1;
  expect_lr(lr_at(s, 5.0, 0), 1e-4, 0);
  expect_lr(lr_at(s, 5.0, 1), 5.5e-4, 1);  // 1 / 2
  expect_lr(lr_at(s, 5.0, 2), 1e-3, 2);
  s.warmup_type = WarmupType::log;
  expect_lr(lr_at(s, 5.0, 1), 1e-3, 1);    // ln 2 / ln 2
}

TEST(LrSchedule, LrForStepLagsTwoIterations) {
  // engine: optimizer.step() then scheduler.step(); the constructor wrote get_lr() at it = -1
  const SchedulerConfig warm = sched("WarmupLR", "linear");
  expect_lr(lr_for_step(warm, 5.0, 1), 1e-4, 1);      // it = -1: warmup_min_lr
  expect_lr(lr_for_step(warm, 5.0, 2), 1e-4, 2);      // it = 0
  expect_lr(lr_for_step(warm, 5.0, 3), 1.9e-4, 3);    // it = 1
  expect_lr(lr_for_step(warm, 5.0, 12), 1e-3, 12);    // it = 10
  const SchedulerConfig cosine = sched("WarmupCosineLR", "linear");
  expect_lr(lr_for_step(cosine, 2e-3, 1), 0.0, 1);    // first step runs with lr 0
  expect_lr(lr_for_step(cosine, 2e-3, 2), 2e-4, 2);
  SchedulerConfig none;
  expect_lr(lr_for_step(none, 7e-4, 1), 7e-4, 1);
}

TEST(ClipCoefficient, Cases) {
  EXPECT_EQ(clip_coefficient(0.0, 100.0), 1.0);   // clipping off
  EXPECT_EQ(clip_coefficient(-1.0, 100.0), 1.0);  // off (DeepSpeed: gradient_clipping > 0)
  EXPECT_EQ(clip_coefficient(1.0, 0.5), 1.0);     // below the threshold
  EXPECT_EQ(clip_coefficient(1.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(1.0, 4.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 3.0), 0.5 / (3.0 + 1e-6));
  // norm == max_norm still clips, by max / (max + 1e-6)
  EXPECT_DOUBLE_EQ(clip_coefficient(2.0, 2.0), 2.0 / (2.0 + 1e-6));
  EXPECT_LT(clip_coefficient(2.0, 2.0), 1.0);
  EXPECT_EQ(clip_coefficient(1.0, std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(clip_coefficient(1.0, std::numeric_limits<double>::quiet_NaN()), 1.0);
}

// ------------------------------------------------------------------------------------------------
// AdamW vs a double-precision FusedAdam (multi_tensor_adam.cu AdamFunctor), written out here:
//   L2 mode:   g += wd * p
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   denom = sqrt(v / bc2) + eps;  update = (m / bc1) / denom  (+ wd * p in AdamW mode)
//   p -= lr * update
// with bc1 = 1 - b1^t, bc2 = 1 - b2^t, or 1 without bias correction.

struct Reference {
  std::vector<double> p, m, v;
  int t = 0;

  void step(const std::vector<double>& g, double lr, const std::vector<double>& wd, const OptimizerConfig& c,
            bool decoupled) {
    ++t;
    const double b1 = c.betas[0], b2 = c.betas[1];
    const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
    const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i];
      if (!decoupled) gi += wd[i] * p[i];
      m[i] = b1 * m[i] + (1.0 - b1) * gi;
      v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
      double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps);
      if (decoupled) update += wd[i] * p[i];
      p[i] -= lr * update;
    }
  }
};

constexpr size_t kN = 37;
const std::vector<double> kLrs = {0.01, 0.02, 0.005};  // one per step: lr passes straight through

// Four segments, listed out of order: [0,10) decay, [10,13) no, [13,30) decay, [30,37) no.
std::vector<DecaySegment> mixed_segments() {
  return {{13, 17, true}, {0, 10, true}, {30, 7, false}, {10, 3, false}};
}

struct AdamRun {
  std::vector<float> p0, p, m, v;
  std::vector<double> ref_p0, ref_p, ref_m, ref_v;
  int64_t steps = 0;
};

std::vector<float> to_host(Backend& be, const float* d, size_t n) {
  std::vector<float> h(n);
  be.copy_to_host(h.data(), d, n * sizeof(float));
  return h;
}

// Three steps of AdamW on the host backend and of the reference, from the same seeded data.
AdamRun run_three_steps(const OptimizerConfig& cfg, const std::vector<DecaySegment>& segs, bool ref_decoupled) {
  std::unique_ptr<Backend> be = make_host_backend();
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

  std::vector<float> p(kN);
  for (float& x : p) x = uni(rng);
  std::vector<double> wd(kN, 0.0);
  for (const DecaySegment& s : segs)
    for (size_t i = s.offset; i < s.offset + s.size; ++i) wd[i] = s.decay ? cfg.weight_decay : 0.0;

  AdamRun r;
  r.p0 = p;
  Reference ref;
  ref.p.assign(p.begin(), p.end());
  ref.m.assign(kN, 0.0);
  ref.v.assign(kN, 0.0);
  r.ref_p0 = ref.p;

  DeviceBuffer<float> dp(*be, kN), dg(*be, kN);
  be->copy_from_host(dp.data(), p.data(), kN * sizeof(float));
  AdamW opt(*be, cfg, kN);
  EXPECT_EQ(opt.size(), kN);
  EXPECT_EQ(to_host(*be, opt.exp_avg(), kN), std::vector<float>(kN, 0.0f));  // moments start at 0
  EXPECT_EQ(to_host(*be, opt.exp_avg_sq(), kN), std::vector<float>(kN, 0.0f));

  for (double lr : kLrs) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) g[i] = uni(rng) * (i % 5 == 0 ? 10.0f : 1.0f);  // mixed scales
    be->copy_from_host(dg.data(), g.data(), kN * sizeof(float));
    opt.step(dp.data(), dg.data(), lr, segs);
    ref.step(std::vector<double>(g.begin(), g.end()), lr, wd, cfg, ref_decoupled);
  }
  be->synchronize();
  r.p = to_host(*be, dp.data(), kN);
  r.m = to_host(*be, opt.exp_avg(), kN);
  r.v = to_host(*be, opt.exp_avg_sq(), kN);
  r.ref_p = ref.p;
  r.ref_m = ref.m;
  r.ref_v = ref.v;
  r.steps = opt.step_count();
  return r;
}

// |got - want| <= rel * max(|want|, floor): relative, with a floor for values near zero.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, double floor,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]), rel * std::max(std::abs(want[i]), floor))
        << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

void expect_matches_reference(const AdamRun& r) {
  EXPECT_EQ(r.steps, 3);
  expect_close(r.p, r.ref_p, 1e-6, 1e-2, "param");
  // the displacement p - p0 (~1e-2) checks the update itself, not just the large parameter
  std::vector<float> dp(kN);
  std::vector<double> ref_dp(kN);
  for (size_t i = 0; i < kN; ++i) {
    dp[i] = r.p[i] - r.p0[i];
    ref_dp[i] = r.ref_p[i] - r.ref_p0[i];
  }
  expect_close(dp, ref_dp, 1e-4, 1e-2, "param update");
  expect_close(r.m, r.ref_m, 1e-6, 1.0, "exp_avg");
  expect_close(r.v, r.ref_v, 1e-6, 1e-2, "exp_avg_sq");
}

OptimizerConfig adamw_config() {
  OptimizerConfig c;
  c.type = OptimizerType::AdamW;
  c.betas = {0.9, 0.95};
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  return c;
}

TEST(AdamW, AllDecayMatchesReference) {
  expect_matches_reference(run_three_steps(adamw_config(), {{0, kN, true}}, /*decoupled=*/true));
}

TEST(AdamW, MixedDecaySegmentsMatchReference) {
  expect_matches_reference(run_three_steps(adamw_config(), mixed_segments(), true));
}

TEST(AdamW, DecaySegmentsChangeOnlyDecayedParameters) {
  // The segments must matter: with no decay anywhere, decayed entries move, others do not.
  const AdamRun mixed = run_three_steps(adamw_config(), mixed_segments(), true);
  const AdamRun none = run_three_steps(adamw_config(), {{0, kN, false}}, true);
  for (size_t i = 0; i < kN; ++i) {
    const bool decayed = i < 10 || (i >= 13 && i < 30);
    if (decayed)
      EXPECT_GT(std::abs(mixed.p[i] - none.p[i]), 1e-5 * std::abs(mixed.p0[i])) << i;
    else
      EXPECT_EQ(mixed.p[i], none.p[i]) << i;
  }
}

TEST(AdamW, NoBiasCorrectionMatchesReference) {
  OptimizerConfig c = adamw_config();
  c.bias_correction = false;
  expect_matches_reference(run_three_steps(c, mixed_segments(), true));
}

TEST(AdamW, AdamWithoutAdamWModeIsL2) {
  OptimizerConfig c = adamw_config();
  c.type = OptimizerType::Adam;
  c.adam_w_mode = false;
  expect_matches_reference(run_three_steps(c, mixed_segments(), /*decoupled=*/false));
}

TEST(AdamW, AdamWithAdamWModeIsDecoupled) {
  OptimizerConfig c = adamw_config();
  c.type = OptimizerType::Adam;
  c.adam_w_mode = true;
  expect_matches_reference(run_three_steps(c, mixed_segments(), true));
}

TEST(AdamW, AdamWTypeIgnoresAdamWModeFalse) {
  // DeepSpeed: effective_adam_w_mode = (name == "AdamW") or adam_w_mode
  OptimizerConfig c = adamw_config();
  c.adam_w_mode = false;
  expect_matches_reference(run_three_steps(c, mixed_segments(), true));
}

TEST(AdamW, ResumeFromMomentsAndStepCount) {
  // A checkpoint is (params, exp_avg, exp_avg_sq, step count): restoring them reproduces step 3.
  std::unique_ptr<Backend> be = make_host_backend();
  const OptimizerConfig cfg = adamw_config();
  const std::vector<DecaySegment> segs = mixed_segments();
  std::vector<float> p(kN), g(kN);
  for (size_t i = 0; i < kN; ++i) p[i] = 0.1f * static_cast<float>(i) - 1.0f;
  DeviceBuffer<float> pa(*be, kN), pb(*be, kN), dg(*be, kN);
  be->copy_from_host(pa.data(), p.data(), kN * sizeof(float));
  AdamW a(*be, cfg, kN);
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < kN; ++i) g[i] = std::sin(0.3f * static_cast<float>(i + 7 * s));
    be->copy_from_host(dg.data(), g.data(), kN * sizeof(float));
    a.step(pa.data(), dg.data(), 0.01, segs);
  }
  AdamW b(*be, cfg, kN);
  be->copy(pb.data(), pa.data(), kN * sizeof(float));
  be->copy(b.exp_avg(), a.exp_avg(), kN * sizeof(float));
  be->copy(b.exp_avg_sq(), a.exp_avg_sq(), kN * sizeof(float));
  b.set_step_count(a.step_count());
  for (size_t i = 0; i < kN; ++i) g[i] = std::cos(0.2f * static_cast<float>(i));
  be->copy_from_host(dg.data(), g.data(), kN * sizeof(float));
  a.step(pa.data(), dg.data(), 0.01, segs);
  b.step(pb.data(), dg.data(), 0.01, segs);
  EXPECT_EQ(a.step_count(), 3);
  EXPECT_EQ(b.step_count(), 3);
  EXPECT_EQ(to_host(*be, pa.data(), kN), to_host(*be, pb.data(), kN));
}

}  // namespace
}  // namespace zero3d
