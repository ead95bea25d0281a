#include "model/gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"
#include "model/param_store.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {
// Per-layer parameter order; the constructor and layer_params() both follow it.
enum LayerParam { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kNumLayerParams };
}  // namespace

PipelineStage pipeline_stage(const ModelConfig& m, int pp, int pp_rank) {
  const int base = m.n_layer / pp, extra = m.n_layer % pp;
  return PipelineStage{pp_rank, pp, pp_rank * base + std::min(pp_rank, extra), base + (pp_rank < extra ? 1 : 0)};
}

std::vector<ParamInfo> gpt_param_table(const ModelConfig& m, int tp, int tp_rank, int pp, int pp_rank) {
  const int64_t V = m.vocab_size, T = m.seq_len, C = m.d_model;
  const PipelineStage stage = pipeline_stage(m, pp, pp_rank);
  std::vector<ParamInfo> t;
  int unit = 0;
  auto add = [&](std::string name, std::vector<int64_t> logical, bool decay, TpSplit split, int id) {
    ParamInfo p{std::move(name), logical, 0, 1, decay, unit, split, logical, tp, tp_rank, id};
    if (split == TpSplit::cols) p.shape[1] /= tp;
    else if (split != TpSplit::none) p.shape[0] /= tp;
    for (auto d : p.shape) p.size *= static_cast<size_t>(d);
    p.offset = t.empty() ? 0 : t.back().offset + t.back().size;
    p.own_bucket = p.name == "wte" && pp > 1;
    t.push_back(std::move(p));
  };
  using S = TpSplit;
  if (stage.first()) {
    add("wte", {V, C}, true, S::rows, 0);  // vocab-parallel embedding and LM head
    add("wpe", {T, C}, true, S::none, 1);
    ++unit;
  }
  for (int l = stage.first_layer; l < stage.first_layer + stage.num_layers; ++l, ++unit) {
    std::string h = "h." + std::to_string(l) + ".";
    const int id = 2 + 12 * l;
    add(h + "ln_1.weight", {C}, false, S::none, id);
    add(h + "ln_1.bias", {C}, false, S::none, id + 1);
    add(h + "attn.c_attn.weight", {3 * C, C}, true, S::rows3, id + 2);  // column-parallel, whole heads
    add(h + "attn.c_attn.bias", {3 * C}, false, S::rows3, id + 3);
    add(h + "attn.c_proj.weight", {C, C}, true, S::cols, id + 4);  // row-parallel
    add(h + "attn.c_proj.bias", {C}, false, S::none, id + 5);
    add(h + "ln_2.weight", {C}, false, S::none, id + 6);
    add(h + "ln_2.bias", {C}, false, S::none, id + 7);
    add(h + "mlp.c_fc.weight", {4 * C, C}, true, S::rows, id + 8);  // column-parallel
    add(h + "mlp.c_fc.bias", {4 * C}, false, S::rows, id + 9);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, true, S::cols, id + 10);  // row-parallel
    add(h + "mlp.c_proj.bias", {C}, false, S::none, id + 11);
  }
  if (stage.last()) {
    const int id = 2 + 12 * m.n_layer;
    add("ln_f.weight", {C}, false, S::none, id);
    add("ln_f.bias", {C}, false, S::none, id + 1);
    if (pp > 1) {  // the LM head's copy of the tied embedding, kept equal to the first stage's
      add("wte", {V, C}, true, S::rows, 0);
      t.back().tied_copy = true;
    }
  }
  return t;
}

size_t logical_index(const ParamInfo& p, size_t local) {
  const size_t cols = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  const size_t i = local / cols, j = local % cols, r = static_cast<size_t>(p.tp_rank);
  const size_t rows = static_cast<size_t>(p.shape[0]);
  switch (p.split) {
    case TpSplit::none: return local;
    case TpSplit::rows: return (r * rows + i) * cols + j;
    case TpSplit::rows3: {  // local rows [q_r | k_r | v_r], each rows/3 long
      const size_t part = rows / 3, block = i / part, within = i % part;
      return (block * part * p.tp + r * part + within) * cols + j;
    }
    case TpSplit::cols: return i * cols * p.tp + r * cols + j;
  }
  return local;
}

