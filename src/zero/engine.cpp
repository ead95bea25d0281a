#include "zero/engine.h"

#include <algorithm>

#include "core/check.h"

namespace zero3d {

// A full-size gradient buffer for one unit at a time (stage 2), with the receive buffer of its
// reduce-scatters and the requests still in flight.
struct ZeroEngine::Slab {
  DeviceBuffer<float> grads, recv;
  int unit = -1;
  std::vector<PendingOp> ops;
};

// A gathered unit's full parameters (stage 3), with the all-gathers that fill it.
struct ZeroEngine::ParamSlot {
  DeviceBuffer<float> buf;
  int unit = -1;        // the unit held (valid once ops are done), -1 when free
  bool in_use = false;  // between acquire_params and release_params
  std::vector<PendingOp> ops;
};

ZeroEngine::ZeroEngine(Backend& be, ProcessGroup& dp, const ModelConfig& model, const ZeroConfig& zero,
                       const OptimizerConfig& optimizer)
    : be_(be), dp_(dp), cfg_(zero) {
  const size_t bucket = static_cast<size_t>(std::min(zero.reduce_bucket_size, zero.allgather_bucket_size));
  const size_t persist = cfg_.stage == 3 ? static_cast<size_t>(zero.stage3_param_persistence_threshold) : 0;
  layout_ = make_flat_layout(gpt_param_table(model), dp.size(), bucket, persist);
  const int p = dp.size();
  const int num_units = static_cast<int>(layout_.units.size());
  size_t max_block = 0;
  for (int u = 1; u + 1 < num_units; ++u) max_block = std::max(max_block, layout_.units[u].size);
  if (cfg_.stage < 3) {
    params_ = DeviceBuffer<float>(be, layout_.total);
    mem_.params = params_.bytes();
  } else {
    shard_params_ = DeviceBuffer<float>(be, layout_.shard_size);
    resident_ = DeviceBuffer<float>(be, layout_.resident_size);
    mem_.params = shard_params_.bytes() + resident_.bytes();
    // Slot pool: first and last unit own one each; the blocks share as many as
    // stage3_max_live_parameters allows, never fewer than two (the current block and the next).
    const size_t fixed = layout_.units.front().size + layout_.units.back().size;
    const size_t live = static_cast<size_t>(zero.stage3_max_live_parameters);
    size_t blocks = max_block ? (live > fixed ? (live - fixed) / max_block : 0) : 0;
    blocks = std::clamp<size_t>(blocks, 2, std::max<size_t>(2, num_units - 2));
    std::vector<size_t> sizes = {layout_.units.front().size, layout_.units.back().size};
    sizes.insert(sizes.end(), blocks, max_block);
    for (size_t n : sizes) {
      auto slot = std::make_unique<ParamSlot>();
      slot->buf = DeviceBuffer<float>(be, n);
      pslots_.push_back(std::move(slot));
    }
    for (int u = 0; u < num_units; ++u) trace_.push_back(u);  // forward: embeddings, blocks, final LN
    trace_.push_back(0);                                        // backward: embeddings (LM head),
    for (int u = num_units - 1; u >= 1; --u) trace_.push_back(u);  // final LN, blocks in reverse
  }
  size_t max_bucket = 0;
  for (const Bucket& b : layout_.buckets) max_bucket = std::max(max_bucket, b.size);
  if (cfg_.stage < 2) {
    grads_ = DeviceBuffer<float>(be, layout_.total);
    mem_.grads = grads_.bytes();
    if (cfg_.stage == 1 && cfg_.reduce_scatter) scratch_ = DeviceBuffer<float>(be, max_bucket / p);
  } else {
    shard_grads_ = DeviceBuffer<float>(be, layout_.shard_size);
    mem_.grads = shard_grads_.bytes();
    const size_t max_rest = std::max(max_block, layout_.units.back().size);
    for (size_t n : {layout_.units[0].size, max_rest, max_rest}) {
      auto s = std::make_unique<Slab>();
      s->grads = DeviceBuffer<float>(be, n);
      if (cfg_.reduce_scatter) s->recv = DeviceBuffer<float>(be, n / p);
      slabs_.push_back(std::move(s));
    }
  }
  mem_.buffers = scratch_.bytes();
  for (const auto& s : slabs_) mem_.buffers += s->grads.bytes() + s->recv.bytes();
  for (const auto& s : pslots_) mem_.buffers += s->buf.bytes();

  adam_ = std::make_unique<AdamW>(be, optimizer, cfg_.stage == 0 ? layout_.total : layout_.shard_size);
  mem_.optimizer = 2 * adam_->size() * sizeof(float);

  // Optimizer segments: the owned part of each tensor of each bucket, with its decay setting.
  for (const Bucket& b : layout_.buckets) {
    const size_t lo = owned_offset(b), hi = lo + owned_size(b);
    const size_t state_base = cfg_.stage == 0 ? b.offset : b.shard_offset;
    for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t) {
      const ParamInfo& info = layout_.tensors[t];
      const size_t s = std::max(lo, info.offset), e = std::min(hi, info.offset + info.size);
      if (s >= e) continue;
      segments_.push_back({owned_params(b) + (s - lo), owned_grads(b) + (s - lo), state_base + (s - lo), e - s, info.decay});
    }
  }
}

