#include "zero/engine.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "kernels/math/dtype.h"

namespace zero3d {

// A full-size gradient buffer for one unit at a time, with the receive buffers of its
// reduce-scatters and the requests still in flight. In mixed precision g16 holds the unit's
// gradient rounded to 16 bits (what is reduced), recv16 the reduced slices, recv their widening.
struct ZeroEngine::Slab {
  DeviceBuffer<float> grads, recv;
  DeviceBuffer<uint16_t> g16, recv16;
  int unit = -1;
  bool reducing = false;  // grads_done has posted its reductions (the unit may be open in another slab)
  std::vector<PendingOp> ops;
};

// A unit's full fp32 parameters for compute (stage 3: gathered; mixed: widened), with the
// all-gathers that fill it (into buf16 first in mixed precision).
struct ZeroEngine::ParamSlot {
  DeviceBuffer<float> buf;
  DeviceBuffer<uint16_t> buf16;
  int unit = -1;        // the unit held (valid once ops are done), -1 when free
  bool in_use = false;  // between acquire_params and release_params
  bool widen_pending = false;  // buf16 -> buf once the gathers are done
  std::vector<PendingOp> ops;
};

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
  pooled_ = cfg_.stage == 3 || mixed_;
  const int p = dp.size();
  const int num_units = static_cast<int>(layout_.units.size());
  const size_t owned_total = cfg_.stage == 0 ? layout_.total : layout_.shard_size;  // optimizer-owned elements
  size_t max_block = 0, max_bucket = 0;
  for (int u = 1; u + 1 < num_units; ++u) max_block = std::max(max_block, layout_.units[u].size);
  for (const Bucket& b : layout_.buckets) max_bucket = std::max(max_bucket, b.size);

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
  if (pooled_) {
    // Slot pool: first and last unit own one each; the blocks share as many as
    // stage3_max_live_parameters allows (stage 3), never fewer than two (current and next).
    const size_t fixed = layout_.units.front().size + layout_.units.back().size;
    const size_t live = cfg_.stage == 3 ? static_cast<size_t>(zero.stage3_max_live_parameters) : 0;
    size_t blocks = max_block ? (live > fixed ? (live - fixed) / max_block : 0) : 0;
    blocks = std::clamp<size_t>(blocks, 2, std::max<size_t>(2, num_units - 2));
    std::vector<size_t> sizes = {layout_.units.front().size, layout_.units.back().size};
    sizes.insert(sizes.end(), blocks, max_block);
    for (size_t n : sizes) {
      auto slot = std::make_unique<ParamSlot>();
      slot->buf = DeviceBuffer<float>(be, n);
      if (mixed_ && cfg_.stage == 3) slot->buf16 = DeviceBuffer<uint16_t>(be, n);
      pslots_.push_back(std::move(slot));
    }
    for (int u = 0; u < num_units; ++u) trace_.push_back(u);  // forward: embeddings, blocks, final LN
    trace_.push_back(0);                                        // backward: embeddings (LM head),
    for (int u = num_units - 1; u >= 1; --u) trace_.push_back(u);  // final LN, blocks in reverse
  }

  // Gradients.
  if (cfg_.stage < 2) {
    if (mixed_) grads16_ = DeviceBuffer<uint16_t>(be, layout_.total);
    else grads_ = DeviceBuffer<float>(be, layout_.total);
    if (cfg_.stage == 1 && cfg_.reduce_scatter) {
      if (mixed_) scratch16_ = DeviceBuffer<uint16_t>(be, max_bucket / p);
      else scratch_ = DeviceBuffer<float>(be, max_bucket / p);
    }
  } else if (mixed_) {
    shard_grads16_ = DeviceBuffer<uint16_t>(be, layout_.shard_size);
  } else {
    shard_grads_ = DeviceBuffer<float>(be, layout_.shard_size);
  }
  if (cfg_.stage >= 2 || mixed_) {  // unit gradient buffers: the embeddings', two rotating others
    const size_t max_rest = std::max(max_block, layout_.units.back().size);
    for (size_t n : {layout_.units[0].size, max_rest, max_rest}) {
      auto s = std::make_unique<Slab>();
      s->grads = DeviceBuffer<float>(be, n);
      if (cfg_.stage >= 2) {
        if (cfg_.reduce_scatter && !mixed_) s->recv = DeviceBuffer<float>(be, n / p);
        if (mixed_) {
          s->g16 = DeviceBuffer<uint16_t>(be, n);
          s->recv = DeviceBuffer<float>(be, n / p);
          if (cfg_.reduce_scatter) s->recv16 = DeviceBuffer<uint16_t>(be, n / p);
        }
      }
      slabs_.push_back(std::move(s));
    }
  }
  if (mixed_) grads32_ = DeviceBuffer<float>(be, owned_total);

