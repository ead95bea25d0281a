// zero/engine.h: ZeRO stages 0-3 over one data-parallel group (DeepSpeed semantics), in fp32 or
// mixed precision (fp16/bf16 model weights and gradients, fp32 master weights and Adam state).
//
// Stages 0-2 keep the full parameters on every rank in the flat layout. What is sharded, per stage:
//   stage 0: nothing. Gradients are all-reduced per bucket at the accumulation boundary; every
//            rank runs the whole optimizer.
//   stage 1: Adam m and v for this rank's slice of every bucket only. Full gradients accumulate
//            over the micro-batches, are reduce-scattered per bucket at the boundary; each rank
//            updates its slice and the buckets are all-gathered back in place.
//   stage 2: as stage 1, and gradients too: backward hands each unit's gradient over as soon as
//            it is complete (grads_done); its buckets are reduce-scattered into the rank's shard
//            gradient accumulator and the unit's buffer is reused. With overlap_comm the
//            reductions are non-blocking and complete while backward goes on; without it each
//            reduction is waited for at once. Only the tied embedding's buffer and two rotating
//            block-sized buffers ever hold full gradients.
//   stage 3: as stage 2, and the parameters too: a rank keeps only its slice of every bucket
//            (the optimizer updates it in place, nothing is all-gathered after the step).
//            acquire_params(u) all-gathers unit u into a slot of a pool allocated once (the
//            first and last unit have their own slots; the blocks share enough slots for
//            stage3_max_live_parameters elements, at least two). The next unit of the access trace
//            is prefetched when it is at most stage3_prefetch_bucket_size elements; a released unit
//            stays gathered if its next use is fewer than stage3_max_reuse_distance elements
//            ahead. Tensors below stage3_param_persistence_threshold form buckets of their own
//            that every rank keeps whole (all-gathered after each step instead of on use).
// Mixed precision: the model's weights and gradients are stored in 16 bits (params 2 Psi, grads
// 2 Psi, each divided by N where the stage shards it) and the optimizer keeps fp32 master weights
// beside m and v (12 Psi, / N from stage 1). Compute is fp32: a unit's 16-bit weights are widened
// into a slot of the same pool ZeRO-3 uses (with bf16 GEMMs on bf16 weights, all but the matrices:
// the GEMMs read those as kept, acquired_bf16), and backward's fp32 unit gradient is rounded into the
// 16-bit gradient (accumulated there over micro-batches, reduced in 16 bits). At the step the
// rank's 16-bit gradient slices are widened into one fp32 buffer for the norm and Adam, and the
// updated master is rounded back into the 16-bit weights.
// reduce_scatter=false replaces each reduce-scatter by an all-reduce that keeps the slice
// (DeepSpeed's option, and faster than OpenMPI's reduce-scatter on some machines).
// The invariant every stage keeps: all ranks of the group hold bitwise-identical parameters after
// each step, and the gradient norm counts every parameter once (each rank sums its own slices).
//
// Offload (DeepSpeed's offload_optimizer / offload_param): the optimizer state (master, m, v) of
// stages 1-3 in a swap file streamed through memory per sub-group, and stage 3's parameter slices
// in a swap file read at gather time (zero/optimizer_state.h, zero/param_storage.h). Every
// element's update is the same arithmetic wherever it lives, so offloaded runs are bitwise equal
// to in-memory ones. "cpu" on the host backend changes nothing: its memory is host memory. On a
// device backend, offload_optimizer (cpu or nvme) moves the state to host memory and the update
// to the CPU: gradients come down and weights go up span by span (zero/host_link.h).
//
// The engine composes parts chosen once at construction, each with one concern: the shard view
// (what this rank owns and saves), the 16-bit storage (none in fp32), the parameter storage (full
// or sharded; kept in memory or swapped), the optimizer state (in memory or swapped), the slot
// pool (stage 3 or mixed), the gradient sync (at the boundary, or per unit), and AdamW over the
// owned segments. Only the constructor looks at the stage.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "config/config.h"
#include "model/param_store.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "zero/grad_sync.h"
#include "zero/host_link.h"
#include "zero/optimizer_state.h"
#include "zero/param_pool.h"
#include "zero/param_storage.h"
#include "zero/shard_view.h"
#include "zero/storage16.h"

