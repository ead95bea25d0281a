// GPT forward/backward: the analytic gradient of the whole model against central finite
// differences, per tensor and along random directions through all parameters at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "model/gpt.h"
#include "model/init_weights.h"
#include "model/param_store.h"

using namespace zero3d;

namespace {

// A GPT-2 of this shape, the other keys at their defaults. Set member by member: GCC 12 takes the
// aggregate initialization ModelConfig{vocab, seq, ...} for one that leaves rope_scaling's string
// uninitialized (a false -Wmaybe-uninitialized in a Release build).
ModelConfig gpt2_shape(int vocab, int seq_len, int n_layer, int n_head, int d_model) {
  ModelConfig m;
  m.vocab_size = vocab;
  m.seq_len = seq_len;
  m.n_layer = n_layer;
  m.n_head = n_head;
  m.d_model = d_model;
  return m;
}

ModelConfig tiny() { return gpt2_shape(32, 8, 2, 2, 16); }

// A model over a flat store; dp and bucket size only change the padded layout, never the math.
struct Fixture {
  explicit Fixture(int dp = 1, size_t bucket = size_t(1) << 30, bool recompute = false)
      : store(*be, make_flat_layout(gpt_param_table(cfg), dp, bucket)), model(*be, cfg, B, store, GPTOptions{recompute}) {
    init();
  }
  Fixture(GPTOptions options, int batch)
      : B(batch), store(*be, make_flat_layout(gpt_param_table(cfg), 1, size_t(1) << 30)),
        model(*be, cfg, B, store, options) {
    init();
  }
  std::unique_ptr<Backend> be = make_host_backend();
  ModelConfig cfg = tiny();
  int B = 3;
  FlatParamStore store;
  GPT model;
  size_t n() const { return store.size(); }
  std::vector<int32_t> in, tg;
  void init() {
    std::mt19937 rng(7);
    for (int i = 0; i < B * cfg.seq_len; ++i) {
      in.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
      tg.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
    }
    std::vector<float> p(n());
    gpt_initial_params(store.layout(), cfg.n_layer, 42, 0, n(), p.data());
    // Larger-than-GPT-2 weights and non-trivial LayerNorm/bias values so every path carries
    // signal; padding stays zero. The perturbation is drawn per logical element, so every layout
    // gets the same model.
    std::normal_distribution<float> nd(0.0f, 0.3f);
    for (const auto& t : store.layout().tensors)
      for (size_t k = 0; k < t.size; ++k) p[t.offset + k] += nd(rng);
    be->copy_from_host(store.params(), p.data(), p.size() * 4);
  }
  // The gradient in logical order (padding dropped), so layouts can be compared.
  std::vector<float> logical(const std::vector<float>& flat) const {
    std::vector<float> out;
    for (const auto& t : store.layout().tensors) out.insert(out.end(), flat.begin() + t.offset, flat.begin() + t.offset + t.size);
    return out;
  }
  double loss() { return model.forward(in.data(), tg.data(), 0.0f); }
  std::vector<float> grad() {
    be->zero(store.grads(), n() * 4);
    model.forward(in.data(), tg.data(), 1.0f / (B * cfg.seq_len));
    model.backward();
    std::vector<float> g(n());
    be->copy_to_host(g.data(), store.grads(), g.size() * 4);
    return g;
  }
  void set(size_t i, float v) { be->copy_from_host(store.params() + i, &v, 4); }
  float get(size_t i) {
    float v;
    be->copy_to_host(&v, store.params() + i, 4);
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
  FlatParamStore store(*be, make_flat_layout(gpt_param_table(m), 1, 1 << 20));
  std::vector<float> p(store.size());
  gpt_initial_params(store.layout(), m.n_layer, 1, 0, p.size(), p.data());
  be->copy_from_host(store.params(), p.data(), p.size() * 4);
  GPT model(*be, m, 2, store);
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; ++i) in[i] = i % 32, tg[i] = (i * 7) % 32;
  EXPECT_NEAR(model.forward(in.data(), tg.data(), 0.0f), std::log(32.0), 0.1);
}

TEST(Model, GradientMatchesFiniteDifferencesPerTensor) {
  Fixture f;
  std::vector<float> g = f.grad();
  const double h = 1e-2;
  std::mt19937 rng(3);
  for (const auto& p : f.store.layout().tensors) {
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
  std::vector<float> p0(f.n());
  f.be->copy_to_host(p0.data(), f.store.params(), p0.size() * 4);
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
      f.be->copy_from_host(f.store.params(), p.data(), p.size() * 4);
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
  f.be->copy_to_host(g2.data(), f.store.grads(), g2.size() * 4);
  for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g2[i], 2 * g1[i], 1e-6 + 1e-5 * std::fabs(g1[i])) << i;
}

// Initial weights depend on the seed and the logical element only, not on the padded layout.
TEST(Model, InitialWeightsAreLayoutIndependent) {
  ModelConfig m = tiny();
  FlatLayout a = make_flat_layout(gpt_param_table(m), 1, 1 << 20), b = make_flat_layout(gpt_param_table(m), 3, 200);
  std::vector<float> pa(a.total), pb(b.total);
  gpt_initial_params(a, m.n_layer, 5, 0, a.total, pa.data());
  gpt_initial_params(b, m.n_layer, 5, 0, b.total, pb.data());
  for (size_t i = 0; i < a.tensors.size(); ++i)
    for (size_t k = 0; k < a.tensors[i].size; ++k) ASSERT_EQ(pa[a.tensors[i].offset + k], pb[b.tensors[i].offset + k]);
  // a rank initialising only a slice gets the same values
  std::vector<float> part(100);
  gpt_initial_params(b, m.n_layer, 5, 300, 400, part.data());
  for (size_t k = 0; k < part.size(); ++k) ASSERT_EQ(part[k], pb[300 + k]);
}

// The padded layout of dp = 3 with tiny buckets changes where tensors sit, not the model.
TEST(Model, PaddedLayoutGivesTheSameLossAndGradient) {
  Fixture plain, padded(3, 300);
  EXPECT_GT(padded.store.layout().buckets.size(), padded.store.layout().units.size());
  EXPECT_EQ(plain.loss(), padded.loss());
  EXPECT_EQ(plain.logical(plain.grad()), padded.logical(padded.grad()));
}

// Activation checkpointing recomputes each block's forward in backward: the same loss and
// gradient bit for bit, and fewer activation bytes.
// A step's losses wait on the device and are read once, at its end: three forwards kept, then
// take_losses() gives the sum of the three means that forward() returns one by one, bit for bit
// (the last forward with a gradient, as the step's micro-batches have).
TEST(Model, LossesWaitOnTheDeviceUntilTheStepTakesThem) {
  Fixture one;
  const ModelConfig cfg = tiny();
  auto be = make_host_backend();
  FlatParamStore store(*be, make_flat_layout(gpt_param_table(cfg), 1, size_t(1) << 30));
  be->copy_from_host(store.params(), one.store.params(), one.n() * 4);
  GPT kept(*be, cfg, one.B, store, GPTOptions{false, zero3d::DType::f32, 3});
  std::vector<int32_t> in2(one.in.rbegin(), one.in.rend());  // three different batches
  const std::vector<int32_t>* batches[3] = {&one.in, &in2, &one.tg};
  double want = 0.0;
  for (const auto* b : batches) want += one.model.forward(b->data(), one.tg.data(), 0.0f);
  for (const auto* b : batches) kept.run_forward(b->data(), one.tg.data(), 0.0f);
  EXPECT_EQ(kept.take_losses(), want);
  EXPECT_EQ(kept.take_losses(), 0.0);  // taken: nothing waits
  kept.run_forward(one.in.data(), one.tg.data(), 0.0f);
  EXPECT_EQ(kept.take_losses(), static_cast<double>(one.model.forward(one.in.data(), one.tg.data(), 0.0f)));
}

// The LM head in row blocks (compute.lm_head_block_mib; the host's default) or in one GEMM over
// all of a micro-batch's rows (a GPU's): the same losses and gradients to fp32 rounding (the
// embedding's gradient sums the blocks in turn), and fewer activation bytes in blocks.
TEST(Model, LmHeadRowBlocksGiveTheLossAndGradientOfOneGemm) {
  GPTOptions one, blocks;
  one.head_block_bytes = 0;
  blocks.head_block_bytes = 1;  // the least block: 256 rows, so 40 x 8 rows in two blocks
  Fixture whole(one, 40), blocked(blocks, 40);
  EXPECT_LT(blocked.model.activation_bytes(), whole.model.activation_bytes());
  const double want = whole.loss();
  EXPECT_NEAR(blocked.loss(), want, 1e-6 * want);
  const std::vector<float> a = whole.grad(), b = blocked.grad();
  float scale = 0.0f;
  for (float g : a) scale = std::max(scale, std::fabs(g));
  ASSERT_GT(scale, 0.0f);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5f * scale) << i;
}

