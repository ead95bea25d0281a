#include "model/gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "model/param_store.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {
// Carves one allocation into 64-byte aligned pieces: activations in the model's element type,
// statistics in fp32. With no base it only counts the bytes.
class Carver {
 public:
  Carver(char* base, DType act) : base_(base), act_(act) {}
  View act(size_t n) { return {take(n * dtype_bytes(act_)), act_, n}; }
  float* f32(size_t n) { return static_cast<float*>(take(n * sizeof(float))); }
  size_t bytes() const { return used_; }

 private:
  void* take(size_t bytes) {
    void* p = base_ ? base_ + used_ : nullptr;
    used_ += (bytes + 63) / 64 * 64;
    return p;
  }
  char* base_;
  DType act_;
  size_t used_ = 0;
};

// One allocation for what `carve(Carver&)` takes: sized by a first pass, then carved for real.
template <typename F>
DeviceBuffer<char> carved(Backend& be, DType act, F&& carve) {
  Carver sizing(nullptr, act);
  carve(sizing);
  DeviceBuffer<char> buf(be, sizing.bytes());
  Carver on(buf.data(), act);
  carve(on);
  return buf;
}

}  // namespace

GPTOptions gpt_options(const Config& c, bool gpu, int slots) {
  const std::string& a = c.compute.activations;
  if (a == "bf16" && c.precision != Precision::bf16)
    throw UserError("compute.activations=\"bf16\" needs bf16.enabled=true (bf16 mixed precision); use \"fp32\" or "
                    "\"auto\"");
  const bool bf16 = c.precision == Precision::bf16 && (a == "bf16" || (a == "auto" && gpu));
  // The LM head in one GEMM on a GPU whose GEMMs read and write the logits in their own type;
  // else a type conversion would hold a scratch of all the logits for the run: blocks bound it.
  const int head_mib = c.compute.lm_head_block_mib;
  const size_t head_bytes = head_mib > 0                      ? static_cast<size_t>(head_mib) << 20
                            : gpu && bf16 == c.cuda_bf16_gemm() ? 0
                                                               : GPTOptions{}.head_block_bytes;
  return GPTOptions{c.activation_checkpointing, bf16 ? DType::bf16 : DType::f32,
                    std::max(1, (c.gradient_accumulation_steps + slots - 1) / slots), head_bytes};
}

GPT::GPT(Backend& backend, const ModelConfig& config, int micro_batch, ParamStore& store, GPTOptions options,
         ProcessGroup* tp, PipelineStage stage)
    : be_(backend), cfg_(config), opt_(options), tp_(tp), tp_size_(tp ? tp->size() : 1), tp_rank_(tp ? tp->rank() : 0),
      stage_(stage.num_layers < 0 ? PipelineStage{0, 1, 0, config.n_layer} : stage), B_(micro_batch),
      T_(config.seq_len), C_(config.d_model), V_(config.padded_vocab() / tp_size_), L_(stage_.num_layers),
      H_(config.n_head / tp_size_), A_(config.d_model / tp_size_), F_(config.ffn_hidden() / tp_size_),
      vocab_start_(tp_rank_ * V_), Hkv_(config.kv_heads() / tp_size_), hd_(config.head_dim()),
      QKV_(A_ + 2 * Hkv_ * hd_), F2_(config.swiglu() ? 2 * F_ : F_),
      logit_cols_(std::clamp(config.vocab_size - vocab_start_, 0, V_)), store_(store), layout_(store.layout()),
      act_(options.activations) {
  role_.assign(kNumLayerParams, -1);
  for (const BlockTensor& t : block_tensors(config)) role_[t.role] = block_size_++;
  Z3D_ASSERT(layout_.tensors.size() == gpt_param_table(config, tp_size_, tp_rank_, stage_.size, stage_.rank).size(),
             "parameter layout does not match the model");
  locate_units_and_modules();
  plan_activations();
  plan_backward_scratch();
  if (config.rope()) {
    const std::vector<float> cs = gpt_rope_table(config, T_);
    rope_cs_ = DeviceBuffer<float>(be_, cs.size());
    be_.copy_from_host(rope_cs_.data(), cs.data(), rope_cs_.bytes());
    activation_bytes_ += rope_cs_.bytes();
  }
}

