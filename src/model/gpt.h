// model/gpt.h: a decoder-only transformer with hand-written forward and backward on a Backend,
// its architecture as data (config/config.h's ModelConfig): GPT-2 (token + learned position
// embeddings, pre-LayerNorm blocks with causal multi-head self-attention and a 4x GELU MLP, final
// LayerNorm, LM head tied to the token embedding) or the Llama family (RMSNorm, rotary positions,
// grouped-query attention, SwiGLU, no biases, an LM head of its own), and mixes of the two;
// cross-entropy loss.
//
// Parameters live in ONE flat buffer in the order of param_table() (embeddings, then layer by
// layer, then the final LayerNorm), gradients in a second buffer of the same layout, so ZeRO can
// shard both as flat ranges. Linear weights are (out, in) as in PyTorch: y = x W^T + b.
// Activations for one micro-batch (B x T) are allocated once in the constructor; forward() keeps
// what backward() needs. backward() accumulates (+=) into the gradient buffer.
// Activations and their gradients are stored in one element type, chosen at construction
// (GPTOptions::activations): fp32, or bf16 with fp32 math (kernels/tensor.h); the norms'
// statistics, attention's log-sum-exps and the losses are fp32 either way.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/backend.h"
#include "model/module_profile.h"
#include "model/param_info.h"
#include "model/param_table.h"

namespace zero3d {
class ParamStore;
class ProcessGroup;
struct FlatLayout;
}

namespace zero3d {

struct GPTOptions {
  // Activation checkpointing: keep only each block's input; recompute the block's forward just
  // before its backward (one set of block activations instead of n_layer; same results bitwise).
  bool checkpoint_activations = false;
  // The element type of the activations and their gradients (bf16: mixed precision as DeepSpeed's
  // bf16 and llm.c run it; the backend's GEMMs then read them as they are).
  DType activations = DType::f32;
  // How many forwards' losses may wait on the device for take_losses() (a step's micro-batches
  // per model: the step reads them once, at its end, not once per micro-batch).
  int losses_kept = 1;
  // The LM head's row blocks: at most this many bytes of logits exist at a time (at least 256 rows
  // a block); 0: a micro-batch's rows in one GEMM.
  size_t head_block_bytes = size_t{128} << 20;
};

// The model options a run's config asks for (activation_checkpointing.enabled,
// compute.activations, compute.lm_head_block_mib), for a model on a GPU (`gpu`) or on the host,
// one of `slots` models that run a step's micro-batches in turn (1F1B's in flight; each keeps its
// share of the losses).
// UserError for bf16 activations without bf16.enabled.
GPTOptions gpt_options(const Config& c, bool gpu, int slots = 1);

class GPT {
 public:
  // `store` holds this rank's parameters and gradients in the layout of gpt_param_table(config,
  // tp->size(), tp->rank(), stage.size, stage.rank); `tp` is the tensor-parallel group (nullptr: none).
  GPT(Backend& backend, const ModelConfig& config, int micro_batch, ParamStore& store, GPTOptions options = {},
      ProcessGroup* tp = nullptr, PipelineStage stage = {0, 1, 0, -1});

  const ModelConfig& config() const { return cfg_; }
  size_t activation_bytes() const { return activation_bytes_; }  // activations + backward scratch
  // Seconds spent recomputing block forwards since the last call (activation checkpointing).
  double take_recompute_seconds() {
    double s = recompute_s_;
    recompute_s_ = 0;
    return s;
  }

  // Forward on B x T tokens (host arrays). With dloss > 0 the logits' gradient (scaled by dloss
  // per token) is prepared for backward(). A stage after the first reads its input from
  // input_activation(), where the pipeline put the previous stage's output_activation(). The
  // losses stay on the device (nothing waits for the GPU) until take_losses(), which at most
  // GPTOptions::losses_kept forwards may precede.
  void run_forward(const int32_t* inputs, const int32_t* targets, float dloss);
  // The mean cross-entropy over the B*T tokens of each forward since the last call, summed: one
  // copy from the device (on the last pipeline stage; 0 elsewhere).
  double take_losses();
  // run_forward, then its mean loss (no other forward's pending).
  float forward(const int32_t* inputs, const int32_t* targets, float dloss);
  // A stage before the last expects d(output) in output_gradient() first; a stage after the first
  // leaves d(input) in input_gradient() (the same buffer) for the previous stage.
  void backward();
  // The pipeline's buffers, B*T rows of d_model in the activations' type (sent as bytes).
  View input_activation() { return enc_; }
  ConstView output_activation() const { return xfinal_; }
  View output_gradient() { return dres_; }
  ConstView input_gradient() const { return dres_; }
  // The flops profiler's timers (nullptr: none): `p->modules` must be this rank's gpt_modules().
  void set_module_profile(ModuleProfile* p);

