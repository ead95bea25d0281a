#include "zero/engine.h"

#include <algorithm>

#include "core/check.h"
#include "core/hash.h"

namespace zero3d {

namespace {
constexpr int kLinkDepth = 3;  // offload from a device: gradient and weight buffers each way
}  // namespace

ZeroEngine::ZeroEngine(Backend& be, ProcessGroup& dp, const ModelConfig& model, const ZeroConfig& zero,
                       const OptimizerConfig& optimizer, Precision precision, int tp_size, int tp_rank,
                       int pp_size, int pp_rank, const SwapFiles& swap)
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

  // The parts, chosen once by stage, precision and offload.
  if (be.memory_kind() == MemKind::device && cfg_.offload_param.device != OffloadDevice::none &&
      cfg_.offload_optimizer.device == OffloadDevice::none)
    throw UserError("zero_optimization.offload_param on a device backend needs offload_optimizer too (cpu or nvme): "
                    "the offloaded slices are rounded from master weights that live with the optimizer state on "
                    "the host");
  const bool params_swapped = cfg_.stage == 3 && !swap.param.empty();
  // Optimizer offload from a device: the state in host memory, Adam on the CPU (zero/host_link.h).
  if (be.memory_kind() == MemKind::device && cfg_.offload_optimizer.device != OffloadDevice::none)
    link_ = std::make_unique<HostLink>(be);
  try {  // a swap file that cannot be made (no space, no permission) is the user's to fix
    state_ = std::make_unique<OptimizerState>(link_ ? link_->cpu() : be, owned_total,
                                              mixed_ || params_swapped || link_, cfg_.offload_optimizer,
                                              cfg_.sub_group_size, swap.options(), swap.optimizer, link_ != nullptr);
    if (link_) link_->reserve(state_->spans(), kLinkDepth);
    params_ = make_param_storage(be, dp, layout_, view_, cfg_, s16_, *state_, params_swapped ? swap.param : "",
                                 swap.options(), link_.get());  // what a rank keeps
  } catch (const IoError& e) {
    throw UserError(strprintf("offload to nvme: %s", e.what()));
  }
  if (cfg_.stage == 3 || mixed_) {  // the model reads gathered (stage 3) or widened (mixed) parameters from slots
    ParamPool::Policy policy;
    policy.gathered = cfg_.stage == 3;
    policy.max_live = static_cast<size_t>(zero.stage3_max_live_parameters);
    policy.prefetch_elems = static_cast<size_t>(zero.stage3_prefetch_bucket_size);
    policy.reuse_distance = static_cast<size_t>(zero.stage3_max_reuse_distance);
    policy.slots16 = mixed_ && cfg_.stage == 3;
    // bf16 GEMMs on bf16 weights take the matrices' bf16 copies: those are never widened.
    fp32_gemm_weights_ = !(mixed_ && dt_ == Dtype16::bf16 && be.bf16_gemm());
    policy.widen_gemm_only = fp32_gemm_weights_;
    pool_ = std::make_unique<ParamPool>(be, layout_, policy, s16_,
                                        [this](ParamSlot& slot, int unit) { params_->fill(slot, unit); });
  }

  sync_ = make_grad_sync(be, dp, layout_, view_, cfg_, s16_);  // the gradients, by stage
  adam_ = std::make_unique<AdamW>(link_ ? link_->cpu() : be, optimizer);

  // Accounting by role, from what was allocated above.
  mem_.params = params_->param_bytes();
  mem_.grads = sync_->grad_bytes();
  mem_.buffers = sync_->buffer_bytes();
  if (link_) {  // the state and its stream buffers are in host memory, beside the link's
    mem_.host = state_->resident_bytes() + link_->buffer_bytes() + params_->host_bytes();
  } else {
    mem_.optimizer = state_->resident_bytes() - state_->buffer_bytes();
    mem_.buffers += state_->buffer_bytes();
  }
  if (pool_) mem_.buffers += pool_->bytes();
  mem_.swapped = state_->swapped_bytes() + params_->swapped_bytes();

  // Optimizer segments: the owned part of each tensor of each bucket, with its decay setting.
  for (const Piece& piece : view_.owned_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t at = view_.offset_in_owned(piece);
    float* kept = params_->owned(b);
    uint16_t* kept16 = params_->owned16(b);
    segments_.push_back({kept ? kept + at : nullptr, sync_->owned(b) + at, view_.state_base(b) + at, piece.size,
                         layout_.tensors[piece.tensor].decay, kept16 ? kept16 + at : nullptr});
  }
  fused16_ = !segments_.empty() &&
             std::all_of(segments_.begin(), segments_.end(), [](const Segment& g) { return g.weights16 != nullptr; });
  if (link_) {  // where each span's gradient comes down from
    std::vector<HostLink::Grads> grads;
    for (const Segment& g : segments_) grads.push_back({g.state_offset, g.size, g.grads});
    link_->set_gradients(std::move(grads));
  }
  // The norm counts what a checkpoint saves: every parameter of the grid once.
  for (const Piece& piece : view_.saved_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t flat = layout_.tensors[piece.tensor].offset + piece.begin;
    norm_segments_.push_back(
        {sync_->owned(b) + (flat - view_.owned_offset(b)), piece.size});
  }
}

ZeroEngine::~ZeroEngine() = default;

void ZeroEngine::init_weights(uint64_t seed) {
  params_->init(seed, n_layer_);
  if (link_) link_->finish();
}

const float* ZeroEngine::acquire_params(int unit) {
  return pool_ ? pool_->acquire(unit) : params_->resident_unit(unit);
}

const uint16_t* ZeroEngine::acquired_bf16(int unit) const {
  return s16_ && s16_->type() == Dtype16::bf16 ? pool_->held16(unit) : nullptr;
}