// compute.lm_head_block_mib: 0 (auto) is one GEMM on a GPU whose GEMMs take the logits' type, else
// 128 MiB blocks (the host; a GPU converting the logits for its GEMMs); a number is that many MiB.
TEST(Model, LmHeadBlockSizeFollowsTheConfig) {
  Config c;
  EXPECT_EQ(gpt_options(c, true).head_block_bytes, 0u);
  EXPECT_EQ(gpt_options(c, false).head_block_bytes, size_t{128} << 20);
  c.precision = Precision::bf16;  // bf16 activations and bf16 GEMMs on a GPU: one GEMM
  EXPECT_EQ(gpt_options(c, true).head_block_bytes, 0u);
  c.compute.bf16_gemm = "off";  // bf16 logits into fp32 GEMMs: blocks
  EXPECT_EQ(gpt_options(c, true).head_block_bytes, size_t{128} << 20);
  c.compute.bf16_gemm = "auto", c.compute.activations = "fp32";  // fp32 logits from bf16 GEMMs: blocks
  EXPECT_EQ(gpt_options(c, true).head_block_bytes, size_t{128} << 20);
  c.compute.lm_head_block_mib = 3;
  EXPECT_EQ(gpt_options(c, true).head_block_bytes, size_t{3} << 20);
  EXPECT_EQ(gpt_options(c, false).head_block_bytes, size_t{3} << 20);
}