size_t logical_run(const ParamInfo& p, size_t local) {
  const size_t cols = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  switch (p.split) {
    case TpSplit::none:
    case TpSplit::rows: return p.size - local;
    case TpSplit::rows3: {
      const size_t block = p.size / 3;  // elements of each of q, k, v on this rank
      return block - local % block;
    }
    case TpSplit::cols: return cols - local % cols;
  }
  return 1;
}

std::vector<LogicalRect> logical_rects(const ParamInfo& p, size_t begin, size_t size) {
  const size_t R = static_cast<size_t>(p.shape[0]), C = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  std::vector<LogicalRect> local;  // partial first row, whole rows, partial last row
  size_t i = begin;
  const size_t end = begin + size;
  if (i < end && i % C) {
    const size_t n = std::min(C - i % C, end - i);
    local.push_back({i / C, i % C, 1, n});
    i += n;
  }
  if (end - i >= C) {
    const size_t k = (end - i) / C;
    local.push_back({i / C, 0, k, C});
    i += k * C;
  }
  if (i < end) local.push_back({i / C, 0, 1, end - i});
  const size_t r = static_cast<size_t>(p.tp_rank);
  std::vector<LogicalRect> out;
  for (const LogicalRect& q : local) {
    switch (p.split) {
      case TpSplit::none: out.push_back(q); break;
      case TpSplit::rows: out.push_back({q.r0 + r * R, q.c0, q.rows, q.cols}); break;
      case TpSplit::cols: out.push_back({q.r0, q.c0 + r * C, q.rows, q.cols}); break;
      case TpSplit::rows3: {  // cut at the q/k/v blocks, R/3 local rows each
        const size_t part = R / 3;
        for (size_t a = q.r0; a < q.r0 + q.rows;) {
          const size_t b = std::min(q.r0 + q.rows, (a / part + 1) * part);
          out.push_back({(a / part) * part * p.tp + r * part + a % part, q.c0, b - a, q.cols});
          a = b;
        }
        break;
      }
    }
  }
  return out;
}

double gpt_flops_per_token(const ModelConfig& m) {  // the whole model's, whatever the layout
  double n = 0;
  for (const auto& p : gpt_param_table(m))
    if (p.name != "wpe") n += static_cast<double>(p.size);
  return 6.0 * n + 6.0 * m.n_layer * static_cast<double>(m.d_model) * (m.seq_len + 1);
}

std::vector<ModuleStat> gpt_modules(const ModelConfig& m, int micro_batch, int tp, int tp_rank, int pp, int pp_rank) {
  const PipelineStage stage = pipeline_stage(m, pp, pp_rank);
  const double N = static_cast<double>(micro_batch) * m.seq_len, C = m.d_model, T = m.seq_len;
  std::vector<ModuleStat> mods;
  if (stage.first()) mods.push_back({"embedding"});
  for (int l = stage.first_layer; l < stage.first_layer + stage.num_layers; ++l)
    for (const char* part : {"ln_1", "attn", "ln_2", "mlp"}) mods.push_back({"h." + std::to_string(l) + "." + part});
  if (stage.last()) mods.push_back({"ln_f"}), mods.push_back({"lm_head"});
  auto module_of = [&](const ParamInfo& p) -> ModuleStat& {
    if (p.tied_copy) return mods.back();  // the last stage's copy of wte serves the LM head
    if (p.name == "wte" || p.name == "wpe") return mods.front();
    const std::string name = p.name.substr(0, p.name.rfind('.'));  // "h.3.attn.c_attn" or "ln_f"
    for (ModuleStat& s : mods)
      if (name == s.name || name.starts_with(s.name + ".")) return s;
    Z3D_ASSERT(false, "tensor " + p.name + " belongs to no module");
    return mods.front();
  };
  for (const ParamInfo& p : gpt_param_table(m, tp, tp_rank, pp, pp_rank)) {
    ModuleStat& s = module_of(p);
    s.params += static_cast<double>(p.size);
    if (p.name != "wte" && p.name != "wpe") s.macs += N * static_cast<double>(p.size);
  }
  for (ModuleStat& s : mods) {
    if (s.name.ends_with(".attn")) s.macs += micro_batch * (C / tp) * T * (T + 1);  // QK^T and AV, causal
    if (s.name == "lm_head") s.macs = N * static_cast<double>(m.vocab_size / tp) * C;  // logits = x wte^T
  }
  return mods;
}