namespace zero3d {

struct MemoryAccount {
  size_t params = 0, grads = 0, optimizer = 0, buffers = 0;  // bytes in this rank's memory
  size_t swapped = 0;  // bytes of model state in swap files (offload to nvme), not in memory
  // Offload from a device backend: bytes of optimizer state and its buffers in host memory
  // (not counted above, which is the device's).
  size_t host = 0;
  size_t total() const { return params + grads + optimizer + buffers; }
};

// The swap files of offload on nvme ("" = that state stays in memory) and how to drive them.
struct SwapFiles {
  std::string optimizer, param;
  AioConfig aio;
  bool sizing = false;  // zero3d plan: no files, the transfers only counted (SwapFile::Options::sizing)
  SwapFile::Options options() const { return {static_cast<size_t>(aio.block_size), aio.thread_count, sizing}; }
};

// What swapping cost since the last take_swap_io(): time the training thread waited for swap
// reads and writes (exposed), the I/O threads' busy time, and the bytes moved; and, with the
// optimizer offloaded from a device, the same for the copies between device and host.
struct SwapIo {
  double wait_s = 0, busy_s = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t param_bytes_read = 0, param_bytes_written = 0;  // of those, the parameters' swap file's
  double copy_wait_s = 0, copy_s = 0;
  uint64_t bytes_down = 0, bytes_up = 0;
};

class ZeroEngine final : public ParamStore {
 public:
  // precision: fp32, or fp16/bf16 (mixed). The engine holds this tensor-parallel rank's share of the
  // model (gpt_param_table(model, tp_size, tp_rank)).
  ZeroEngine(Backend& be, ProcessGroup& dp, const ModelConfig& model, const ZeroConfig& zero,
             const OptimizerConfig& optimizer, Precision precision = Precision::fp32, int tp_size = 1,
             int tp_rank = 0, int pp_size = 1, int pp_rank = 0, const SwapFiles& swap = {});
  ~ZeroEngine() override;

  // ParamStore
  const FlatLayout& layout() const override { return layout_; }
  const float* acquire_params(int unit) override;
  void release_params(int unit) override;
  const uint16_t* acquired_bf16(int unit) const override;
  bool fp32_gemm_weights() const override { return fp32_gemm_weights_; }
  float* acquire_grads(int unit) override;
  void grads_done(int unit) override;

  void init_weights(uint64_t seed);
  // Step protocol: begin_step, then per micro-batch forward/backward, then finish_gradients,
  // then the norm/clip/step calls. micro_batches: how many backward passes this step runs.
  void begin_step(int micro_batches);
  void finish_gradients();
  // Squared gradient norm over the dp group, every parameter once; tensors replicated across tp
  // count on tp rank 0 only, so the caller's sum over the tp group counts them once too.
  // inf/nan = overflow.
  double grad_norm_sq();
  void scale_grads(float s);       // this rank's optimizer-owned gradients
  // With pp > 1, the first and last stage's optimizer-owned gradient of wte (after
  // finish_gradients), laid out alike on both, to be summed over the embedding group.
  std::pair<float*, size_t> tied_embedding_grad();
  bool has_tied_embedding() const;  // this stage holds a copy of the tied embedding (pp > 1, tied LM head)
  void optimizer_step(double lr);   // Adam on this rank's optimizer-owned parameters
  void gather_updated_params();     // stages 1-2: all-gather the buckets; stage 3: persistent ones
  int64_t optimizer_steps() const { return adam_->step_count(); }

  // Hash every replicated parameter tensor and compare across the dp group; throws RunError
  // (kExitInconsistent) naming the first tensor whose replicas differ. Collective over dp.
  void check_replicas_consistent(int64_t step);