TEST(Model, ActivationCheckpointingIsBitwiseIdenticalAndSmaller) {
  Fixture plain, ckpt(1, size_t(1) << 30, true);
  EXPECT_EQ(plain.loss(), ckpt.loss());
  EXPECT_EQ(plain.grad(), ckpt.grad());
  EXPECT_LT(ckpt.model.activation_bytes(), plain.model.activation_bytes());
}

// The checkpoint hyperslabs: a piece's logical blocks, expanded in order, must list exactly
// logical_index of the piece's elements in local order, and logical_runs must be contiguous.
// The flops profiler's modules: their forward MACs x 6 are the model FLOPs per token (6 per
// parameter but wpe, plus causal attention) on one rank and summed over pipeline stages; every
// parameter is in exactly one module; with tp the GEMM and attention MACs split evenly.
TEST(Model, ModulesAddUpToTheModelFlops) {
  const ModelConfig m = tiny();
  const int micro = 3;
  const double tokens = static_cast<double>(micro) * m.seq_len;
  auto total = [](const std::vector<ModuleStat>& mods, double ModuleStat::*f) {
    double s = 0;
    for (const ModuleStat& x : mods) s += x.*f;
    return s;
  };
  const auto one = gpt_modules(m, micro, 1, 0, 1, 0);
  ASSERT_EQ(one.size(), 4u * m.n_layer + 3);
  EXPECT_EQ(one.front().name, "embedding");
  EXPECT_EQ(one[1].name, "h.0.ln_1");
  EXPECT_EQ(one.back().name, "lm_head");
  EXPECT_DOUBLE_EQ(6 * total(one, &ModuleStat::macs) / tokens, gpt_flops_per_token(m));
  double params = 0;
  for (const ParamInfo& p : gpt_param_table(m)) params += static_cast<double>(p.size);
  EXPECT_DOUBLE_EQ(total(one, &ModuleStat::params), params);
  double stages = 0;
  for (int pp = 0; pp < 2; ++pp) stages += total(gpt_modules(m, micro, 1, 0, 2, pp), &ModuleStat::macs);
  EXPECT_DOUBLE_EQ(6 * stages / tokens, gpt_flops_per_token(m));
  // tp 2: each rank does half of every block's attention and MLP and of the LM head, and the
  // whole of the replicated row-parallel bias (C per token) and LayerNorms
  const auto half = gpt_modules(m, micro, 2, 1, 1, 0);
  ASSERT_EQ(half.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const bool split = one[i].name.ends_with(".attn") || one[i].name.ends_with(".mlp");
    const double want = one[i].name == "lm_head" ? one[i].macs / 2
                        : split                  ? one[i].macs / 2 + tokens * m.d_model / 2
                                                 : one[i].macs;
    EXPECT_DOUBLE_EQ(half[i].macs, want) << one[i].name;
  }
}

