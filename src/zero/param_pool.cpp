#include "zero/param_pool.h"

#include <algorithm>

#include "core/check.h"

namespace zero3d {

ParamPool::ParamPool(Backend& be, const FlatLayout& layout, const Policy& policy,
                     const std::optional<Storage16>& s16, Fill fill)
    : layout_(layout), policy_(policy), s16_(s16), fill_(std::move(fill)) {
  const int num_units = static_cast<int>(layout_.units.size());
  size_t max_block = 0;
  for (int u = 1; u + 1 < num_units; ++u) max_block = std::max(max_block, layout_.units[u].size);
  const size_t fixed = layout_.units.front().size + layout_.units.back().size;
  const size_t live = policy_.gathered ? policy_.max_live : 0;
  size_t blocks = max_block ? (live > fixed ? (live - fixed) / max_block : 0) : 0;
  blocks = std::clamp<size_t>(blocks, 2, std::max<size_t>(2, num_units - 2));
  std::vector<size_t> sizes = {layout_.units.front().size, layout_.units.back().size};
  sizes.insert(sizes.end(), blocks, max_block);
  for (size_t n : sizes) {
    auto slot = std::make_unique<ParamSlot>();
    slot->buf = DeviceBuffer<float>(be, n, BufferUse::comm);  // in-place gathers (offload_param) read it
    if (policy_.slots16) slot->buf16 = DeviceBuffer<uint16_t>(be, n, BufferUse::comm);
    slots_.push_back(std::move(slot));
  }
  // Each unit's ranges to widen: all of it, or its tensors but the gemm_only ones, adjacent ones
  // merged (padding is never read).
  widen_runs_.resize(num_units);
  for (int u = 0; u < num_units; ++u) {
    const Unit& unit = layout_.units[u];
    if (policy_.widen_gemm_only) {
      widen_runs_[u].push_back({0, unit.size});
      continue;
    }
    for (const ParamInfo& p : layout_.tensors) {
      if (p.unit != u || p.gemm_only) continue;
      std::vector<ShardInfo>& runs = widen_runs_[u];
      const size_t at = p.offset - unit.offset;
      if (!runs.empty() && runs.back().offset + runs.back().size == at) runs.back().size += p.size;
      else runs.push_back({at, p.size});
    }
  }
  for (int u = 0; u < num_units; ++u) trace_.push_back(u);     // forward: embeddings, blocks, final LN
  trace_.push_back(0);                                           // backward: embeddings (LM head),
  for (int u = num_units - 1; u >= 1; --u) trace_.push_back(u);  // final LN, blocks in reverse
}

ParamPool::~ParamPool() {
  for (auto& s : slots_) s->finish();  // waits for anything in flight
}

size_t ParamPool::bytes() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s->buf.bytes() + s->buf16.bytes();
  return n;
}

size_t ParamPool::distance_to_next_use(int unit) const {
  size_t elems = 0;
  for (size_t k = 1; k <= trace_.size(); ++k) {
    const int u = trace_[(trace_pos_ + k) % trace_.size()];
    if (u == unit) return elems;
    elems += layout_.units[u].size;
  }
  return elems;
}

const uint16_t* ParamPool::held16(int unit) const {
  for (const auto& s : slots_)
    if (s->unit == unit && s->in_use) return s->weights16;
  return nullptr;
}

void ParamPool::widen(ParamSlot& s, int unit) {
  for (const ShardInfo& r : widen_runs_[unit]) s16_->widen(s.buf.data() + r.offset, s.weights16 + r.offset, r.size);
  s.widen_pending = false;
}

ParamSlot* ParamPool::holding(int unit) {
  for (auto& s : slots_)
    if (s->unit == unit) return s.get();
  return nullptr;
}

// A slot for `unit`: its own for the first and last unit, else a free block slot, else (with
// may_wait) the idle block slot whose unit is needed last. nullptr when none can be had.
ParamSlot* ParamPool::free_slot_for(int unit, bool may_wait) {
  const int last = static_cast<int>(layout_.units.size()) - 1;
  ParamSlot* pick = nullptr;
  if (unit == 0 || unit == last) {
    pick = slots_[unit == 0 ? 0 : 1].get();
    if (pick->in_use || (!may_wait && pick->unit >= 0)) return nullptr;
  } else {
    size_t farthest = 0;
    for (size_t i = 2; i < slots_.size(); ++i) {
      ParamSlot* s = slots_[i].get();
      if (s->in_use) continue;
      if (s->unit < 0) return s;
      if (!may_wait) continue;
      const size_t d = distance_to_next_use(s->unit);
      if (!pick || d > farthest) pick = s, farthest = d;
    }
  }
  if (pick) {
    pick->finish();
    pick->unit = -1;
    pick->widen_pending = false;
  }
  return pick;
}

void ParamPool::fill(ParamSlot& s, int unit) {
  s.unit = unit;
  fill_(s, unit);
}

const float* ParamPool::acquire(int unit) {
  for (size_t k = 0; k < trace_.size(); ++k)  // follow the trace to this unit's next access
    if (trace_[(trace_pos_ + k) % trace_.size()] == unit) {
      trace_pos_ = (trace_pos_ + k) % trace_.size();
      break;
    }
  ParamSlot* s = holding(unit);
  if (!s) {
    s = free_slot_for(unit, /*may_wait=*/true);
    Z3D_ASSERT(s != nullptr, "ZeRO: no parameter slot free (more units in use than the pool holds)");
    fill(*s, unit);
  }
  s->finish();
  if (s->widen_pending) widen(*s, unit);
  s->in_use = true;
  // Prefetch the next unit of the trace while this one is computed on.
  const int next = trace_[(trace_pos_ + 1) % trace_.size()];
  if (policy_.gathered && layout_.units[next].size <= policy_.prefetch_elems && !holding(next))
    if (ParamSlot* p = free_slot_for(next, /*may_wait=*/false)) fill(*p, next);
  return s->buf.data();
}

void ParamPool::release(int unit) {
  ParamSlot* s = holding(unit);
  if (!s) return;
  s->in_use = false;
  const bool keep = policy_.gathered && distance_to_next_use(unit) < policy_.reuse_distance;
  if (!keep) s->unit = -1;
}

void ParamPool::invalidate() {
  for (auto& s : slots_) {
    s->finish();
    s->unit = -1;
    s->in_use = false;
    s->widen_pending = false;
  }
}

}  // namespace zero3d
