#include "zero/engine.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "kernels/math/dtype.h"

namespace zero3d {

ZeroEngine::ZeroEngine(Backend& be, ProcessGroup& dp, const ModelConfig& model, const ZeroConfig& zero,
                       const OptimizerConfig& optimizer, Precision precision, int tp_size, int tp_rank,
                       int pp_size, int pp_rank)
    : be_(be), dp_(dp), cfg_(zero), n_layer_(model.n_layer),
      layout_(make_flat_layout(
          gpt_param_table(model, tp_size, tp_rank, pp_size, pp_rank), dp.size(),
          static_cast<size_t>(std::min(zero.reduce_bucket_size, zero.allgather_bucket_size)),
          zero.stage == 3 ? static_cast<size_t>(zero.stage3_param_persistence_threshold) : 0)),
      view_(layout_, zero.stage, dp.rank()) {
  mixed_ = precision != Precision::fp32;
  dt_ = precision == Precision::fp16 ? Dtype16::fp16 : Dtype16::bf16;
  if (mixed_) s16_.emplace(be, dt_);
  const size_t owned_total = cfg_.stage == 0 ? layout_.total : layout_.shard_size;  // optimizer-owned elements

  // Parameters: what every rank keeps between steps.
  const size_t kept = cfg_.stage < 3 ? layout_.total : layout_.shard_size;
  if (mixed_) {
    params16_ = DeviceBuffer<uint16_t>(be, kept);
    resident16_ = DeviceBuffer<uint16_t>(be, cfg_.stage == 3 ? layout_.resident_size : 0);
    master_ = DeviceBuffer<float>(be, owned_total);
  } else if (cfg_.stage < 3) {
    params_ = DeviceBuffer<float>(be, layout_.total);
  } else {
    shard_params_ = DeviceBuffer<float>(be, layout_.shard_size);
    resident_ = DeviceBuffer<float>(be, layout_.resident_size);
  }
  if (cfg_.stage == 3 || mixed_) {  // the model reads gathered (stage 3) or widened (mixed) parameters from slots
    ParamPool::Policy policy;
    policy.gathered = cfg_.stage == 3;
    policy.max_live = static_cast<size_t>(zero.stage3_max_live_parameters);
    policy.prefetch_elems = static_cast<size_t>(zero.stage3_prefetch_bucket_size);
    policy.reuse_distance = static_cast<size_t>(zero.stage3_max_reuse_distance);
    policy.slots16 = mixed_ && cfg_.stage == 3;
    pool_ = std::make_unique<ParamPool>(be, layout_, policy, s16_,
                                        [this](ParamSlot& slot, int unit) { start_gather(slot, unit); });
  }

  sync_ = make_grad_sync(be, dp, layout_, view_, cfg_, s16_);  // the gradients, by stage
  adam_ = std::make_unique<AdamW>(be, optimizer, owned_total);

  // Accounting by role, from what was allocated above.
  mem_.params = params_.bytes() + shard_params_.bytes() + resident_.bytes() + params16_.bytes() + resident16_.bytes();
  mem_.grads = sync_->grad_bytes();
  mem_.optimizer = 2 * adam_->size() * sizeof(float) + master_.bytes();
  mem_.buffers = sync_->buffer_bytes();
  if (pool_) mem_.buffers += pool_->bytes();

  // Optimizer segments: the owned part of each tensor of each bucket, with its decay setting.
  for (const Piece& piece : view_.owned_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t at = view_.offset_in_owned(piece);
    segments_.push_back({owned_params(b) + at, sync_->owned(b) + at, view_.state_base(b) + at, piece.size,
                         layout_.tensors[piece.tensor].decay});
  }
  // The norm counts what a checkpoint saves: every parameter of the grid once.
  for (const Piece& piece : view_.saved_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t flat = layout_.tensors[piece.tensor].offset + piece.begin;
    norm_segments_.push_back(
        {sync_->reduced_slice(b) + (flat - b.offset - layout_.slice(b, dp_.rank()).offset), piece.size});
  }
}

ZeroEngine::~ZeroEngine() = default;

// Where the optimizer finds bucket b's (fp32) parameters on this rank.
float* ZeroEngine::owned_params(const Bucket& b) {
  if (mixed_) return master_.data() + (cfg_.stage == 0 ? b.offset : b.shard_offset);
  return cfg_.stage < 3 ? params_.data() + view_.owned_offset(b) : shard_params_.data() + b.shard_offset;
}

void ZeroEngine::init_weights(uint64_t seed) {
  const int n_layer = n_layer_;
  // The kept parameters: everything (stages 0-2) or this rank's slices (stage 3) ...
  std::vector<float> kept(cfg_.stage < 3 ? layout_.total : layout_.shard_size), resident(layout_.resident_size);
  if (cfg_.stage < 3) {
    gpt_initial_params(layout_, n_layer, seed, 0, layout_.total, kept.data());
  } else {
    for (const Bucket& b : layout_.buckets) {
      const ShardInfo sl = layout_.slice(b, dp_.rank());
      gpt_initial_params(layout_, n_layer, seed, b.offset + sl.offset, b.offset + sl.offset + sl.size,
                         kept.data() + b.shard_offset);
      if (b.persistent)
        gpt_initial_params(layout_, n_layer, seed, b.offset, b.offset + b.size, resident.data() + b.resident_offset);
    }
  }
  if (!mixed_) {
    float* dst = cfg_.stage < 3 ? params_.data() : shard_params_.data();
    be_.copy_from_host(dst, kept.data(), kept.size() * sizeof(float));
    be_.copy_from_host(resident_.data(), resident.data(), resident.size() * sizeof(float));
    return;
  }
  // ... and in mixed precision the fp32 master of the owned ones, the 16-bit rounding of all.
  std::vector<float> master(master_.size());
  if (cfg_.stage == 0 || cfg_.stage == 3) {
    master = kept;  // stage 0 owns everything; stage 3 keeps exactly its slices
  } else {
    for (const Bucket& b : layout_.buckets)
      std::copy_n(kept.begin() + view_.owned_offset(b), view_.owned_size(b), master.begin() + b.shard_offset);
  }
  be_.copy_from_host(master_.data(), master.data(), master.size() * sizeof(float));
  const std::vector<uint16_t> kept16 = s16_->narrow_host(kept), resident16 = s16_->narrow_host(resident);
  be_.copy_from_host(params16_.data(), kept16.data(), kept16.size() * sizeof(uint16_t));
  be_.copy_from_host(resident16_.data(), resident16.data(), resident16.size() * sizeof(uint16_t));
}

// ---- parameters for compute: direct (fp32 stages 0-2) or from the slot pool ----

// Fill slot s with unit's parameters: widen the resident 16-bit weights (mixed stages 0-2), or
// start the all-gathers of the slices (stage 3; into buf16 first in mixed precision).
void ZeroEngine::start_gather(ParamSlot& s, int unit) {
  const Unit& u = layout_.units[unit];
  if (cfg_.stage < 3) {
    s16_->widen(s.buf.data(), params16_.data() + u.offset, u.size);
    return;
  }
  for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
    const Bucket& b = layout_.buckets[i];
    const size_t at = b.offset - u.offset, n = b.size / dp_.size();
    if (!mixed_ && b.persistent)
      be_.copy(s.buf.data() + at, resident_.data() + b.resident_offset, b.size * sizeof(float));
    else if (!mixed_)
      s.ops.push_back(dp_.iall_gather(shard_params_.data() + b.shard_offset, s.buf.data() + at, n));
    else if (b.persistent)
      be_.copy(s.buf16.data() + at, resident16_.data() + b.resident_offset, b.size * sizeof(uint16_t));
    else
      s.ops.push_back(dp_.iall_gather(params16_.data() + b.shard_offset, s.buf16.data() + at, n));
  }
  s.widen_pending = mixed_;
}