// Where this stage's share lives: units of the parameter layout, tensor indices, profiled modules.
void GPT::locate_units_and_modules() {
  // Units: [embeddings] blocks [final LayerNorm (+ the LM head's wte copy with pp > 1)].
  const int num_units = static_cast<int>(layout_.units.size());
  if (stage_.first()) emb_unit_ = 0, first_block_unit_ = 1, block_tensor0_ = cfg_.rope() ? 1 : 2;
  if (stage_.last()) {  // the LM head's weight: wte (tied, one stage), its copy (tied) or lm_head.weight
    final_unit_ = num_units - 1;
    lnf_index_ = block_tensor0_ + static_cast<size_t>(block_size_) * L_;
    const bool in_emb = cfg_.tie_word_embeddings && stage_.first();
    head_unit_ = in_emb ? emb_unit_ : final_unit_;
    head_wte_index_ = in_emb ? 0 : lnf_index_ + (cfg_.rmsnorm() ? 1 : 2);
  }
  Z3D_ASSERT(layout_.tensors[0].tp == tp_size_ && layout_.tensors[0].tp_rank == tp_rank_,
             "parameter layout is for another tensor-parallel rank");
  // Modules (gpt_modules' order): [embedding] 4 per block [ln_f lm_head].
  block_module0_ = stage_.first() ? 1 : 0;
  lnf_module_ = block_module(L_, 0);
  head_module_ = lnf_module_ + 1;
}

// Activation plan. A block's activations: ln1, res2, ln2 (N*C each), qkv (N*QKV), atty (N*A),
// fch (N*F2) and fch_gelu (N*F), 4 N norm statistics and the attention's B*H*T row
// log-sum-exps (this rank's heads; the T x T probabilities are recomputed in backward, never
// stored); one set per layer, or a single shared set with activation checkpointing. Plus the
// residual stream x_0..x_L, the final LayerNorm, one row block of this rank's logits (in the
// activations' type: the LM head runs in blocks of GPTOptions::head_block_bytes) and the losses.
void GPT::plan_activations() {
  const size_t N = static_cast<size_t>(B_) * T_, C = C_, lse = static_cast<size_t>(B_) * H_ * T_;
  const size_t sets = opt_.checkpoint_activations ? 1 : static_cast<size_t>(L_);
  const size_t cap = opt_.head_block_bytes;
  head_rows_ = static_cast<int>(cap == 0 ? N : std::min<size_t>(N, std::max<size_t>(256, cap / dtype_bytes(act_) / V_)));
  auto carve = [&](Carver& c) {
    enc_ = c.act(N * C);
    layers_.clear();
    for (size_t set = 0; set < sets; ++set) {
      LayerActs a{};
      a.ln1 = c.act(N * C);
      a.ln1_mean = c.f32(N);
      a.ln1_rstd = c.f32(N);
      a.qkv = c.act(N * QKV_);
      a.lse = c.f32(lse);
      a.atty = c.act(N * A_);
      a.res2 = c.act(N * C);
      a.ln2 = c.act(N * C);
      a.ln2_mean = c.f32(N);
      a.ln2_rstd = c.f32(N);
      a.fch = c.act(N * F2_);
      a.fch_gelu = c.act(N * F_);
      layers_.push_back(a);
    }
    while (static_cast<int>(layers_.size()) < L_) layers_.push_back(layers_.front());  // checkpointing: shared
    // The residual stream: layer l reads x_l and writes x_{l+1}; x_0 is the embedding output.
    for (int l = 0; l < L_; ++l) {
      layers_[l].x = l == 0 ? enc_ : xfinal_;
      xfinal_ = c.act(N * C);
    }
    if (L_ == 0) xfinal_ = enc_;
    // The final LayerNorm, the logits and the losses: the head's stage only.
    const size_t head = stage_.last() ? 1 : 0;
    lnf_ = c.act(head * N * C);
    lnf_mean_ = c.f32(head * N);
    lnf_rstd_ = c.f32(head * N);
    logits_ = c.act(head * head_rows_ * V_);
    losses_ = c.f32(head * N * opt_.losses_kept);
  };
  acts_ = carved(be_, act_, carve);
  activation_bytes_ = acts_.bytes();
}