  adam_ = std::make_unique<AdamW>(be, optimizer, owned_total);

  // Accounting by role, from what was allocated above.
  mem_.params = params_.bytes() + shard_params_.bytes() + resident_.bytes() + params16_.bytes() + resident16_.bytes();
  mem_.grads = grads_.bytes() + shard_grads_.bytes() + grads16_.bytes() + shard_grads16_.bytes();
  mem_.optimizer = 2 * adam_->size() * sizeof(float) + master_.bytes();
  mem_.buffers = scratch_.bytes() + scratch16_.bytes() + grads32_.bytes();
  for (const auto& s : slabs_) mem_.buffers += s->grads.bytes() + s->recv.bytes() + s->g16.bytes() + s->recv16.bytes();
  for (const auto& s : pslots_) mem_.buffers += s->buf.bytes() + s->buf16.bytes();

  // Optimizer segments: the owned part of each tensor of each bucket, with its decay setting.
  for (const Piece& piece : view_.owned_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t at = view_.offset_in_owned(piece);
    segments_.push_back({owned_params(b) + at, owned_grads(b) + at, view_.state_base(b) + at, piece.size,
                         layout_.tensors[piece.tensor].decay});
  }
  // The norm counts what a checkpoint saves: every parameter of the grid once.
  for (const Piece& piece : view_.saved_pieces()) {
    const Bucket& b = view_.bucket_of(piece.tensor);
    const size_t flat = layout_.tensors[piece.tensor].offset + piece.begin;
    norm_segments_.push_back({reduced_slice(b) + (flat - b.offset - layout_.slice(b, dp_.rank()).offset), piece.size});
  }
}

ZeroEngine::~ZeroEngine() {
  for (auto& s : slabs_) s->ops.clear();  // waits for anything in flight
  for (auto& s : pslots_) s->ops.clear();
}

void ZeroEngine::narrow(uint16_t* dst, const float* src, size_t n) {
  dt_ == Dtype16::fp16 ? be_.cast_to_fp16(dst, src, n) : be_.cast_to_bf16(dst, src, n);
}
void ZeroEngine::widen(float* dst, const uint16_t* src, size_t n) {
  dt_ == Dtype16::fp16 ? be_.cast_from_fp16(dst, src, n) : be_.cast_from_bf16(dst, src, n);
}
void ZeroEngine::accumulate16(uint16_t* acc, const float* x, size_t n) {
  dt_ == Dtype16::fp16 ? be_.accumulate_fp16(acc, x, n) : be_.accumulate_bf16(acc, x, n);
}

// Where the optimizer finds bucket b's gradient and (fp32) parameters on this rank.
float* ZeroEngine::owned_grads(const Bucket& b) {
  if (mixed_) return grads32_.data() + (cfg_.stage == 0 ? b.offset : b.shard_offset);
  return cfg_.stage < 2 ? grads_.data() + view_.owned_offset(b) : shard_grads_.data() + b.shard_offset;
}
float* ZeroEngine::owned_params(const Bucket& b) {
  if (mixed_) return master_.data() + (cfg_.stage == 0 ? b.offset : b.shard_offset);
  return cfg_.stage < 3 ? params_.data() + view_.owned_offset(b) : shard_params_.data() + b.shard_offset;
}

void ZeroEngine::init_weights(uint64_t seed) {
  const int n_layer = n_layer_;
  auto to16 = [&](const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      h[i] = dt_ == Dtype16::fp16 ? math::fp16_from_float(x[i]) : math::bf16_from_float(x[i]);
    return h;
  };
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
  const std::vector<uint16_t> kept16 = to16(kept), resident16 = to16(resident);
  be_.copy_from_host(params16_.data(), kept16.data(), kept16.size() * sizeof(uint16_t));
  be_.copy_from_host(resident16_.data(), resident16.data(), resident16.size() * sizeof(uint16_t));
}

