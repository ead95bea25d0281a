#include "zero/param_storage.h"

#include <algorithm>

#include "core/check.h"
#include "model/param_store.h"  // gpt_initial_params

namespace zero3d {

void ParamStorage::flip_first_replicated_bit(Backend& be) {
  const Replicated r = replicated();
  if (r.count == 0) return;
  void* p = const_cast<void*>(r.data);
  unsigned char byte = 0;
  be.copy_to_host(&byte, p, 1);
  byte ^= 1;
  be.copy_from_host(p, &byte, 1);
}

namespace {

// Stages 0-2: the whole flat layout on every rank.
class FullParams final : public ParamStorage {
 public:
  FullParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, int stage,
             const std::optional<Storage16>& s16)
      : ParamStorage(be, dp, L, view, s16), stage0_(stage == 0) {
    if (s16_) {
      params16_ = DeviceBuffer<uint16_t>(be, L.total);
      master_ = DeviceBuffer<float>(be, stage0_ ? L.total : L.shard_size);
    } else {
      params_ = DeviceBuffer<float>(be, L.total);
    }
    param_bytes_ = params_.bytes() + params16_.bytes();
    master_bytes_ = master_.bytes();
  }

  void init(uint64_t seed, int n_layer) override {
    std::vector<float> kept(L_.total);
    gpt_initial_params(L_, n_layer, seed, 0, L_.total, kept.data());
    if (!s16_) {
      be_.copy_from_host(params_.data(), kept.data(), kept.size() * sizeof(float));
      return;
    }
    std::vector<float> master(master_.size());
    if (stage0_) {
      master = kept;  // stage 0 owns everything
    } else {
      for (const Bucket& b : L_.buckets)
        std::copy_n(kept.begin() + view_.owned_offset(b), view_.owned_size(b), master.begin() + b.shard_offset);
    }
    be_.copy_from_host(master_.data(), master.data(), master.size() * sizeof(float));
    const std::vector<uint16_t> kept16 = s16_->narrow_host(kept);
    be_.copy_from_host(params16_.data(), kept16.data(), kept16.size() * sizeof(uint16_t));
  }
  float* owned(const Bucket& b) override {
    if (s16_) return master_.data() + (stage0_ ? b.offset : b.shard_offset);
    return params_.data() + view_.owned_offset(b);
  }
  const float* resident_unit(int unit) override {
    return s16_ ? nullptr : params_.data() + L_.units[unit].offset;
  }
  void fill(ParamSlot& s, int unit) override {  // mixed: widen the kept 16-bit weights
    const Unit& u = L_.units[unit];
    s16_->widen(s.buf.data(), params16_.data() + u.offset, u.size);
  }
  void round_master() override {
    if (!s16_) return;
    if (stage0_) s16_->narrow(params16_.data(), master_.data(), master_.size());
    else
      for (const Bucket& b : L_.buckets)
        s16_->narrow(params16_.data() + view_.owned_offset(b), owned(b), view_.owned_size(b));
  }
  void gather_updated() override {
    if (stage0_) return;  // every rank updated everything
    std::vector<PendingOp> ops;
    for (const Bucket& b : L_.buckets) {
      const size_t n = b.size / dp_.size();
      if (s16_)
        ops.push_back(dp_.iall_gather(params16_.mem(view_.owned_offset(b)), params16_.mem(b.offset), n));
      else
        ops.push_back(dp_.iall_gather(params_.mem(view_.owned_offset(b)), params_.mem(b.offset), n));
    }
    for (auto& op : ops) op.wait();
  }
  void read_weights16(const Piece& p, uint16_t* out) const override {
    const size_t at = view_.owned_offset(view_.bucket_of(p.tensor)) + view_.offset_in_owned(p);
    be_.copy_to_host(out, params16_.data() + at, p.size * sizeof(uint16_t));
  }
  Replicated replicated() const override {  // everything, at its flat offset
    std::vector<std::pair<size_t, size_t>> tensors;
    for (const Bucket& b : L_.buckets)
      for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t)
        tensors.push_back({static_cast<size_t>(t), L_.tensors[t].offset});
    return describe(s16_ ? static_cast<const void*>(params16_.data()) : params_.data(), L_.total, std::move(tensors));
  }

 private:
  bool stage0_;
  DeviceBuffer<float> params_, master_;
  DeviceBuffer<uint16_t> params16_;
};