// Backward scratch: residual gradient, one N*C temporary, dqkv, the MLP hidden gradients (in the
// activations' type). Then the token buffers and the cross-entropy's row statistics.
void GPT::plan_backward_scratch() {
  const size_t N = static_cast<size_t>(B_) * T_, C = C_;
  auto carve = [&](Carver& c) {
    dres_ = c.act(N * C);
    dbuf_c_ = c.act(N * C);
    dqkv_ = c.act(N * QKV_);
    dfch_ = c.act(N * F2_);
    dact_ = cfg_.swiglu() ? c.act(N * F_) : dfch_.at(0, N * F_);  // SwiGLU: the activation's gradient beside its input's
  };
  scratch_ = carved(be_, act_, carve);
  activation_bytes_ += scratch_.bytes();

  inputs_ = DeviceBuffer<int32_t>(be_, N);
  targets_ = DeviceBuffer<int32_t>(be_, N);
  const size_t kept = static_cast<size_t>(opt_.losses_kept);
  // The head's stage only; the host's copies grow at the first take_losses().
  ce_ = DeviceBuffer<float>(be_, stage_.last() ? 3 * N * kept : 0);
}

template <typename F>
F* GPT::tensor(F* unit_base, size_t i) const {
  const ParamInfo& p = layout_.tensors[i];
  return unit_base + (p.offset - layout_.units[p.unit].offset);
}

template <typename F>
GPT::LayerTensors<F> GPT::layer_tensors(F* base, int l) const {
  const size_t first = block_tensor0_ + static_cast<size_t>(l) * block_size_;
  auto at = [&](int k) { return role_[k] < 0 ? nullptr : tensor(base, first + role_[k]); };
  return {at(kLn1W), at(kLn1B), at(kQkvW), at(kQkvB), at(kProjW), at(kProjB),
          at(kLn2W), at(kLn2B), at(kFcW),  at(kFcB),  at(kFcProjW), at(kFcProjB)};
}

GemmWeight GPT::gemm_weight(const float* unit_base, const uint16_t* unit_base16, size_t i) const {
  const bool in_fp32 = !layout_.tensors[i].gemm_only || store_.fp32_gemm_weights();
  return {in_fp32 ? tensor(unit_base, i) : nullptr, unit_base16 ? tensor(unit_base16, i) : nullptr};
}

GPT::BlockParams GPT::acquire_block(int l) {
  const int unit = first_block_unit_ + l;
  const float* base = store_.acquire_params(unit);
  const uint16_t* base16 = store_.acquired_bf16(unit);
  const size_t first = block_tensor0_ + static_cast<size_t>(l) * block_size_;
  auto matrix = [&](int k) { return gemm_weight(base, base16, first + role_[k]); };
  return {layer_tensors(base, l), matrix(kQkvW), matrix(kProjW), matrix(kFcW), matrix(kFcProjW)};
}

void GPT::tp_all_reduce(View x) {
  if (tp_size_ == 1) return;
  be_.synchronize();
  if (x.bf16()) tp_->all_reduce_sum(be_.mem(x.bf16_data()), x.size, Dtype16::bf16);
  else tp_->all_reduce_sum(be_.mem(x.f32_data()), x.size);
}

// Megatron's block: column-parallel qkv and fc (each rank computes its heads / its quarter of the
// MLP), row-parallel proj and fc_proj (each rank's partial product, then one all-reduce): two
// all-reduces per block forward, two in backward. The biases and the residual adds ride in the
// GEMMs' epilogues; with tp > 1 tp rank 0 adds them to its partial product before the sum.
void GPT::block_forward(int l, const LayerActs& a, const BlockParams& p, View x_next) {
  const int N = B_ * T_, C = C_;
  const bool adds = tp_rank_ == 0;
  const LayerTensors<const float>& w = p.w;
  auto row_parallel = [&](View y, ConstView x, GemmWeight wt, const float* bias, ConstView residual, int in) {
    be_.linear_forward(y, x, wt, adds ? bias : nullptr, adds ? residual : ConstView{}, N, in, C);
    tp_all_reduce(y);
  };
  {
    auto t = timed(block_module(l, 0));
    norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.x, w.ln1_w, w.ln1_b);
  }
  {
    auto t = timed(block_module(l, 1));
    be_.linear_forward(a.qkv, a.ln1, p.qkv, w.qkv_b, nullptr, N, C, QKV_);
    if (cfg_.rope()) be_.rope(a.qkv, rope_cs_.data(), N, T_, H_ + Hkv_, hd_, QKV_, false);  // q and k turned in place
    be_.attention_forward(a.atty, a.lse, a.qkv, B_, T_, H_, Hkv_, A_);
    row_parallel(a.res2, a.atty, p.proj, w.proj_b, a.x, A_);  // res2 = x + attn
  }
  {
    auto t = timed(block_module(l, 2));
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2_w, w.ln2_b);
  }
  auto t = timed(block_module(l, 3));
  if (cfg_.swiglu()) {
    be_.linear_forward(a.fch, a.ln2, p.fc, w.fc_b, nullptr, N, C, F2_);
    be_.swiglu_forward(a.fch_gelu, a.fch, N, F_);
  } else {
    be_.linear_gelu_forward(a.fch_gelu, a.fch, a.ln2, p.fc, w.fc_b, N, C, F_);
  }
  row_parallel(x_next, a.fch_gelu, p.fcproj, w.fcproj_b, a.res2, F_);  // x_next = res2 + mlp
}