const float* ZeroEngine::acquire_params(int unit) {
  return pool_ ? pool_->acquire(unit) : params_.data() + layout_.units[unit].offset;
}

void ZeroEngine::release_params(int unit) {
  if (pool_) pool_->release(unit);
}

// ---- gradients ----

float* ZeroEngine::acquire_grads(int unit) { return sync_->acquire(unit); }
void ZeroEngine::grads_done(int unit) { sync_->done(unit); }
void ZeroEngine::begin_step() { sync_->begin_step(); }
void ZeroEngine::finish_gradients() { sync_->finish(); }

double ZeroEngine::grad_norm_sq() {
  double local = 0;
  for (auto [g, n] : norm_segments_) local += be_.sum_squares(g, n);
  return dp_.all_reduce_sum(local);
}

std::pair<float*, size_t> ZeroEngine::tied_embedding_grad() {
  for (const Bucket& b : layout_.buckets)
    if (b.num_tensors == 1 && layout_.tensors[b.first_tensor].own_bucket) return {sync_->owned(b), view_.owned_size(b)};
  Z3D_ASSERT(false, "tied_embedding_grad on a stage without the tied embedding");
  return {nullptr, 0};
}

void ZeroEngine::scale_grads(float s) {
  for (const Bucket& b : layout_.buckets) be_.scale(sync_->owned(b), s, view_.owned_size(b));
}