// ---- parameters for compute: direct (fp32 stages 0-2) or from the slot pool ----

size_t ZeroEngine::distance_to_next_use(int unit) const {
  size_t elems = 0;
  for (size_t k = 1; k <= trace_.size(); ++k) {
    const int u = trace_[(trace_pos_ + k) % trace_.size()];
    if (u == unit) return elems;
    elems += layout_.units[u].size;
  }
  return elems;
}

ZeroEngine::ParamSlot* ZeroEngine::slot_holding(int unit) {
  for (auto& s : pslots_)
    if (s->unit == unit) return s.get();
  return nullptr;
}

// A slot for `unit`: its own for the first and last unit, else a free block slot, else (with
// may_wait) the idle block slot whose unit is needed last. nullptr when none can be had.
ZeroEngine::ParamSlot* ZeroEngine::free_slot_for(int unit, bool may_wait) {
  const int last = static_cast<int>(layout_.units.size()) - 1;
  ParamSlot* pick = nullptr;
  if (unit == 0 || unit == last) {
    pick = pslots_[unit == 0 ? 0 : 1].get();
    if (pick->in_use || (!may_wait && pick->unit >= 0)) return nullptr;
  } else {
    size_t farthest = 0;
    for (size_t i = 2; i < pslots_.size(); ++i) {
      ParamSlot* s = pslots_[i].get();
      if (s->in_use) continue;
      if (s->unit < 0) return s;
      if (!may_wait) continue;
      const size_t d = distance_to_next_use(s->unit);
      if (!pick || d > farthest) pick = s, farthest = d;
    }
  }
  if (pick) {
    for (auto& op : pick->ops) op.wait();
    pick->ops.clear();
    pick->unit = -1;
    pick->widen_pending = false;
  }
  return pick;
}