void GPT::norm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b) {
  const int N = B_ * T_;
  if (cfg_.rmsnorm()) be_.rmsnorm_forward(out, rstd, x, w, N, C_, static_cast<float>(cfg_.rms_norm_eps));
  else be_.layernorm_forward(out, mean, rstd, x, w, b, N, C_);
}

void GPT::norm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w, const float* mean,
                        const float* rstd) {
  const int N = B_ * T_;
  if (cfg_.rmsnorm()) be_.rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C_);
  else be_.layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C_);
}

// Cross-entropy of the logits of rows [r0, r0 + rows) (in logits_), their losses (or, with tensor
// parallelism, their statistics) left on the device for take_losses, and with dloss > 0 dlogits in
// place. With tensor parallelism each rank holds V/tp of the logits: the row maxima, the sums of
// exponentials and the target logits are all-reduced; the whole logits never exist on one rank.
void GPT::crossentropy(int k, int r0, int rows, float dloss) {
  const bool grad = dloss > 0.0f;
  const size_t N = static_cast<size_t>(B_) * T_;
  const int32_t* targets = targets_.data() + r0;
  const View z = logits_.at(0, static_cast<size_t>(rows) * V_);
  if (tp_size_ == 1) {
    be_.crossentropy(losses_ + k * N + r0, grad ? z : View{}, z, targets, rows, logit_cols_, V_, dloss);
    return;
  }
  // The block's statistics at 3 (k N + r0) of ce_: [row max | sum of exp | target logit], rows each.
  float *row_max = ce_.data() + 3 * (k * N + r0), *sumexp = row_max + rows, *target = sumexp + rows;
  be_.vocab_row_max(row_max, z, rows, logit_cols_, V_);
  be_.synchronize();
  tp_->all_reduce_max(be_.mem(row_max), rows);
  be_.vocab_sumexp(sumexp, target, z, row_max, targets, vocab_start_, rows, logit_cols_, V_);
  be_.synchronize();
  tp_->all_reduce_sum(be_.mem(sumexp), 2 * static_cast<size_t>(rows));  // sums and target logits together
  if (grad) be_.vocab_crossentropy_grad(z, z, row_max, sumexp, targets, vocab_start_, rows, logit_cols_, V_, dloss);
}

double GPT::take_losses() {
  const int N = B_ * T_, k = pending_;
  pending_ = 0;
  if (!stage_.last() || k == 0) return 0.0;
  const size_t n = static_cast<size_t>(N) * k;
  host_losses_.resize(std::max(host_losses_.size(), n));
  if (tp_size_ == 1) {
    be_.copy_to_host(host_losses_.data(), losses_, sizeof(float) * n);
  } else {  // each row's loss from its statistics, block by block as crossentropy() left them
    host_ce_.resize(std::max(host_ce_.size(), 3 * n));
    be_.copy_to_host(host_ce_.data(), ce_.data(), sizeof(float) * 3 * n);
    for (size_t b = 0; b < n; b += N)
      for (int r0 = 0; r0 < N; r0 += head_rows_) {
        const int rows = std::min(head_rows_, N - r0);
        const float* ce = host_ce_.data() + 3 * (b + r0);
        for (int i = 0; i < rows; ++i) host_losses_[b + r0 + i] = std::log(ce[rows + i]) + (ce[i] - ce[2 * rows + i]);
      }
  }
  double sum = 0.0;
  for (size_t b = 0; b < n; b += N) {  // each forward's mean, as its own sum over its rows
    double s = 0.0;
    for (int i = 0; i < N; ++i) s += host_losses_[b + i];
    sum += static_cast<float>(s / N);
  }
  return sum;
}