TEST(Model, LogicalBlocksAndRunsFollowLogicalIndex) {
  ModelConfig m = gpt2_shape(64, 16, 2, 4, 32);
  std::mt19937_64 rng(7);
  for (int tp : {1, 2, 4})
    for (int r = 0; r < tp; ++r)
      for (const ParamInfo& p : gpt_param_table(m, tp, r)) {
        const size_t cols = p.logical_shape.size() > 1 ? static_cast<size_t>(p.logical_shape[1]) : 1;
        std::vector<std::pair<size_t, size_t>> pieces = {{0, p.size}};
        for (int k = 0; k < 20; ++k) {
          const size_t b = rng() % p.size;
          pieces.push_back({b, 1 + rng() % (p.size - b)});
        }
        for (auto [begin, size] : pieces) {
          std::vector<size_t> got;
          for (const LogicalRect& q : logical_rects(p, begin, size))
            for (size_t i = 0; i < q.rows; ++i)
              for (size_t j = 0; j < q.cols; ++j) got.push_back((q.r0 + i) * cols + q.c0 + j);
          ASSERT_EQ(got.size(), size) << p.name;
          for (size_t k = 0; k < size; ++k)
            ASSERT_EQ(got[k], logical_index(p, begin + k)) << p.name << " tp " << tp << " rank " << r << " at " << k;
        }
        for (size_t i = 0; i < p.size; i += 1 + rng() % 7) {
          const size_t run = logical_run(p, i);
          ASSERT_GE(run, 1u);
          ASSERT_LE(i + run, p.size);
          for (size_t j = 0; j < run; ++j) ASSERT_EQ(logical_index(p, i + j), logical_index(p, i) + j) << p.name;
        }
      }
}