// Fill slot s with unit's parameters: widen the resident 16-bit weights (mixed stages 0-2), or
// start the all-gathers of the slices (stage 3; into buf16 first in mixed precision).
void ZeroEngine::start_gather(ParamSlot& s, int unit) {
  const Unit& u = layout_.units[unit];
  s.unit = unit;
  if (cfg_.stage < 3) {
    widen(s.buf.data(), params16_.data() + u.offset, u.size);
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
  if (!pooled_) return params_.data() + layout_.units[unit].offset;
  for (size_t k = 0; k < trace_.size(); ++k)  // follow the trace to this unit's next access
    if (trace_[(trace_pos_ + k) % trace_.size()] == unit) {
      trace_pos_ = (trace_pos_ + k) % trace_.size();
      break;
    }
  ParamSlot* s = slot_holding(unit);
  if (!s) {
    s = free_slot_for(unit, /*may_wait=*/true);
    Z3D_ASSERT(s != nullptr, "ZeRO: no parameter slot free (more units in use than the pool holds)");
    start_gather(*s, unit);
  }
  for (auto& op : s->ops) op.wait();
  s->ops.clear();
  if (s->widen_pending) {
    widen(s->buf.data(), s->buf16.data(), layout_.units[unit].size);
    s->widen_pending = false;
  }
  s->in_use = true;
  // Prefetch the next unit of the trace while this one is computed on (stage 3).
  const int next = trace_[(trace_pos_ + 1) % trace_.size()];
  if (cfg_.stage == 3 && layout_.units[next].size <= static_cast<size_t>(cfg_.stage3_prefetch_bucket_size) &&
      !slot_holding(next))
    if (ParamSlot* p = free_slot_for(next, /*may_wait=*/false)) start_gather(*p, next);
  return s->buf.data();
}

void ZeroEngine::release_params(int unit) {
  if (!pooled_) return;
  ParamSlot* s = slot_holding(unit);
  if (!s) return;
  s->in_use = false;
  const bool keep = cfg_.stage == 3 && distance_to_next_use(unit) < static_cast<size_t>(cfg_.stage3_max_reuse_distance);
  if (!keep) s->unit = -1;
}

void ZeroEngine::invalidate_gathered() {
  for (auto& s : pslots_) {
    for (auto& op : s->ops) op.wait();
    s->ops.clear();
    s->unit = -1;
    s->in_use = false;
    s->widen_pending = false;
  }
}

// ---- gradients ----

float* ZeroEngine::acquire_grads(int unit) {
  if (slabs_.empty()) return grads_.data() + layout_.units[unit].offset;  // fp32 stages 0-1: in place
  Slab* s = nullptr;
  if (unit == 0) {
    s = slabs_[0].get();
  } else {
    s = slabs_[1 + next_slab_].get();
    next_slab_ = 1 - next_slab_;
  }
  complete(*s);  // its previous unit's reduction must land before the buffer is reused
  s->unit = unit;
  be_.zero(s->grads.data(), layout_.units[unit].size * sizeof(float));
  for (auto& other : slabs_)  // progress the other reductions (MPI has no progress thread)
    for (auto& op : other->ops) op.test();
  return s->grads.data();
}

void ZeroEngine::grads_done(int unit) {
  if (slabs_.empty()) return;
  Slab* s = nullptr;  // the slab accumulating this unit now (an older one may still be reducing it)
  for (auto& c : slabs_)
    if (c->unit == unit && !c->reducing) s = c.get();
  Z3D_ASSERT(s != nullptr, "grads_done for a unit that holds no gradient buffer");
  s->reducing = true;
  const Unit& u = layout_.units[unit];
  if (inject_inf_) {  // fault injection: an overflowed gradient
    const float inf = std::numeric_limits<float>::infinity();
    be_.copy_from_host(s->grads.data(), &inf, sizeof inf);
    inject_inf_ = false;
  }
  if (cfg_.stage < 2) {  // mixed stages 0-1: round into the 16-bit gradient, reduced at the boundary
    accumulate16(grads16_.data() + u.offset, s->grads.data(), u.size);
    s->unit = -1;
    s->reducing = false;
    return;
  }
  if (mixed_) narrow(s->g16.data(), s->grads.data(), u.size);
  const size_t shard_base = layout_.buckets[u.first_bucket].shard_offset;
  for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
    const Bucket& b = layout_.buckets[i];
    const size_t at = b.offset - u.offset, slice_at = b.shard_offset - shard_base, n = b.size / dp_.size();
    if (!mixed_ && cfg_.reduce_scatter)
      s->ops.push_back(dp_.ireduce_scatter_sum(s->grads.data() + at, s->recv.data() + slice_at, n));
    else if (!mixed_)
      s->ops.push_back(dp_.iall_reduce_sum(s->grads.data() + at, b.size));
    else if (cfg_.reduce_scatter)
      s->ops.push_back(dp_.ireduce_scatter_sum(s->g16.data() + at, s->recv16.data() + slice_at, n, dt_));
    else
      s->ops.push_back(dp_.iall_reduce_sum(s->g16.data() + at, b.size, dt_));
  }
  if (!cfg_.overlap_comm) complete(*s);
}

// Wait for a slab's reductions and add the rank's reduced slices into the shard gradients.
void ZeroEngine::complete(Slab& s) {
  if (s.unit < 0) return;
  for (auto& op : s.ops) op.wait();
  s.ops.clear();
  const Unit& u = layout_.units[s.unit];
  const size_t shard_base = layout_.buckets[u.first_bucket].shard_offset;
  for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
    const Bucket& b = layout_.buckets[i];
    const size_t n = b.size / dp_.size(), at = b.offset - u.offset + layout_.slice(b, dp_.rank()).offset;
    float* recv = s.recv.data() + (b.shard_offset - shard_base);
    if (!mixed_) {
      be_.accumulate(shard_grads_.data() + b.shard_offset, cfg_.reduce_scatter ? recv : s.grads.data() + at, n);
    } else {
      widen(recv, cfg_.reduce_scatter ? s.recv16.data() + (b.shard_offset - shard_base) : s.g16.data() + at, n);
      accumulate16(shard_grads16_.data() + b.shard_offset, recv, n);
    }
  }
  s.unit = -1;
  s.reducing = false;
}

void ZeroEngine::begin_step() {
  be_.zero(grads_.data(), grads_.bytes());
  be_.zero(shard_grads_.data(), shard_grads_.bytes());
  be_.zero(grads16_.data(), grads16_.bytes());
  be_.zero(shard_grads16_.data(), shard_grads16_.bytes());
}