// The tied LM head and the loss, in row blocks of head_rows_ so that at most one block of logits
// (or probabilities) exists at a time. With dloss > 0 each block's gradient goes through the head
// at once: dlnf (into dbuf_c_, for backward's final LayerNorm) and dwte. The losses wait on the
// device, as forward pending_ (take_losses).
// The GEMMs run over this rank's V_ embedding rows, the vocabulary padded
// (model.make_vocab_size_divisible_by: aligned shapes for the tensor cores); the loss reads the
// logit_cols_ real ones and gives the padding a zero gradient, so it reaches no loss or gradient.
void GPT::lm_head(GemmWeight wte, float* dwte, float dloss) {
  const int N = B_ * T_, C = C_;
  Z3D_ASSERT(pending_ < opt_.losses_kept, strprintf("GPT: a forward beyond the %d whose losses may wait (take_losses)",
                                                    opt_.losses_kept));
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int rows = std::min(head_rows_, N - r0);
    const ConstView x = lnf_.at(static_cast<size_t>(r0) * C, static_cast<size_t>(rows) * C);
    {
      auto t = timed(head_module_);
      be_.gemm(false, true, rows, V_, C, 1.0f, x, C, wte, C, 0.0f, logits_, V_);  // logits = x wte^T
      crossentropy(pending_, r0, rows, dloss);
    }
    if (dloss <= 0.0f) continue;
    in_backward_ = true;  // the head's backward, run here block by block
    auto t = timed(head_module_);
    be_.gemm(false, false, rows, C, V_, 1.0f, logits_, V_, wte, C, 0.0f,
             dbuf_c_.at(static_cast<size_t>(r0) * C, static_cast<size_t>(rows) * C), C);
    be_.gemm(true, false, V_, C, rows, 1.0f, logits_, V_, GemmWeight(x), C, 1.0f, dwte, C);  // dwte += dlogits^T x
    in_backward_ = false;
  }
  if (dloss > 0.0f) {
    in_backward_ = true;
    auto t = timed(head_module_);
    tp_all_reduce(dbuf_c_);  // dlnf: summed over the vocab slices
    in_backward_ = false;
  }
  ++pending_;
}

float GPT::forward(const int32_t* inputs, const int32_t* targets, float dloss) {
  Z3D_ASSERT(pending_ == 0, "GPT::forward: losses of earlier forwards not taken");
  run_forward(inputs, targets, dloss);
  return static_cast<float>(take_losses());
}