void ZeroEngine::optimizer_step(double lr) {
  if (pool_) pool_->invalidate();  // slots hold the old weights; no gather may read a slice mid-update
  adam_->step(segments_, lr);
  round_master();
}

// Mixed precision: the 16-bit weights this rank owns become the rounding of its fp32 master.
void ZeroEngine::round_master() {
  if (!mixed_) return;
  if (cfg_.stage == 0 || cfg_.stage == 3) s16_->narrow(params16_.data(), master_.data(), master_.size());
  else
    for (const Bucket& b : layout_.buckets)
      s16_->narrow(params16_.data() + view_.owned_offset(b), owned_params(b), view_.owned_size(b));
}

void ZeroEngine::gather_updated_params() {
  if (cfg_.stage == 0) return;
  std::vector<PendingOp> ops;
  for (const Bucket& b : layout_.buckets) {
    const size_t n = b.size / dp_.size();
    if (cfg_.stage < 3 && mixed_)
      ops.push_back(dp_.iall_gather(params16_.data() + view_.owned_offset(b), params16_.data() + b.offset, n));
    else if (cfg_.stage < 3)
      ops.push_back(dp_.iall_gather(params_.data() + view_.owned_offset(b), params_.data() + b.offset, n));
    else if (b.persistent && mixed_)
      ops.push_back(dp_.iall_gather(params16_.data() + b.shard_offset, resident16_.data() + b.resident_offset, n));
    else if (b.persistent)
      ops.push_back(dp_.iall_gather(shard_params_.data() + b.shard_offset, resident_.data() + b.resident_offset, n));
  }
  for (auto& op : ops) op.wait();
}

// ---- checkpoints ----

float* ZeroEngine::state_of(State kind, const Piece& p) {
  const Bucket& b = view_.bucket_of(p.tensor);
  const size_t at = view_.offset_in_owned(p);
  return kind == State::exp_avg      ? adam_->exp_avg() + view_.state_base(b) + at
         : kind == State::exp_avg_sq ? adam_->exp_avg_sq() + view_.state_base(b) + at
                                     : owned_params(b) + at;
}

void ZeroEngine::read_state(State kind, const Piece& p, float* out) const {
  be_.copy_to_host(out, const_cast<ZeroEngine*>(this)->state_of(kind, p), p.size * sizeof(float));
}