  MemoryAccount memory() const { return mem_; }
  SwapIo take_swap_io();
  // Of each step's optimizer swap reads, the bytes read ahead for the next step as its stream ends.
  uint64_t swap_read_ahead_bytes() const { return state_->read_ahead_bytes(); }
  int stage() const { return cfg_.stage; }
  bool mixed() const { return mixed_; }
  Dtype16 dtype16() const { return dt_; }

  // ---- checkpoints: this rank's state as pieces of its tensors (ckpt/checkpoint.h) ----
  using Piece = zero3d::Piece;  // local elements [begin, begin + size) of layout().tensors[tensor]
  enum class State { master, exp_avg, exp_avg_sq };  // fp32; the master is the weights in fp32 runs
  // What this rank saves and loads, as pieces with their place in the logical tensors and their
  // checksum basis (zero/shard_view.h: saved = its dp slice of every bucket without tp replicas
  // off tp rank 0 and the tied embedding's copy; loaded = the optimizer state it holds).
  const std::vector<CheckpointPiece>& save_pieces() const { return view_.save_pieces(); }
  const std::vector<CheckpointPiece>& load_pieces() const { return view_.load_pieces(); }
  void read_state(State kind, const Piece& p, float* out);        // p inside an owned piece
  void read_weights16(const Piece& p, uint16_t* out) const;       // mixed: the 16-bit weights of a saved piece
  void write_state(State kind, const Piece& p, const float* in);  // p inside an owned piece
  // After every owned piece was written: rebuild the weights the model reads from the master
  // (round to 16 bits in mixed precision, all-gather what the stage keeps whole) and set the
  // optimizer's step count. Collective over dp.
  void finish_load(int64_t optimizer_steps);

 private:
  friend struct EngineFaults;  // zero/engine_faults.h: fault injection reaches the parts, not the interface
  // One contiguous run of owned parameters with one decay setting: where Adam reads and writes
  // them when they are the kept fp32 parameters (else nullptr: the master is in the state), the
  // reduced gradient, and the run's place in the optimizer state.
  struct Segment {
    float* params = nullptr;
    const float* grads = nullptr;
    size_t state_offset = 0, size = 0;
    bool decay = true;
    uint16_t* weights16 = nullptr;  // mixed: the kept weights the update rounds into (ParamStorage::owned16)
  };
  void update(const OptimizerState::Span& s);  // Adam on one span of the state
  // Where an owned piece's master lives when it is the kept parameters (nullptr: in the state).
  float* kept_master(const Piece& p);

  Backend& be_;
  ProcessGroup& dp_;
  ZeroConfig cfg_;
  int n_layer_;          // the whole model's (the init scales residual projections by it)
  bool mixed_ = false;   // 16-bit weights and gradients
  Dtype16 dt_ = Dtype16::bf16;
  FlatLayout layout_;
  ShardView view_;                        // what this rank owns and saves of layout_
  std::optional<Storage16> s16_;          // mixed precision: the 16-bit storage; none in fp32
  std::unique_ptr<HostLink> link_;        // optimizer offload from a device: the CPU side (zero/host_link.h)
  std::unique_ptr<OptimizerState> state_; // master, m, v of the owned elements (zero/optimizer_state.h)
  std::unique_ptr<ParamStorage> params_;  // what this rank keeps of the weights (zero/param_storage.h)
  std::unique_ptr<ParamPool> pool_;       // stage 3 or mixed: the slots the model reads (filled from params_)
  bool fp32_gemm_weights_ = true;  // the slots hold the gemm_only tensors in fp32 too (ParamStore)
  bool fused16_ = false;  // every segment's update writes its 16-bit weights itself (no take_updated)
  std::unique_ptr<GradSync> sync_;        // the gradients: accumulation and reduction (zero/grad_sync.h)
  std::unique_ptr<AdamW> adam_;
  std::vector<Segment> segments_;  // in state order
  std::vector<AdamRun> runs_;      // update()'s, kept to reuse its memory
  std::vector<std::pair<const float*, size_t>> norm_segments_;  // what this rank counts in the norm
  MemoryAccount mem_;
};

}  // namespace zero3d