ZeroEngine::~ZeroEngine() {
  for (auto& s : slabs_) s->ops.clear();  // waits for anything in flight
  for (auto& s : pslots_) s->ops.clear();
}

size_t ZeroEngine::owned_offset(const Bucket& b) const {
  return cfg_.stage == 0 ? b.offset : b.offset + layout_.slice(b, dp_.rank()).offset;
}
size_t ZeroEngine::owned_size(const Bucket& b) const { return cfg_.stage == 0 ? b.size : b.size / dp_.size(); }

float* ZeroEngine::owned_grads(const Bucket& b) {
  return cfg_.stage < 2 ? grads_.data() + owned_offset(b) : shard_grads_.data() + b.shard_offset;
}
float* ZeroEngine::owned_params(const Bucket& b) {
  return cfg_.stage < 3 ? params_.data() + owned_offset(b) : shard_params_.data() + b.shard_offset;
}

void ZeroEngine::init_weights(uint64_t seed) {
  const int n_layer = static_cast<int>(layout_.units.size()) - 2;
  if (cfg_.stage < 3) {
    std::vector<float> host(layout_.total);
    gpt_initial_params(layout_, n_layer, seed, 0, layout_.total, host.data());
    be_.copy_from_host(params_.data(), host.data(), host.size() * sizeof(float));
    return;
  }
  // Stage 3: each rank initialises exactly its slices (and the persistent buckets whole).
  std::vector<float> shard(layout_.shard_size), resident(layout_.resident_size);
  for (const Bucket& b : layout_.buckets) {
    const ShardInfo sl = layout_.slice(b, dp_.rank());
    gpt_initial_params(layout_, n_layer, seed, b.offset + sl.offset, b.offset + sl.offset + sl.size,
                       shard.data() + b.shard_offset);
    if (b.persistent)
      gpt_initial_params(layout_, n_layer, seed, b.offset, b.offset + b.size, resident.data() + b.resident_offset);
  }
  be_.copy_from_host(shard_params_.data(), shard.data(), shard.size() * sizeof(float));
  be_.copy_from_host(resident_.data(), resident.data(), resident.size() * sizeof(float));
}

std::vector<float> ZeroEngine::params_to_host() const {
  std::vector<float> host(layout_.total);
  if (cfg_.stage < 3) {
    be_.copy_to_host(host.data(), params_.data(), params_.bytes());
    return host;
  }
  // Stage 3: this rank's slices in place, the rest left zero (tests gather across ranks).
  for (const Bucket& b : layout_.buckets) {
    const ShardInfo sl = layout_.slice(b, dp_.rank());
    be_.copy_to_host(host.data() + b.offset + sl.offset, shard_params_.data() + b.shard_offset, sl.size * sizeof(float));
  }
  return host;
}

// ---- stage 3: gathering units on demand ----

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
  }
  return pick;
}