GPT::GPT(Backend& backend, const ModelConfig& config, int micro_batch, ParamStore& store, GPTOptions options,
         ProcessGroup* tp, PipelineStage stage)
    : be_(backend), cfg_(config), opt_(options), tp_(tp), tp_size_(tp ? tp->size() : 1), tp_rank_(tp ? tp->rank() : 0),
      stage_(stage.num_layers < 0 ? PipelineStage{0, 1, 0, config.n_layer} : stage), B_(micro_batch),
      T_(config.seq_len), C_(config.d_model), V_(config.vocab_size / tp_size_), L_(stage_.num_layers),
      H_(config.n_head / tp_size_), A_(config.d_model / tp_size_), F_(4 * config.d_model / tp_size_),
      vocab_start_(tp_rank_ * V_), store_(store), layout_(store.layout()) {
  Z3D_ASSERT(layout_.tensors.size() == gpt_param_table(config, tp_size_, tp_rank_, stage_.size, stage_.rank).size(),
             "parameter layout does not match the model");
  locate_units_and_modules();
  plan_activations();
  plan_backward_scratch();
}

// Where this stage's share lives: units of the parameter layout, tensor indices, profiled modules.
void GPT::locate_units_and_modules() {
  // Units: [embeddings] blocks [final LayerNorm (+ the LM head's wte copy with pp > 1)].
  const int num_units = static_cast<int>(layout_.units.size());
  if (stage_.first()) emb_unit_ = 0, first_block_unit_ = 1, block_tensor0_ = 2;
  if (stage_.last()) {
    final_unit_ = num_units - 1;
    lnf_index_ = block_tensor0_ + 12 * static_cast<size_t>(L_);
    head_unit_ = stage_.first() ? emb_unit_ : final_unit_;
    head_wte_index_ = stage_.first() ? 0 : lnf_index_ + 2;
  }
  Z3D_ASSERT(layout_.tensors[0].tp == tp_size_ && layout_.tensors[0].tp_rank == tp_rank_,
             "parameter layout is for another tensor-parallel rank");
  // Modules (gpt_modules' order): [embedding] 4 per block [ln_f lm_head].
  block_module0_ = stage_.first() ? 1 : 0;
  lnf_module_ = block_module(L_, 0);
  head_module_ = lnf_module_ + 1;
}