void ZeroEngine::release_params(int unit) {
  if (pool_) pool_->release(unit);
}

// ---- gradients ----

float* ZeroEngine::acquire_grads(int unit) { return sync_->acquire(unit); }
void ZeroEngine::grads_done(int unit) { sync_->done(unit); }
void ZeroEngine::begin_step(int micro_batches) { sync_->begin_step(micro_batches); }
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

bool ZeroEngine::has_tied_embedding() const {
  for (const ParamInfo& t : layout_.tensors)
    if (t.own_bucket) return true;
  return false;
}

void ZeroEngine::scale_grads(float s) {
  for (const Bucket& b : layout_.buckets) be_.scale(sync_->owned(b), s, view_.owned_size(b));
}

void ZeroEngine::optimizer_step(double lr) {
  if (pool_) pool_->invalidate();  // slots hold the old weights; no gather may read a slice mid-update
  adam_->begin_step(lr);
  if (link_) link_->begin();  // the first gradients start coming down
  state_->stream([this](const OptimizerState::Span& s) { update(s); });
  if (link_) link_->finish();  // the last weights are up
}

// Adam on the segments' parts inside the span, then the updated master into the weights: in the
// update's own pass where the weights allow it (fused16_), else by take_updated. With the state in
// host memory the span's gradient comes down through the link first.
void ZeroEngine::update(const OptimizerState::Span& s) {
  const float* host_grads = link_ ? link_->next_grads() : nullptr;
  auto seg = std::lower_bound(segments_.begin(), segments_.end(), s.begin,
                              [](const Segment& g, size_t at) { return g.state_offset + g.size <= at; });
  runs_.clear();  // the span's segments, updated together (one backend op)
  for (; seg != segments_.end() && seg->state_offset < s.begin + s.n; ++seg) {
    const size_t lo = std::max(seg->state_offset, s.begin), hi = std::min(seg->state_offset + seg->size, s.begin + s.n);
    float* p = s.field[OptimizerState::master] ? s.field[OptimizerState::master] + (lo - s.begin)
                                               : seg->params + (lo - seg->state_offset);
    if (hi > lo)
      runs_.push_back({p, s.field[OptimizerState::exp_avg] + (lo - s.begin),
                       s.field[OptimizerState::exp_avg_sq] + (lo - s.begin),
                       host_grads ? host_grads + (lo - s.begin) : seg->grads + (lo - seg->state_offset), hi - lo,
                       adam_->decay(seg->decay), fused16_ ? seg->weights16 + (lo - seg->state_offset) : nullptr});
  }
  adam_->update(runs_, dt_ == Dtype16::fp16);
  if (s.field[OptimizerState::master] && !fused16_) params_->take_updated(s.begin, s.n, s.field[OptimizerState::master]);
}

SwapIo ZeroEngine::take_swap_io() {
  SwapIo io;
  const SwapFile::Stats param = params_->take_swap_io();
  for (const SwapFile::Stats& s : {state_->take_io(), param}) {
    io.wait_s += s.wait_s;
    io.busy_s += s.read_s + s.write_s;
    io.bytes_read += s.bytes_read;
    io.bytes_written += s.bytes_written;
  }
  io.param_bytes_read = param.bytes_read, io.param_bytes_written = param.bytes_written;
  if (link_) {
    const HostLink::Stats l = link_->take_stats();
    io.copy_wait_s = l.wait_s, io.copy_s = l.copy_s, io.bytes_down = l.bytes_down, io.bytes_up = l.bytes_up;
  }
  return io;
}

void ZeroEngine::gather_updated_params() { params_->gather_updated(); }

// ---- checkpoints ----

float* ZeroEngine::kept_master(const Piece& p) {
  float* kept = params_->owned(view_.bucket_of(p.tensor));
  return kept ? kept + view_.offset_in_owned(p) : nullptr;
}

namespace {
OptimizerState::Field field_of(ZeroEngine::State kind) {
  return kind == ZeroEngine::State::exp_avg      ? OptimizerState::exp_avg
         : kind == ZeroEngine::State::exp_avg_sq ? OptimizerState::exp_avg_sq
                                                 : OptimizerState::master;
}
}  // namespace

void ZeroEngine::read_state(State kind, const Piece& p, float* out) {
  float* kept = kind == State::master ? kept_master(p) : nullptr;
  if (kept) return be_.copy_to_host(out, kept, p.size * sizeof(float));
  state_->read(field_of(kind), view_.state_base(view_.bucket_of(p.tensor)) + view_.offset_in_owned(p), p.size, out);
}

void ZeroEngine::write_state(State kind, const Piece& p, const float* in) {
  float* kept = kind == State::master ? kept_master(p) : nullptr;
  if (kept) return be_.copy_from_host(kept, in, p.size * sizeof(float));
  state_->write(field_of(kind), view_.state_base(view_.bucket_of(p.tensor)) + view_.offset_in_owned(p), p.size, in);
}

void ZeroEngine::read_weights16(const Piece& p, uint16_t* out) const {
  Z3D_ASSERT(mixed_, "read_weights16 needs mixed precision");
  params_->read_weights16(p, out);
}

void ZeroEngine::finish_load(int64_t optimizer_steps) {
  adam_->set_step_count(optimizer_steps);
  if (pool_) pool_->invalidate();
  if (state_->has_master())  // the weights from the loaded master, as after every step
    state_->stream([this](const OptimizerState::Span& s) {
      params_->take_updated(s.begin, s.n, s.field[OptimizerState::master]);
    });
  if (link_) link_->finish();
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
  for (auto [index, at] : tensors) mine.push_back(fnv1a(host.data() + at * elem, layout_.tensors[index].size * elem));
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
