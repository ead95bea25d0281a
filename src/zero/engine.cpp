#include "zero/engine.h"

#include <algorithm>

#include "core/check.h"

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

  // The parts, chosen once by stage and precision.
  params_ = make_param_storage(be, dp, layout_, view_, cfg_.stage, s16_);  // what a rank keeps
  if (cfg_.stage == 3 || mixed_) {  // the model reads gathered (stage 3) or widened (mixed) parameters from slots
    ParamPool::Policy policy;
    policy.gathered = cfg_.stage == 3;
    policy.max_live = static_cast<size_t>(zero.stage3_max_live_parameters);
    policy.prefetch_elems = static_cast<size_t>(zero.stage3_prefetch_bucket_size);
    policy.reuse_distance = static_cast<size_t>(zero.stage3_max_reuse_distance);
    policy.slots16 = mixed_ && cfg_.stage == 3;
    pool_ = std::make_unique<ParamPool>(be, layout_, policy, s16_,
                                        [this](ParamSlot& slot, int unit) { params_->fill(slot, unit); });
  }

  sync_ = make_grad_sync(be, dp, layout_, view_, cfg_, s16_);  // the gradients, by stage
  adam_ = std::make_unique<AdamW>(be, optimizer, owned_total);

  // Accounting by role, from what was allocated above.
  mem_.params = params_->param_bytes();
  mem_.grads = sync_->grad_bytes();
  mem_.optimizer = 2 * adam_->size() * sizeof(float) + params_->master_bytes();
  mem_.buffers = sync_->buffer_bytes();
  if (pool_) mem_.buffers += pool_->bytes();

  // Optimizer segments: the owned part of each tensor of each bucket, with its decay setting.
  for (const Piece& piece : view_.owned_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t at = view_.offset_in_owned(piece);
    segments_.push_back({params_->owned(b) + at, sync_->owned(b) + at, view_.state_base(b) + at, piece.size,
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

void ZeroEngine::init_weights(uint64_t seed) { params_->init(seed, n_layer_); }

const float* ZeroEngine::acquire_params(int unit) {
  return pool_ ? pool_->acquire(unit) : params_->resident_unit(unit);
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
  params_->round_master();
}

void ZeroEngine::gather_updated_params() { params_->gather_updated(); }

// ---- checkpoints ----

float* ZeroEngine::state_of(State kind, const Piece& p) {
  const Bucket& b = view_.bucket_of(p.tensor);
  const size_t at = view_.offset_in_owned(p);
  return kind == State::exp_avg      ? adam_->exp_avg() + view_.state_base(b) + at
         : kind == State::exp_avg_sq ? adam_->exp_avg_sq() + view_.state_base(b) + at
                                     : params_->owned(b) + at;
}

void ZeroEngine::read_state(State kind, const Piece& p, float* out) const {
  be_.copy_to_host(out, const_cast<ZeroEngine*>(this)->state_of(kind, p), p.size * sizeof(float));
}

void ZeroEngine::write_state(State kind, const Piece& p, const float* in) {
  be_.copy_from_host(state_of(kind, p), in, p.size * sizeof(float));
}

void ZeroEngine::read_weights16(const Piece& p, uint16_t* out) const {
  Z3D_ASSERT(mixed_, "read_weights16 needs mixed precision");
  params_->read_weights16(p, out);
}

void ZeroEngine::finish_load(int64_t optimizer_steps) {
  adam_->set_step_count(optimizer_steps);
  if (pool_) pool_->invalidate();
  params_->round_master();  // as after every step
  gather_updated_params();
  be_.synchronize();
}

// ---- safety nets ----

void ZeroEngine::check_replicas_consistent(int64_t step) {
  // Hash the replicated parameters as stored (16-bit in mixed precision), tensor by tensor.
  const ParamStorage::Replicated rep = params_->replicated();
  const size_t elem = rep.elem_bytes;
  std::vector<unsigned char> host(rep.count * elem);
  be_.copy_to_host(host.data(), rep.data, host.size());
  const auto& tensors = rep.tensors;  // (tensor index, element offset in host)
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

}  // namespace zero3d