void ZeroEngine::start_gather(ParamSlot& s, int unit) {
  const Unit& u = layout_.units[unit];
  s.unit = unit;
  for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
    const Bucket& b = layout_.buckets[i];
    float* dst = s.buf.data() + (b.offset - u.offset);
    if (b.persistent)
      be_.copy(dst, resident_.data() + b.resident_offset, b.size * sizeof(float));
    else
      s.ops.push_back(dp_.iall_gather(shard_params_.data() + b.shard_offset, dst, b.size / dp_.size()));
  }
}

const float* ZeroEngine::acquire_params(int unit) {
  if (cfg_.stage < 3) return params_.data() + layout_.units[unit].offset;
  for (size_t k = 0; k < trace_.size(); ++k)  // follow the trace to this unit's next access
    if (trace_[(trace_pos_ + k) % trace_.size()] == unit) {
      trace_pos_ = (trace_pos_ + k) % trace_.size();
      break;
    }
  ParamSlot* s = slot_holding(unit);
  if (!s) {
    s = free_slot_for(unit, /*may_wait=*/true);
    Z3D_ASSERT(s != nullptr, "ZeRO-3: no parameter slot free (more units in use than the pool holds)");
    start_gather(*s, unit);
  }
  for (auto& op : s->ops) op.wait();
  s->ops.clear();
  s->in_use = true;
  // Prefetch the next unit of the trace while this one is computed on.
  const int next = trace_[(trace_pos_ + 1) % trace_.size()];
  if (layout_.units[next].size <= static_cast<size_t>(cfg_.stage3_prefetch_bucket_size) && !slot_holding(next))
    if (ParamSlot* p = free_slot_for(next, /*may_wait=*/false)) start_gather(*p, next);
  return s->buf.data();
}

void ZeroEngine::release_params(int unit) {
  if (cfg_.stage < 3) return;
  ParamSlot* s = slot_holding(unit);
  if (!s) return;
  s->in_use = false;
  if (distance_to_next_use(unit) >= static_cast<size_t>(cfg_.stage3_max_reuse_distance)) s->unit = -1;
}

void ZeroEngine::invalidate_gathered() {
  for (auto& s : pslots_) {
    for (auto& op : s->ops) op.wait();
    s->ops.clear();
    s->unit = -1;
    s->in_use = false;
  }
}

float* ZeroEngine::acquire_grads(int unit) {
  if (cfg_.stage < 2) return grads_.data() + layout_.units[unit].offset;
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
  if (cfg_.stage < 2) return;
  Slab* s = nullptr;
  for (auto& c : slabs_)
    if (c->unit == unit) s = c.get();
  Z3D_ASSERT(s != nullptr, "grads_done for a unit that holds no gradient buffer");
  const Unit& u = layout_.units[unit];
  const size_t shard_base = layout_.buckets[u.first_bucket].shard_offset;
  for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
    const Bucket& b = layout_.buckets[i];
    float* g = s->grads.data() + (b.offset - u.offset);
    if (cfg_.reduce_scatter)
      s->ops.push_back(dp_.ireduce_scatter_sum(g, s->recv.data() + (b.shard_offset - shard_base), b.size / dp_.size()));
    else
      s->ops.push_back(dp_.iall_reduce_sum(g, b.size));
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
    const size_t n = b.size / dp_.size();
    const float* reduced = cfg_.reduce_scatter
                               ? s.recv.data() + (b.shard_offset - shard_base)
                               : s.grads.data() + (b.offset - u.offset) + layout_.slice(b, dp_.rank()).offset;
    be_.accumulate(shard_grads_.data() + b.shard_offset, reduced, n);
  }
  s.unit = -1;
}