// Stage 3: this rank's slice of every bucket, and the persistent buckets whole.
class ShardedParams final : public ParamStorage {
 public:
  ShardedParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view,
                const std::optional<Storage16>& s16)
      : ParamStorage(be, dp, L, view, s16) {
    if (s16_) {
      params16_ = DeviceBuffer<uint16_t>(be, L.shard_size);
      resident16_ = DeviceBuffer<uint16_t>(be, L.resident_size);
      master_ = DeviceBuffer<float>(be, L.shard_size);
    } else {
      shard_params_ = DeviceBuffer<float>(be, L.shard_size);
      resident_ = DeviceBuffer<float>(be, L.resident_size);
    }
    param_bytes_ = shard_params_.bytes() + resident_.bytes() + params16_.bytes() + resident16_.bytes();
    master_bytes_ = master_.bytes();
  }

  void init(uint64_t seed, int n_layer) override {
    std::vector<float> kept(L_.shard_size), resident(L_.resident_size);
    for (const Bucket& b : L_.buckets) {
      const ShardInfo sl = L_.slice(b, dp_.rank());
      gpt_initial_params(L_, n_layer, seed, b.offset + sl.offset, b.offset + sl.offset + sl.size,
                         kept.data() + b.shard_offset);
      if (b.persistent)
        gpt_initial_params(L_, n_layer, seed, b.offset, b.offset + b.size, resident.data() + b.resident_offset);
    }
    if (!s16_) {
      be_.copy_from_host(shard_params_.data(), kept.data(), kept.size() * sizeof(float));
      be_.copy_from_host(resident_.data(), resident.data(), resident.size() * sizeof(float));
      return;
    }
    be_.copy_from_host(master_.data(), kept.data(), kept.size() * sizeof(float));  // exactly its slices
    const std::vector<uint16_t> kept16 = s16_->narrow_host(kept), resident16 = s16_->narrow_host(resident);
    be_.copy_from_host(params16_.data(), kept16.data(), kept16.size() * sizeof(uint16_t));
    be_.copy_from_host(resident16_.data(), resident16.data(), resident16.size() * sizeof(uint16_t));
  }
  float* owned(const Bucket& b) override {
    return (s16_ ? master_.data() : shard_params_.data()) + b.shard_offset;
  }
  const float* resident_unit(int) override { return nullptr; }
  // Start the all-gathers of the unit's slices (into buf16 first in mixed precision); the
  // persistent buckets are copied whole.
  void fill(ParamSlot& s, int unit) override {
    const Unit& u = L_.units[unit];
    for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
      const Bucket& b = L_.buckets[i];
      const size_t at = b.offset - u.offset, n = b.size / dp_.size();
      if (!s16_ && b.persistent)
        be_.copy(s.buf.data() + at, resident_.data() + b.resident_offset, b.size * sizeof(float));
      else if (!s16_)
        s.ops.push_back(dp_.iall_gather(shard_params_.mem(b.shard_offset), s.buf.mem(at), n));
      else if (b.persistent)
        be_.copy(s.buf16.data() + at, resident16_.data() + b.resident_offset, b.size * sizeof(uint16_t));
      else
        s.ops.push_back(dp_.iall_gather(params16_.mem(b.shard_offset), s.buf16.mem(at), n));
    }
    s.widen_pending = s16_.has_value();
  }
  void round_master() override {
    if (s16_) s16_->narrow(params16_.data(), master_.data(), master_.size());
  }
  void gather_updated() override {  // the persistent buckets only
    std::vector<PendingOp> ops;
    for (const Bucket& b : L_.buckets) {
      if (!b.persistent) continue;
      const size_t n = b.size / dp_.size();
      if (s16_)
        ops.push_back(dp_.iall_gather(params16_.mem(b.shard_offset), resident16_.mem(b.resident_offset), n));
      else
        ops.push_back(dp_.iall_gather(shard_params_.mem(b.shard_offset), resident_.mem(b.resident_offset), n));
    }
    for (auto& op : ops) op.wait();
  }
  void read_weights16(const Piece& p, uint16_t* out) const override {  // the slices in shard order
    const size_t at = view_.bucket_of(p.tensor).shard_offset + view_.offset_in_owned(p);
    be_.copy_to_host(out, params16_.data() + at, p.size * sizeof(uint16_t));
  }
  Replicated replicated() const override {  // the persistent buckets, at their resident offsets
    std::vector<std::pair<size_t, size_t>> tensors;
    for (const Bucket& b : L_.buckets)
      if (b.persistent)
        for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t)
          tensors.push_back({static_cast<size_t>(t), b.resident_offset + (L_.tensors[t].offset - b.offset)});
    return describe(s16_ ? static_cast<const void*>(resident16_.data()) : resident_.data(), L_.resident_size,
                    std::move(tensors));
  }

 private:
  DeviceBuffer<float> shard_params_, resident_, master_;
  DeviceBuffer<uint16_t> params16_, resident16_;
};

}  // namespace

std::unique_ptr<ParamStorage> make_param_storage(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                                 const ShardView& view, int stage,
                                                 const std::optional<Storage16>& s16) {
  if (stage < 3) return std::make_unique<FullParams>(be, dp, layout, view, stage, s16);
  return std::make_unique<ShardedParams>(be, dp, layout, view, s16);
}

}  // namespace zero3d