// Activation plan. A block's activations: ln1, res2, ln2 (N*C each), qkv (3 N*A), atty (N*A),
// fch and fch_gelu (N*F each), 4 N LayerNorm statistics and the attention's B*H*T row
// log-sum-exps (this rank's heads; the T x T probabilities are recomputed in backward, never
// stored); one set per layer, or a single shared set with activation checkpointing. Plus the
// residual stream x_0..x_L, the final LayerNorm, one row block of this rank's logits (the LM
// head runs in blocks of at most 2^25 logits, 128 MiB) and the losses.
void GPT::plan_activations() {
  const size_t N = static_cast<size_t>(B_) * T_, C = C_, A = A_, F = F_, lse = static_cast<size_t>(B_) * H_ * T_;
  const size_t per_set = N * C * 3 + N * A * 4 + N * F * 2 + N * 4 + lse;
  const size_t sets = opt_.checkpoint_activations ? 1 : static_cast<size_t>(L_);
  head_rows_ = static_cast<int>(std::min<size_t>(N, std::max<size_t>(256, (size_t{1} << 25) / V_)));
  const size_t total = per_set * sets + N * C * (L_ + 2) + N * 3 + static_cast<size_t>(head_rows_) * V_;
  acts_ = DeviceBuffer<float>(be_, total);
  activation_bytes_ = acts_.bytes();
  float* p = acts_.data();
  auto take = [&](size_t n) { float* r = p; p += n; return r; };
  enc_ = take(N * C);
  for (size_t set = 0; set < sets; ++set) {
    LayerActs a{};
    a.ln1 = take(N * C);
    a.ln1_mean = take(N);
    a.ln1_rstd = take(N);
    a.qkv = take(3 * N * A);
    a.lse = take(lse);
    a.atty = take(N * A);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(N * F);
    a.fch_gelu = take(N * F);
    layers_.push_back(a);
  }
  while (static_cast<int>(layers_.size()) < L_) layers_.push_back(layers_.front());  // checkpointing: shared
  // The residual stream: layer l reads x_l and writes x_{l+1}; x_0 is the embedding output.
  std::vector<float*> xs(L_ + 1);
  xs[0] = enc_;
  for (int l = 1; l <= L_; ++l) xs[l] = take(N * C);
  for (int l = 0; l < L_; ++l) layers_[l].x = xs[l];
  xfinal_ = xs[L_];
  lnf_ = take(N * C);
  lnf_mean_ = take(N);
  lnf_rstd_ = take(N);
  logits_ = take(static_cast<size_t>(head_rows_) * V_);
  losses_ = take(N);
  Z3D_ASSERT(p <= acts_.data() + total, "activation plan overflows its allocation");
}

// Backward scratch: residual gradient, one N*C temporary, dqkv, the MLP hidden gradient. Then the
// token buffers and the cross-entropy's row statistics.
void GPT::plan_backward_scratch() {
  const size_t N = static_cast<size_t>(B_) * T_, C = C_, A = A_, F = F_;
  const size_t scratch = N * C * 2 + 3 * N * A + N * F;
  scratch_ = DeviceBuffer<float>(be_, scratch);
  float* s = scratch_.data();
  dres_ = s; s += N * C;
  dbuf_c_ = s; s += N * C;
  dqkv_ = s; s += 3 * N * A;
  dfch_ = s;
  activation_bytes_ += scratch_.bytes();

  inputs_ = DeviceBuffer<int32_t>(be_, N);
  targets_ = DeviceBuffer<int32_t>(be_, N);
  ce_ = DeviceBuffer<float>(be_, 3 * N);
  host_losses_.resize(N);
  host_ce_.resize(3 * N);
}

template <typename F>
F* GPT::tensor(F* unit_base, size_t i) const {
  const ParamInfo& p = layout_.tensors[i];
  return unit_base + (p.offset - layout_.units[p.unit].offset);
}

template <typename F>
GPT::LayerTensors<F> GPT::layer_tensors(F* base, int l) const {
  const size_t first = block_tensor0_ + static_cast<size_t>(l) * kNumLayerParams;
  auto at = [&](int k) { return tensor(base, first + k); };
  return {at(kLn1W), at(kLn1B), at(kQkvW), at(kQkvB), at(kProjW), at(kProjB),
          at(kLn2W), at(kLn2B), at(kFcW),  at(kFcB),  at(kFcProjW), at(kFcProjB)};
}

void gpt_init_tensor(const std::vector<ParamInfo>& table, size_t index, int n_layer, uint64_t seed, size_t begin,
                     size_t end, float* out) {
  const ParamInfo& p = table[index];
  const bool is_ln_weight = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
  if (is_ln_weight) {
    for (size_t k = begin; k < end; ++k) out[k - begin] = 1.0f;
  } else if (p.shape.size() == 1) {
    for (size_t k = begin; k < end; ++k) out[k - begin] = 0.0f;
  } else {
    const bool residual = p.name.ends_with("c_proj.weight");
    const double std = 0.02 * (residual ? 1.0 / std::sqrt(2.0 * n_layer) : 1.0);
    for (size_t k = begin; k < end; ++k)
      out[k - begin] = static_cast<float>(std * normal_at(seed, static_cast<uint64_t>(p.id), logical_index(p, k)));
  }
}

