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

ZeroEngine::ZeroEngine(Backend& be, ProcessGroup& dp, const ModelConfig& model, const ZeroConfig& zero,
                       const OptimizerConfig& optimizer)
    : be_(be), dp_(dp), cfg_(zero) {
  const size_t bucket = static_cast<size_t>(std::min(zero.reduce_bucket_size, zero.allgather_bucket_size));
  layout_ = make_flat_layout(gpt_param_table(model), dp.size(), bucket);
  const int p = dp.size();
  params_ = DeviceBuffer<float>(be, layout_.total);
  mem_.params = params_.bytes();
  size_t max_bucket = 0;
  for (const Bucket& b : layout_.buckets) max_bucket = std::max(max_bucket, b.size);
  if (cfg_.stage < 2) {
    grads_ = DeviceBuffer<float>(be, layout_.total);
    mem_.grads = grads_.bytes();
    if (cfg_.stage == 1 && cfg_.reduce_scatter) scratch_ = DeviceBuffer<float>(be, max_bucket / p);
  } else {
    shard_grads_ = DeviceBuffer<float>(be, layout_.shard_size);
    mem_.grads = shard_grads_.bytes();
    size_t max_block = 0;
    for (size_t u = 1; u < layout_.units.size(); ++u) max_block = std::max(max_block, layout_.units[u].size);
    for (size_t n : {layout_.units[0].size, max_block, max_block}) {
      auto s = std::make_unique<Slab>();
      s->grads = DeviceBuffer<float>(be, n);
      if (cfg_.reduce_scatter) s->recv = DeviceBuffer<float>(be, n / p);
      slabs_.push_back(std::move(s));
    }
  }
  mem_.buffers = scratch_.bytes();
  for (const auto& s : slabs_) mem_.buffers += s->grads.bytes() + s->recv.bytes();

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
      segments_.push_back({params_.data() + s, owned_grads(b) + (s - lo), state_base + (s - lo), e - s, info.decay});
    }
  }
}

ZeroEngine::~ZeroEngine() {
  for (auto& s : slabs_) s->ops.clear();  // waits for anything in flight
}

size_t ZeroEngine::owned_offset(const Bucket& b) const {
  return cfg_.stage == 0 ? b.offset : b.offset + layout_.slice(b, dp_.rank()).offset;
}
size_t ZeroEngine::owned_size(const Bucket& b) const { return cfg_.stage == 0 ? b.size : b.size / dp_.size(); }

float* ZeroEngine::owned_grads(const Bucket& b) {
  return cfg_.stage < 2 ? grads_.data() + owned_offset(b) : shard_grads_.data() + b.shard_offset;
}

void ZeroEngine::init_weights(uint64_t seed) {
  std::vector<float> host(layout_.total);
  gpt_initial_params(layout_, static_cast<int>(layout_.units.size()) - 2, seed, 0, layout_.total, host.data());
  be_.copy_from_host(params_.data(), host.data(), host.size() * sizeof(float));
}

std::vector<float> ZeroEngine::params_to_host() const {
  std::vector<float> host(layout_.total);
  be_.copy_to_host(host.data(), params_.data(), params_.bytes());
  return host;
}

const float* ZeroEngine::acquire_params(int unit) { return params_.data() + layout_.units[unit].offset; }

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
  const std::vector<float> host = params_to_host();
  std::vector<uint64_t> mine;
  for (const ParamInfo& t : layout_.tensors) {  // FNV-1a over the tensor's bytes
    uint64_t h = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data() + t.offset);
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
                                 static_cast<long long>(step), layout_.tensors[t].name.c_str(), r),
                       kExitInconsistent);
}

void ZeroEngine::perturb_replica(float delta) {
  float v = 0;
  be_.copy_to_host(&v, params_.data(), sizeof v);
  v += delta;
  be_.copy_from_host(params_.data(), &v, sizeof v);
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
  adam_->step(segments_, lr);
  if (cfg_.stage == 0) return;
  std::vector<PendingOp> ops;
  for (const Bucket& b : layout_.buckets)
    ops.push_back(dp_.iall_gather(params_.data() + owned_offset(b), params_.data() + b.offset, b.size / dp_.size()));
  for (auto& op : ops) op.wait();
}

}  // namespace zero3d