void GPT::run_forward(const int32_t* inputs, const int32_t* targets, float dloss) {
  const int N = B_ * T_, C = C_;
  be_.copy_from_host(inputs_.data(), inputs, sizeof(int32_t) * N);
  be_.copy_from_host(targets_.data(), targets, sizeof(int32_t) * N);
  const float* emb = nullptr;
  if (stage_.first()) {  // held until the LM head when this stage has both
    emb = store_.acquire_params(emb_unit_);
    // Vocab-parallel embedding: each rank looks up its rows (others give 0), rank 0 adds positions.
    auto t = timed(0);
    const float* wpe = cfg_.rope() || tp_rank_ != 0 ? nullptr : tensor(emb, 1);
    be_.embedding_forward(enc_, inputs_.data(), tensor(emb, 0), wpe, N, T_, C, vocab_start_, V_);
    tp_all_reduce(enc_);
    if (!stage_.last()) store_.release_params(emb_unit_);
  }
  for (int l = 0; l < L_; ++l) {
    const int unit = first_block_unit_ + l;
    block_forward(l, layers_[l], acquire_block(l), l + 1 < L_ ? layers_[l + 1].x : xfinal_);
    store_.release_params(unit);
  }
  if (!stage_.last()) return;
  const float* fin = store_.acquire_params(final_unit_);
  const GemmWeight wte = gemm_weight(head_unit_ == emb_unit_ ? emb : fin, store_.acquired_bf16(head_unit_), head_wte_index_);
  {
    auto t = timed(lnf_module_);
    norm_forward(lnf_, lnf_mean_, lnf_rstd_, xfinal_, tensor(fin, lnf_index_),
                 cfg_.rmsnorm() ? nullptr : tensor(fin, lnf_index_ + 1));
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
  lm_head(wte, dwte, dloss);
  store_.release_params(final_unit_);
  if (stage_.first()) store_.release_params(emb_unit_);
}

void GPT::set_module_profile(ModuleProfile* p) {
  Z3D_ASSERT(!p || p->modules.size() == (stage_.last() ? head_module_ + 1 : lnf_module_),
             "module profile does not describe this model's modules");
  mprof_ = p;
}

void GPT::backward() {
  const int N = B_ * T_, C = C_;
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
      be_.zero(dres_.data, dres_.bytes());
      norm_backward(dres_, tensor(dfinal_, lnf_index_), cfg_.rmsnorm() ? nullptr : tensor(dfinal_, lnf_index_ + 1),
                    dbuf_c_, xfinal_, tensor(fin, lnf_index_), lnf_mean_, lnf_rstd_);
    }
    store_.grads_done(final_unit_);
    store_.release_params(final_unit_);
  }

  // linear backward: dx = dy W (overwrites), dW += dy^T x, db += sum dy (unless the caller
  // summed it already: nullptr)
  auto linear_backward = [&](View dx, float* dw, float* db, ConstView dy, ConstView x, GemmWeight w, int in, int out) {
    be_.gemm(false, false, N, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    be_.gemm(true, false, out, in, N, 1.0f, dy, out, GemmWeight(x), in, 1.0f, dw, in);
    if (db) be_.bias_backward(db, dy, N, out);
  };
  for (int l = L_ - 1; l >= 0; --l) {
    const LayerActs& a = layers_[l];
    const int unit = first_block_unit_ + l;
    const BlockParams p = acquire_block(l);
    const LayerTensors<const float>& w = p.w;
    // Regenerate this block's activations from its input (the last block's are still there).
    if (opt_.checkpoint_activations && l + 1 < L_) {
      const auto t0 = std::chrono::steady_clock::now();
      block_forward(l, a, p, l + 1 < L_ ? layers_[l + 1].x : xfinal_);
      be_.synchronize();
      recompute_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const auto g = layer_tensors(store_.acquire_grads(unit), l);
    // MLP: dres holds d x_{l+1}; it flows unchanged into d res2 through the residual.
    // Row-parallel layers need no communication backward; column-parallel ones all-reduce dx.
    {
      auto t = timed(block_module(l, 3));
      linear_backward(dact_, g.fcproj_w, g.fcproj_b, dres_, a.fch_gelu, p.fcproj, F_, C);
      if (cfg_.swiglu()) {
        be_.swiglu_backward(dfch_, a.fch, dact_, N, F_);
        if (g.fc_b) be_.bias_backward(g.fc_b, dfch_, N, F2_);
      } else {
        be_.gelu_backward(dfch_, g.fc_b, a.fch, a.fch_gelu, dfch_, N, F_);  // with fc's bias gradient, in one pass
      }
      linear_backward(dbuf_c_, g.fc_w, nullptr, dfch_, a.ln2, p.fc, C, F2_);
      tp_all_reduce(dbuf_c_);
    }
    {
      auto t = timed(block_module(l, 2));
      norm_backward(dres_, g.ln2_w, g.ln2_b, dbuf_c_, a.res2, w.ln2_w, a.ln2_mean, a.ln2_rstd);
    }
    {  // attention: dres now holds d res2, which flows unchanged into d x_l
      auto t = timed(block_module(l, 1));
      linear_backward(dbuf_c_, g.proj_w, g.proj_b, dres_, a.atty, p.proj, A_, C);
      be_.attention_backward(dqkv_, dbuf_c_, a.atty, a.lse, a.qkv, B_, T_, H_, Hkv_, A_);
      if (cfg_.rope()) be_.rope(dqkv_, rope_cs_.data(), N, T_, H_ + Hkv_, hd_, QKV_, true);  // back to q, k
      linear_backward(dbuf_c_, g.qkv_w, g.qkv_b, dqkv_, a.ln1, p.qkv, C, QKV_);
      tp_all_reduce(dbuf_c_);
    }
    {
      auto t = timed(block_module(l, 0));
      norm_backward(dres_, g.ln1_w, g.ln1_b, dbuf_c_, a.x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
    }
    store_.grads_done(unit);
    store_.release_params(unit);
  }
  if (!stage_.first()) return;  // dres holds d(input) for the previous stage
  if (!stage_.last()) demb = store_.acquire_grads(emb_unit_);  // the lookup's gradient needs no weights
  {
    auto t = timed(0);
    be_.embedding_backward(tensor(demb, 0), cfg_.rope() ? nullptr : tensor(demb, 1), dres_, inputs_.data(), N, T_, C,
                           vocab_start_, V_);
  }
  store_.grads_done(emb_unit_);
}

}  // namespace zero3d