void ZeroEngine::write_state(State kind, const Piece& p, const float* in) {
  be_.copy_from_host(state_of(kind, p), in, p.size * sizeof(float));
}

void ZeroEngine::read_weights16(const Piece& p, uint16_t* out) const {
  Z3D_ASSERT(mixed_, "read_weights16 needs mixed precision");
  const Bucket& b = view_.bucket_of(p.tensor);
  const size_t in = view_.offset_in_owned(p);
  // Stages 0-2 keep every 16-bit weight at its flat offset; stage 3 its slices in shard order.
  const size_t at = cfg_.stage < 3 ? view_.owned_offset(b) + in : b.shard_offset + in;
  be_.copy_to_host(out, params16_.data() + at, p.size * sizeof(uint16_t));
}

void ZeroEngine::finish_load(int64_t optimizer_steps) {
  adam_->set_step_count(optimizer_steps);
  if (pool_) pool_->invalidate();
  round_master();  // as after every step
  gather_updated_params();
  be_.synchronize();
}

// ---- safety nets ----

void ZeroEngine::check_replicas_consistent(int64_t step) {
  // Replicated: every tensor in stages 0-2; the persistent buckets' tensors in stage 3. Hash the
  // stored bytes (16-bit in mixed precision).
  const size_t elem = mixed_ ? sizeof(uint16_t) : sizeof(float);
  const void* src = cfg_.stage < 3 ? (mixed_ ? static_cast<const void*>(params16_.data()) : params_.data())
                                   : (mixed_ ? static_cast<const void*>(resident16_.data()) : resident_.data());
  const size_t count = cfg_.stage < 3 ? layout_.total : layout_.resident_size;
  std::vector<unsigned char> host(count * elem);
  be_.copy_to_host(host.data(), src, host.size());
  std::vector<std::pair<size_t, size_t>> tensors;  // (tensor index, element offset in host)
  for (const Bucket& b : layout_.buckets)
    if (cfg_.stage < 3 || b.persistent)
      for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t)
        tensors.push_back({static_cast<size_t>(t), cfg_.stage < 3 ? layout_.tensors[t].offset
                                                                  : b.resident_offset + (layout_.tensors[t].offset - b.offset)});
  std::vector<uint64_t> mine;
  for (auto [index, at] : tensors) {  // FNV-1a over the tensor's bytes
    uint64_t h = 1469598103934665603ull;
    for (size_t i = at * elem; i < (at + layout_.tensors[index].size) * elem; ++i) h = (h ^ host[i]) * 1099511628211ull;
    mine.push_back(h);
  }
  std::vector<uint64_t> all;
  dp_.all_gather_u64(mine, all);
  const size_t n = mine.size();
  for (size_t t = 0; t < n; ++t)
    for (int r = 1; r < dp_.size(); ++r)
      if (all[r * n + t] != all[t])
        throw RunError(strprintf("consistency check at step %lld: parameter '%s' differs between data-parallel ranks "
                                 "0 and %d of the dp group (replicas must be bitwise identical; a rank computed a "
                                 "different update or its memory was corrupted)",
                                 static_cast<long long>(step), layout_.tensors[tensors[t].first].name.c_str(), r),
                       kExitInconsistent);
}

void ZeroEngine::inject_inf_gradient() { sync_->inject_inf(); }

void ZeroEngine::perturb_replica() {
  // Flip the lowest bit of the first replicated element.
  void* p = cfg_.stage < 3 ? (mixed_ ? static_cast<void*>(params16_.data()) : params_.data())
                           : (mixed_ ? static_cast<void*>(resident16_.data()) : resident_.data());
  if (cfg_.stage == 3 && layout_.resident_size == 0) return;
  unsigned char byte = 0;
  be_.copy_to_host(&byte, p, 1);
  byte ^= 1;
  be_.copy_from_host(p, &byte, 1);
}

}  // namespace zero3d