 private:
  struct LayerActs {  // fch: the MLP's first layer out (pre-activation); fch_gelu: its activation
    View x, ln1, qkv, atty, res2, ln2, fch, fch_gelu;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;  // fp32 statistics
  };
  // A block's tensors; those the architecture leaves out (biases, a norm's bias) are nullptr.
  template <typename F>
  struct LayerTensors {
    F *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
  };
  // Pointer to tensor i inside its unit's buffer `unit_base`.
  template <typename F>
  F* tensor(F* unit_base, size_t i) const;
  template <typename F>
  LayerTensors<F> layer_tensors(F* unit_base, int l) const;
  // Tensor i of an acquired unit as a GEMM weight: fp32 (unless the store keeps gemm_only tensors
  // in bf16 only) and its bf16 copy in bf16 runs (unit_base16: the store's acquired_bf16).
  GemmWeight gemm_weight(const float* unit_base, const uint16_t* unit_base16, size_t i) const;
  // Block l's parameters as the store lends them (its unit acquired): every tensor in fp32 (the
  // matrices' fp32 places unwritten where the store keeps them in bf16 only), and the four
  // matrices as GEMM weights.
  struct BlockParams {
    LayerTensors<const float> w;
    GemmWeight qkv, proj, fc, fcproj;
  };
  BlockParams acquire_block(int l);
  // The constructor's phases, in this order.
  void locate_units_and_modules();
  void plan_activations();       // acts_: every activation, one allocation
  void plan_backward_scratch();  // scratch_, the token buffers, the cross-entropy's statistics
  void block_forward(int l, const LayerActs& a, const BlockParams& p, View x_next);
  // LayerNorm or RMSNorm (mean unused by RMSNorm; b, db nullptr there).
  void norm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b);
  void norm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w, const float* mean,
                     const float* rstd);
  void tp_all_reduce(View x);  // sum over the tensor-parallel group (no-op without)
  // Of one row block of (vocab-parallel) logits: the losses (statistics) of forward k in its place.
  void crossentropy(int k, int r0, int rows, float dloss);
  void lm_head(GemmWeight wte, float* dwte, float dloss);
  // Times the enclosing scope as module `index` (see gpt_modules' order); backward while in backward().
  ModuleProfile::Scope timed(size_t index) { return ModuleProfile::Scope(mprof_, be_, index, in_backward_); }
  size_t block_module(int l, int part) const { return block_module0_ + 4 * static_cast<size_t>(l) + part; }

  Backend& be_;
  ModelConfig cfg_;
  GPTOptions opt_;
  ProcessGroup* tp_;
  int tp_size_, tp_rank_;
  PipelineStage stage_;
  // Units and tensor indices of this stage's share of the model (see gpt_param_table).
  int emb_unit_ = -1, first_block_unit_ = 0, final_unit_ = -1, head_unit_ = -1;
  size_t block_tensor0_ = 0, lnf_index_ = 0, head_wte_index_ = 0;
  // B, T, C as usual; V, H, A (= C/tp: attention width), F (the MLP's hidden width / tp), Hkv
  // (key/value heads) are this rank's shares; QKV: the width of a packed [q | k | v] row, F2 of the
  // MLP's first layer (2F with SwiGLU's [gate | up]).
  int B_, T_, C_, V_, L_, H_, A_, F_, vocab_start_, Hkv_, hd_, QKV_, F2_;
  int logit_cols_;  // this rank's logits: its V_ embedding rows less the padding (model.make_vocab_size_divisible_by)
  std::vector<int> role_;  // LayerParam -> index in a block's tensors, -1: absent
  int block_size_ = 0;     // tensors per block
  ParamStore& store_;
  const FlatLayout& layout_;
  DType act_;                    // the activations' element type (GPTOptions::activations)
  DeviceBuffer<char> acts_;      // all activations and statistics, one allocation
  DeviceBuffer<char> scratch_;   // backward scratch, one allocation
  DeviceBuffer<int32_t> inputs_, targets_;
  DeviceBuffer<float> ce_;  // vocab-parallel cross-entropy: row max, sum of exp, target logit (3 N per forward kept)
  DeviceBuffer<float> rope_cs_;  // RoPE's (cos, sin) table, math::rope_table
  int head_rows_ = 0;       // rows per LM-head block (logits_ holds one block)
  std::vector<LayerActs> layers_;
  View enc_, lnf_, xfinal_;
  View logits_;  // one row block of the LM head's, rows of V_ (the padded vocabulary share)
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *losses_ = nullptr;  // losses_: N per forward kept
  int pending_ = 0;  // forwards whose losses wait in losses_ / ce_
  View dres_, dbuf_c_, dqkv_, dfch_, dact_;  // backward's, in the activations' type
  size_t activation_bytes_ = 0;
  std::vector<float> host_losses_, host_ce_;
  double recompute_s_ = 0;
  bool head_grads_done_ = false;  // forward ran the head's backward; backward() owes the rest
  float *dfinal_ = nullptr, *demb_ = nullptr;  // the gradients forward() took for the head
  ModuleProfile* mprof_ = nullptr;
  bool in_backward_ = false;
  size_t block_module0_ = 0, lnf_module_ = 0, head_module_ = 0;  // indices into gpt_modules()
};

}  // namespace zero3d