// zero3d plan's sizing backend (kernels/backend.h): allocations are counted, never backed by memory
// (64 GiB here leaves the resident size alone), and a model built on it asks for the same
// activations as on the host backend.
TEST(Model, SizingBackendCountsWithoutMemory) {
  auto resident = [] {
    long pages = 0, rss = 0;
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (f && std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    if (f) std::fclose(f);
    return rss * 4096.0;
  };
  auto tally = std::make_shared<MemoryTally>();
  auto sizing = make_sizing_backend(MemKind::host, tally);
  const double before = resident();
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(sizing->alloc_bytes(size_t{8} << 30));
    sizing->zero(blocks.back(), size_t{8} << 30);  // nothing moves
  }
  EXPECT_EQ(tally->peak, size_t{64} << 30);
  EXPECT_LT(resident() - before, 64.0 * (1 << 20));
  for (void* p : blocks) sizing->free_bytes(p);
  EXPECT_EQ(tally->live, 0u);
  EXPECT_EQ(tally->peak, size_t{64} << 30);

  const ModelConfig m = gpt2_shape(64, 16, 2, 4, 32);
  auto host = make_host_backend();
  FlatParamStore on_host(*host, make_flat_layout(gpt_param_table(m), 1, 1 << 20));
  FlatParamStore sized(*sizing, make_flat_layout(gpt_param_table(m), 1, 1 << 20));
  GPT a(*host, m, 2, on_host), b(*sizing, m, 2, sized);
  EXPECT_EQ(a.activation_bytes(), b.activation_bytes());
  EXPECT_GE(tally->live, b.activation_bytes());
}

// The sizing backend counts each op a step asks of it (calls, bytes, FLOPs: the host backend's own
// accounting) without running it: the same counts as a host backend that ran the step, for a GPT-2
// and a Llama-style model (GQA, RoPE, RMSNorm, SwiGLU, padded vocabulary, untied head), with
// activation checkpointing too, on fp32 and on bf16 activations. This is what zero3d plan's step
// time is priced from.
TEST(Model, SizingBackendCountsTheOpsOfAStep) {
  ModelConfig llama = gpt2_shape(100, 16, 2, 4, 32);
  llama.arch = "llama", llama.norm = "rmsnorm", llama.position = "rope", llama.mlp = "swiglu";
  llama.num_key_value_heads = 2, llama.bias = false, llama.tie_word_embeddings = false;
  llama.make_vocab_size_divisible_by = 64;
  for (const ModelConfig& m : {gpt2_shape(64, 16, 2, 4, 32), llama})
    for (bool ckpt : {false, true})
      for (zero3d::DType act : {zero3d::DType::f32, zero3d::DType::bf16}) {
        auto host = make_host_backend();
        auto sizing = make_sizing_backend(MemKind::host, std::make_shared<MemoryTally>());
        FlatParamStore on_host(*host, make_flat_layout(gpt_param_table(m), 1, 1 << 20));
        FlatParamStore sized(*sizing, make_flat_layout(gpt_param_table(m), 1, 1 << 20));
        GPT a(*host, m, 2, on_host, GPTOptions{ckpt, act}), b(*sizing, m, 2, sized, GPTOptions{ckpt, act});
        EXPECT_EQ(a.activation_bytes(), b.activation_bytes());
        std::vector<int32_t> tokens(2 * m.seq_len);
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 % m.vocab_size);
        host->profile()->on = true;
        host->profile()->ops.clear();
        sizing->profile()->ops.clear();
        a.forward(tokens.data(), tokens.data(), 1.0f / tokens.size());
        a.backward();
        b.forward(tokens.data(), tokens.data(), 1.0f / tokens.size());
        b.backward();
        const auto& ran = host->profile()->ops;
        const auto& counted = sizing->profile()->ops;
        ASSERT_EQ(ran.size(), counted.size()) << m.arch << (ckpt ? " with checkpointing" : "");
        for (const auto& [op, st] : ran) {
          ASSERT_TRUE(counted.count(op)) << op;
          const OpStat& c = counted.at(op);
          EXPECT_EQ(c.calls, st.calls) << m.arch << " " << op;
          EXPECT_EQ(c.bytes, st.bytes) << m.arch << " " << op;
          EXPECT_EQ(c.flops, st.flops) << m.arch << " " << op;
        }
        EXPECT_GT(counted.at("attention_backward").flops, 0);
      }
}