void GPT::tp_all_reduce(float* x, size_t n) {
  if (tp_size_ > 1) {
    be_.synchronize();
    tp_->all_reduce_sum(be_.mem(x), n);
  }
}

// Megatron's block: column-parallel qkv and fc (each rank computes its heads / its quarter of the
// MLP), row-parallel proj and fc_proj (each rank's partial product, then one all-reduce): two
// all-reduces per block forward, two in backward. The biases and the residual adds ride in the
// GEMMs' epilogues; with tp > 1 tp rank 0 adds them to its partial product before the sum.
void GPT::block_forward(int l, const LayerActs& a, const LayerTensors<const float>& w, float* x_next) {
  const int N = B_ * T_, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  const bool adds = tp_rank_ == 0;
  auto row_parallel = [&](float* y, const float* x, const float* wt, const float* bias, const float* residual,
                          int in) {
    be_.linear_forward(y, x, wt, adds ? bias : nullptr, adds ? residual : nullptr, N, in, C);
    tp_all_reduce(y, NC);
  };
  {
    auto t = timed(block_module(l, 0));
    be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x, w.ln1_w, w.ln1_b, N, C);
  }
  {
    auto t = timed(block_module(l, 1));
    be_.linear_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, nullptr, N, C, 3 * A_);
    be_.attention_forward(a.atty, a.lse, a.qkv, B_, T_, H_, A_);
    row_parallel(a.res2, a.atty, w.proj_w, w.proj_b, a.x, A_);  // res2 = x + attn
  }
  {
    auto t = timed(block_module(l, 2));
    be_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2_w, w.ln2_b, N, C);
  }
  auto t = timed(block_module(l, 3));
  be_.linear_gelu_forward(a.fch_gelu, a.fch, a.ln2, w.fc_w, w.fc_b, N, C, F_);
  row_parallel(x_next, a.fch_gelu, w.fcproj_w, w.fcproj_b, a.res2, F_);  // x_next = res2 + mlp
}

// Cross-entropy of the logits of rows [r0, r0 + rows) (in logits_), their losses into
// host_losses_, and with dloss > 0 dlogits in place. With tensor parallelism each rank holds V/tp
// of the logits: the row maxima, the sums of exponentials and the target logits are all-reduced;
// the whole logits never exist on one rank.
void GPT::crossentropy(int r0, int rows, float dloss) {
  const bool grad = dloss > 0.0f;
  const int32_t* targets = targets_.data() + r0;
  if (tp_size_ == 1) {
    be_.crossentropy(losses_, grad ? logits_ : nullptr, logits_, targets, rows, V_, dloss);
    be_.copy_to_host(host_losses_.data() + r0, losses_, sizeof(float) * rows);
    return;
  }
  float *row_max = ce_.data(), *sumexp = row_max + rows, *target = sumexp + rows;
  be_.vocab_row_max(row_max, logits_, rows, V_);
  be_.synchronize();
  tp_->all_reduce_max(be_.mem(row_max), rows);
  be_.vocab_sumexp(sumexp, target, logits_, row_max, targets, vocab_start_, rows, V_);
  be_.synchronize();
  tp_->all_reduce_sum(be_.mem(sumexp), 2 * static_cast<size_t>(rows));  // sums and target logits together
  if (grad) be_.vocab_crossentropy_grad(logits_, logits_, row_max, sumexp, targets, vocab_start_, rows, V_, dloss);
  be_.copy_to_host(host_ce_.data(), ce_.data(), sizeof(float) * 3 * rows);
  for (int n = 0; n < rows; ++n)
    host_losses_[r0 + n] = std::log(host_ce_[rows + n]) + (host_ce_[n] - host_ce_[2 * rows + n]);
}

