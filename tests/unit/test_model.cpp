// GPT forward/backward: the analytic gradient of the whole model against central finite
// differences, per tensor and along random directions through all parameters at once.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/gpt.h"

using namespace zero3d;

namespace {

ModelConfig tiny() {
  ModelConfig m;
  m.vocab_size = 32;
  m.seq_len = 8;
  m.n_layer = 2;
  m.n_head = 2;
  m.d_model = 16;
  return m;
}

struct Fixture {
  explicit Fixture(int attention_block = 3) : model(*be, cfg, B, attention_block) { init(); }
  std::unique_ptr<Backend> be = make_host_backend();
  ModelConfig cfg = tiny();
  int B = 3;
  GPT model;
  std::vector<int32_t> in, tg;
  void init() {
    std::mt19937 rng(7);
    for (int i = 0; i < B * cfg.seq_len; ++i) {
      in.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
      tg.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
    }
    model.init_weights(42);
    // Larger-than-GPT-2 weights and non-trivial LayerNorm/bias values so every path carries signal.
    std::vector<float> p(model.num_params());
    be->copy_to_host(p.data(), model.params(), p.size() * 4);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (auto& v : p) v += nd(rng);
    be->copy_from_host(model.params(), p.data(), p.size() * 4);
  }
  double loss() { return model.forward(in.data(), tg.data(), 0.0f); }
  std::vector<float> grad() {
    model.zero_grad();
    model.forward(in.data(), tg.data(), 1.0f / (B * cfg.seq_len));
    model.backward();
    std::vector<float> g(model.num_params());
    be->copy_to_host(g.data(), model.grads(), g.size() * 4);
    return g;
  }
  void set(size_t i, float v) { be->copy_from_host(model.params() + i, &v, 4); }
  float get(size_t i) {
    float v;
    be->copy_to_host(&v, model.params() + i, 4);
    return v;
  }
};

}  // namespace

TEST(Model, ParamTableCoversFlatBuffer) {
  ModelConfig m = tiny();
  auto t = gpt_param_table(m);
  size_t next = 0;
  for (const auto& p : t) {
    EXPECT_EQ(p.offset, next) << p.name;
    next += p.size;
  }
  const size_t C = 16, V = 32, T = 8, L = 2;
  EXPECT_EQ(next, V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C);
}

TEST(Model, InitialLossIsNearLogVocab) {
  auto be = make_host_backend();
  ModelConfig m = tiny();
  GPT model(*be, m, 2);
  model.init_weights(1);
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) in[i] = i % 32, tg[i] = (i * 7) % 32;
  EXPECT_NEAR(model.forward(in.data(), tg.data(), 0.0f), std::log(32.0), 0.1);
}

TEST(Model, GradientMatchesFiniteDifferencesPerTensor) {
  Fixture f;
  std::vector<float> g = f.grad();
  const double h = 1e-2;
  std::mt19937 rng(3);
  for (const auto& p : f.model.params_table()) {
    for (int trial = 0; trial < 3; ++trial) {
      size_t i = p.offset + rng() % p.size;
      // wpe rows beyond seq_len do not exist; every row < T is used, so all are testable.
      float orig = f.get(i);
      f.set(i, orig + static_cast<float>(h));
      double lp = f.loss();
      f.set(i, orig - static_cast<float>(h));
      double lm = f.loss();
      f.set(i, orig);
      double fd = (lp - lm) / (2 * h);
      // float forward: loss noise ~1e-7 / 2h ~ 1e-5, truncation O(h^2); tolerance covers both.
      EXPECT_NEAR(g[i], fd, 2e-3 * std::max(1.0, std::fabs(fd)) + 5e-5) << p.name << "[" << i - p.offset << "]";
    }
  }
}

TEST(Model, GradientMatchesFiniteDifferencesAlongRandomDirections) {
  Fixture f;
  std::vector<float> g = f.grad();
  std::vector<float> p0(f.model.num_params());
  f.be->copy_to_host(p0.data(), f.model.params(), p0.size() * 4);
  std::mt19937 rng(11);
  std::normal_distribution<double> nd;
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<double> d(p0.size());
    double norm = 0;
    for (auto& v : d) v = nd(rng), norm += v * v;
    norm = std::sqrt(norm);
    double analytic = 0;
    for (size_t i = 0; i < d.size(); ++i) d[i] /= norm, analytic += d[i] * g[i];
    const double h = 1e-2;
    auto at = [&](double s) {
      std::vector<float> p(p0);
      for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(p0[i] + s * d[i]);
      f.be->copy_from_host(f.model.params(), p.data(), p.size() * 4);
      return f.loss();
    };
    double fd = (at(h) - at(-h)) / (2 * h);
    EXPECT_NEAR(analytic, fd, 2e-3 * std::fabs(fd) + 1e-4) << "direction " << trial;
  }
}

TEST(Model, BackwardAccumulatesAcrossMicroBatches) {
  Fixture f;
  std::vector<float> g1 = f.grad();
  f.model.forward(f.in.data(), f.tg.data(), 1.0f / (f.B * f.cfg.seq_len));
  f.model.backward();  // without zero_grad: doubles the gradient
  std::vector<float> g2(g1.size());
  f.be->copy_to_host(g2.data(), f.model.grads(), g2.size() * 4);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g2[i], 2 * g1[i], 1e-6 + 1e-5 * std::fabs(g1[i])) << i;
}

TEST(Model, SameSeedSameWeightsBitwise) {
  auto be = make_host_backend();
  ModelConfig m = tiny();
  GPT a(*be, m, 1), b(*be, m, 2);
  a.init_weights(5);
  b.init_weights(5);
  std::vector<float> pa(a.num_params()), pb(b.num_params());
  be->copy_to_host(pa.data(), a.params(), pa.size() * 4);
  be->copy_to_host(pb.data(), b.params(), pb.size() * 4);
  EXPECT_EQ(pa, pb);
}

// Causal blocks of 3 rows (partial last block at T = 8) against one block of all 8 rows.
TEST(Model, AttentionBlockingDoesNotChangeResults) {
  Fixture blocked(3), whole(8);
  EXPECT_NEAR(blocked.loss(), whole.loss(), 1e-6);
  std::vector<float> gb = blocked.grad(), gw = whole.grad();
  for (size_t i = 0; i < gb.size(); ++i) ASSERT_NEAR(gb[i], gw[i], 1e-5 + 1e-4 * std::fabs(gw[i])) << i;
}