void ZeroEngine::finish_gradients() {
  const int p = dp_.size();
  if (cfg_.stage == 0 || (cfg_.stage == 1 && !cfg_.reduce_scatter)) {
    std::vector<PendingOp> ops;  // bucketed all-reduce, all buckets in flight together
    for (const Bucket& b : layout_.buckets)
      ops.push_back(mixed_ ? dp_.iall_reduce_sum(grads16_.data() + b.offset, b.size, dt_)
                           : dp_.iall_reduce_sum(grads_.data() + b.offset, b.size));
    for (auto& op : ops) op.wait();
  } else if (cfg_.stage == 1) {
    for (const Bucket& b : layout_.buckets) {
      if (mixed_) {
        dp_.reduce_scatter_sum(grads16_.data() + b.offset, scratch16_.data(), b.size / p, dt_);
        be_.copy(grads16_.data() + view_.owned_offset(b), scratch16_.data(), (b.size / p) * sizeof(uint16_t));
      } else {
        dp_.reduce_scatter_sum(grads_.data() + b.offset, scratch_.data(), b.size / p);
        be_.copy(owned_grads(b), scratch_.data(), (b.size / p) * sizeof(float));
      }
    }
  } else {
    for (auto& s : slabs_) complete(*s);
  }
  if (!mixed_) return;
  // Widen the optimizer-owned 16-bit gradients into grads32_ (laid out like the master).
  if (cfg_.stage == 0) widen(grads32_.data(), grads16_.data(), layout_.total);
  else if (cfg_.stage == 1)
    for (const Bucket& b : layout_.buckets)
      widen(owned_grads(b), grads16_.data() + view_.owned_offset(b), view_.owned_size(b));
  else widen(grads32_.data(), shard_grads16_.data(), layout_.shard_size);
}

// This rank's dp slice of bucket b's reduced gradient: the slices of all ranks cover every
// parameter exactly once, whatever the stage (stage 0 holds the whole bucket but counts its slice).
const float* ZeroEngine::reduced_slice(const Bucket& b) const {
  const size_t slice = layout_.slice(b, dp_.rank()).offset;
  if (mixed_) return grads32_.data() + (cfg_.stage == 0 ? b.offset + slice : b.shard_offset);
  return cfg_.stage < 2 ? grads_.data() + b.offset + slice : shard_grads_.data() + b.shard_offset;
}

double ZeroEngine::grad_norm_sq() {
  double local = 0;
  for (auto [g, n] : norm_segments_) local += be_.sum_squares(g, n);
  return dp_.all_reduce_sum(local);
}

std::pair<float*, size_t> ZeroEngine::tied_embedding_grad() {
  for (const Bucket& b : layout_.buckets)
    if (b.num_tensors == 1 && layout_.tensors[b.first_tensor].own_bucket) return {owned_grads(b), view_.owned_size(b)};
  Z3D_ASSERT(false, "tied_embedding_grad on a stage without the tied embedding");
  return {nullptr, 0};
}

void ZeroEngine::scale_grads(float s) {
  for (const Bucket& b : layout_.buckets) be_.scale(owned_grads(b), s, view_.owned_size(b));
}

void ZeroEngine::optimizer_step(double lr) {
  if (pooled_) invalidate_gathered();  // slots hold the old weights; no gather may read a slice mid-update
  adam_->step(segments_, lr);
  round_master();
}

// Mixed precision: the 16-bit weights this rank owns become the rounding of its fp32 master.
void ZeroEngine::round_master() {
  if (!mixed_) return;
  if (cfg_.stage == 0 || cfg_.stage == 3) narrow(params16_.data(), master_.data(), master_.size());
  else
    for (const Bucket& b : layout_.buckets)
      narrow(params16_.data() + view_.owned_offset(b), owned_params(b), view_.owned_size(b));
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
  if (pooled_) invalidate_gathered();
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

void ZeroEngine::inject_inf_gradient() {
  if (!slabs_.empty()) {  // at the next unit backward hands over
    inject_inf_ = true;
    return;
  }
  const float inf = std::numeric_limits<float>::infinity();  // fp32 stages 0-1: straight into the gradient
  be_.copy_from_host(grads_.data(), &inf, sizeof inf);
}

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