// The tied LM head and the loss, in row blocks of head_rows_ so that at most one block of logits
// (or probabilities) exists at a time. With dloss > 0 each block's gradient goes through the head
// at once: dlnf (into dbuf_c_, for backward's final LayerNorm) and dwte. Returns the mean loss.
float GPT::lm_head(const float* wte, float* dwte, float dloss) {
  const int N = B_ * T_, C = C_;
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int rows = std::min(head_rows_, N - r0);
    const float* x = lnf_ + static_cast<size_t>(r0) * C;
    {
      auto t = timed(head_module_);
      be_.gemm(false, true, rows, V_, C, 1.0f, x, C, wte, C, 0.0f, logits_, V_);  // logits = x wte^T
      crossentropy(r0, rows, dloss);
    }
    if (dloss <= 0.0f) continue;
    in_backward_ = true;  // the head's backward, run here block by block
    auto t = timed(head_module_);
    be_.gemm(false, false, rows, C, V_, 1.0f, logits_, V_, wte, C, 0.0f, dbuf_c_ + static_cast<size_t>(r0) * C, C);
    be_.gemm(true, false, V_, C, rows, 1.0f, logits_, V_, x, C, 1.0f, dwte, C);  // dwte += dlogits^T x
    in_backward_ = false;
  }
  if (dloss > 0.0f) {
    in_backward_ = true;
    auto t = timed(head_module_);
    tp_all_reduce(dbuf_c_, static_cast<size_t>(N) * C);  // dlnf: summed over the vocab slices
    in_backward_ = false;
  }
  double sum = 0.0;
  for (float v : host_losses_) sum += v;
  return static_cast<float>(sum / N);
}

float GPT::forward(const int32_t* inputs, const int32_t* targets, float dloss) {
  const int N = B_ * T_, C = C_;
  be_.copy_from_host(inputs_.data(), inputs, sizeof(int32_t) * N);
  be_.copy_from_host(targets_.data(), targets, sizeof(int32_t) * N);
  const float* emb = nullptr;
  if (stage_.first()) {  // held until the LM head when this stage has both
    emb = store_.acquire_params(emb_unit_);
    // Vocab-parallel embedding: each rank looks up its rows (others give 0), rank 0 adds positions.
    auto t = timed(0);
    be_.embedding_forward(enc_, inputs_.data(), tensor(emb, 0), tp_rank_ == 0 ? tensor(emb, 1) : nullptr, N, T_, C,
                          vocab_start_, V_);
    tp_all_reduce(enc_, static_cast<size_t>(N) * C);
    if (!stage_.last()) store_.release_params(emb_unit_);
  }
  for (int l = 0; l < L_; ++l) {
    const int unit = first_block_unit_ + l;
    block_forward(l, layers_[l], layer_tensors(store_.acquire_params(unit), l), l + 1 < L_ ? layers_[l + 1].x : xfinal_);
    store_.release_params(unit);
  }
  if (!stage_.last()) return 0.0f;
  const float* fin = store_.acquire_params(final_unit_);
  const float* wte = tensor(head_unit_ == emb_unit_ ? emb : fin, head_wte_index_);
  {
    auto t = timed(lnf_module_);
    be_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, xfinal_, tensor(fin, lnf_index_), tensor(fin, lnf_index_ + 1), N,
                          C);
  }
  // Training: the head's backward runs here, block by block, so its gradients are taken now; the
  // final unit's is handed over by backward() (after the final LayerNorm's), the tied
  // embedding's (one stage) after the embedding's.
  float* dwte = nullptr;
  head_grads_done_ = dloss > 0.0f;
  if (head_grads_done_) {
    dfinal_ = store_.acquire_grads(final_unit_);
    if (stage_.first()) demb_ = store_.acquire_grads(emb_unit_);
    dwte = tensor(head_unit_ == emb_unit_ ? demb_ : dfinal_, head_wte_index_);
  }
  const float loss = lm_head(wte, dwte, dloss);
  store_.release_params(final_unit_);
  if (stage_.first()) store_.release_params(emb_unit_);
  return loss;
}

void GPT::set_module_profile(ModuleProfile* p) {
  Z3D_ASSERT(!p || p->modules.size() == (stage_.last() ? head_module_ + 1 : lnf_module_),
             "module profile does not describe this model's modules");
  mprof_ = p;
}