void ZeroEngine::check_replicas_consistent(int64_t step) {
  // Replicated: every tensor in stages 0-2; the persistent buckets' tensors in stage 3.
  std::vector<float> host;
  std::vector<std::pair<size_t, const float*>> tensors;  // (tensor index, its values)
  if (cfg_.stage < 3) {
    host = params_to_host();
    for (size_t t = 0; t < layout_.tensors.size(); ++t) tensors.push_back({t, host.data() + layout_.tensors[t].offset});
  } else {
    host.resize(layout_.resident_size);
    be_.copy_to_host(host.data(), resident_.data(), resident_.bytes());
    for (const Bucket& b : layout_.buckets)
      if (b.persistent)
        for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t)
          tensors.push_back({static_cast<size_t>(t), host.data() + b.resident_offset + (layout_.tensors[t].offset - b.offset)});
  }
  std::vector<uint64_t> mine;
  for (auto [index, values] : tensors) {  // FNV-1a over the tensor's bytes
    const ParamInfo& t = layout_.tensors[index];
    uint64_t h = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(values);
    for (size_t i = 0; i < t.size * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
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

void ZeroEngine::perturb_replica(float delta) {
  float* p = cfg_.stage < 3 ? params_.data() : resident_.data();
  if (cfg_.stage == 3 && layout_.resident_size == 0) return;
  float v = 0;
  be_.copy_to_host(&v, p, sizeof v);
  v += delta;
  be_.copy_from_host(p, &v, sizeof v);
}

void ZeroEngine::begin_step() {
  if (cfg_.stage < 2) be_.zero(grads_.data(), grads_.bytes());
  else be_.zero(shard_grads_.data(), shard_grads_.bytes());
}

void ZeroEngine::finish_gradients() {
  const int p = dp_.size();
  if (cfg_.stage == 0 || (cfg_.stage == 1 && !cfg_.reduce_scatter)) {
    std::vector<PendingOp> ops;  // bucketed all-reduce, all buckets in flight together
    for (const Bucket& b : layout_.buckets) ops.push_back(dp_.iall_reduce_sum(grads_.data() + b.offset, b.size));
    for (auto& op : ops) op.wait();
  } else if (cfg_.stage == 1) {
    for (const Bucket& b : layout_.buckets) {
      dp_.reduce_scatter_sum(grads_.data() + b.offset, scratch_.data(), b.size / p);
      be_.copy(owned_grads(b), scratch_.data(), (b.size / p) * sizeof(float));
    }
  } else {
    for (auto& s : slabs_) complete(*s);
  }
}

double ZeroEngine::grad_norm_sq() {
  double local = 0;
  for (const Bucket& b : layout_.buckets) {
    const float* g = cfg_.stage < 2 ? grads_.data() + b.offset + layout_.slice(b, dp_.rank()).offset
                                    : shard_grads_.data() + b.shard_offset;
    local += be_.sum_squares(g, b.size / dp_.size());
  }
  return dp_.all_reduce_sum(local);
}

bool ZeroEngine::grads_finite() {
  int64_t bad = 0;
  for (const Bucket& b : layout_.buckets) {
    const float* g = cfg_.stage < 2 ? grads_.data() + b.offset + layout_.slice(b, dp_.rank()).offset
                                    : shard_grads_.data() + b.shard_offset;
    bad += static_cast<int64_t>(be_.count_nonfinite(g, b.size / dp_.size()));
  }
  return dp_.all_reduce_max(bad) == 0;
}

void ZeroEngine::scale_grads(float s) {
  for (const Bucket& b : layout_.buckets) be_.scale(owned_grads(b), s, owned_size(b));
}

void ZeroEngine::optimizer_step(double lr) {
  if (cfg_.stage == 3) invalidate_gathered();  // no gather may read a slice while it is updated
  adam_->step(segments_, lr);
  if (cfg_.stage == 0) return;
  std::vector<PendingOp> ops;
  for (const Bucket& b : layout_.buckets) {
    const size_t n = b.size / dp_.size();
    if (cfg_.stage < 3)
      ops.push_back(dp_.iall_gather(params_.data() + owned_offset(b), params_.data() + b.offset, n));
    else if (b.persistent)
      ops.push_back(dp_.iall_gather(shard_params_.data() + b.shard_offset, resident_.data() + b.resident_offset, n));
  }
  for (auto& op : ops) op.wait();
}

}  // namespace zero3d