void GPT::backward() {
  const int N = B_ * T_, C = C_;
  const size_t NC = static_cast<size_t>(N) * C;
  in_backward_ = true;  // module timers count backward (and recomputed forwards) until the return
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{in_backward_};
  float* demb = nullptr;
  if (stage_.last()) {  // the LM head ran its backward in forward(): dlnf is in dbuf_c_
    Z3D_ASSERT(head_grads_done_, "GPT::backward() needs a forward() with dloss > 0 first");
    head_grads_done_ = false;
    demb = demb_;
    const float* fin = store_.acquire_params(final_unit_);
    {
      auto t = timed(lnf_module_);
      be_.zero(dres_, NC * sizeof(float));
      be_.layernorm_backward(dres_, tensor(dfinal_, lnf_index_), tensor(dfinal_, lnf_index_ + 1), dbuf_c_, xfinal_,
                             tensor(fin, lnf_index_), lnf_mean_, lnf_rstd_, N, C);
    }
    store_.grads_done(final_unit_);
    store_.release_params(final_unit_);
  }

  // linear backward: dx = dy W (overwrites), dW += dy^T x, db += sum dy (unless the caller
  // summed it already: nullptr)
  auto linear_backward = [&](float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int in,
                             int out) {
    be_.gemm(false, false, N, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    be_.gemm(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db) be_.bias_backward(db, dy, N, out);
  };
  for (int l = L_ - 1; l >= 0; --l) {
    const LayerActs& a = layers_[l];
    const int unit = first_block_unit_ + l;
    const auto w = layer_tensors(store_.acquire_params(unit), l);
    // Regenerate this block's activations from its input (the last block's are still there).
    if (opt_.checkpoint_activations && l + 1 < L_) {
      const auto t0 = std::chrono::steady_clock::now();
      block_forward(l, a, w, l + 1 < L_ ? layers_[l + 1].x : xfinal_);
      be_.synchronize();
      recompute_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const auto g = layer_tensors(store_.acquire_grads(unit), l);
    // MLP: dres holds d x_{l+1}; it flows unchanged into d res2 through the residual.
    // Row-parallel layers need no communication backward; column-parallel ones all-reduce dx.
    {
      auto t = timed(block_module(l, 3));
      linear_backward(dfch_, g.fcproj_w, g.fcproj_b, dres_, a.fch_gelu, w.fcproj_w, F_, C);
      be_.gelu_backward(dfch_, g.fc_b, a.fch, dfch_, N, F_);  // with fc's bias gradient, in one pass
      linear_backward(dbuf_c_, g.fc_w, nullptr, dfch_, a.ln2, w.fc_w, C, F_);
      tp_all_reduce(dbuf_c_, NC);
    }
    {
      auto t = timed(block_module(l, 2));
      be_.layernorm_backward(dres_, g.ln2_w, g.ln2_b, dbuf_c_, a.res2, w.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);
    }
    {  // attention: dres now holds d res2, which flows unchanged into d x_l
      auto t = timed(block_module(l, 1));
      linear_backward(dbuf_c_, g.proj_w, g.proj_b, dres_, a.atty, w.proj_w, A_, C);
      be_.attention_backward(dqkv_, dbuf_c_, a.atty, a.lse, a.qkv, B_, T_, H_, A_);
      linear_backward(dbuf_c_, g.qkv_w, g.qkv_b, dqkv_, a.ln1, w.qkv_w, C, 3 * A_);
      tp_all_reduce(dbuf_c_, NC);
    }
    {
      auto t = timed(block_module(l, 0));
      be_.layernorm_backward(dres_, g.ln1_w, g.ln1_b, dbuf_c_, a.x, w.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
    }
    store_.grads_done(unit);
    store_.release_params(unit);
  }
  if (!stage_.first()) return;  // dres holds d(input) for the previous stage
  if (!stage_.last()) demb = store_.acquire_grads(emb_unit_);  // the lookup's gradient needs no weights
  {
    auto t = timed(0);
    be_.embedding_backward(tensor(demb, 0), tensor(demb, 1), dres_, inputs_.data(), N, T_, C, vocab_start_, V_);
  }
  store_.grads_done(emb_unit_);
}

}  // namespace zero3d
