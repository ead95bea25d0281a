#include "zero/param_storage.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "core/check.h"
#include "core/rng.h"
#include "model/init_weights.h"

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

void ParamStorage::split_updated(size_t begin, size_t n, const float* master) {
  for (size_t at = 0; at < n; at += link_->span_max())
    take_updated(begin + at, std::min(link_->span_max(), n - at), master + at);
}

const char* ParamStorage::stage_weights(const float* master, size_t n) {
  char* buf = link_->upload_buffer();
  if (s16_) narrow_on_host(reinterpret_cast<uint16_t*>(buf), master, n);
  else std::memcpy(buf, master, n * sizeof(float));
  return buf;
}

namespace {

// The parameter swap file's checksum of a bucket slice: a sum over its elements of a mix of the
// element's bits and its index in the shard. A sum, so the optimizer's spans (in shard order, not
// aligned to buckets) add their parts as they write them, and a gather checks the whole slice.
template <class T>
uint64_t sum_of(const T* v, size_t n, size_t first) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, v + i, sizeof(T));
    h += splitmix64(bits ^ (uint64_t(first + i) << 32));
  }
  return h;
}

// Stages 0-2: the whole flat layout on every rank.
class FullParams final : public ParamStorage {
 public:
  FullParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& zero,
             const std::optional<Storage16>& s16, OptimizerState& state, HostLink* link)
      : ParamStorage(be, dp, L, view, s16, state, link), stage0_(zero.stage == 0),
        gather_limit_(static_cast<size_t>(zero.allgather_bucket_size)) {
    if (s16_) params16_ = DeviceBuffer<uint16_t>(be, L.total, BufferUse::comm);
    else params_ = DeviceBuffer<float>(be, L.total, BufferUse::comm);
    param_bytes_ = params_.bytes() + params16_.bytes();
  }

  // Bucket by bucket (they tile the flat buffer), so the host holds one bucket's fp32 values at a
  // time, not a second copy of the whole model beside its weights and master.
  void init(uint64_t seed, int n_layer) override {
    std::vector<float> kept;
    for (const Bucket& b : L_.buckets) {
      kept.resize(b.size);
      gpt_initial_params(L_, n_layer, seed, b.offset, b.offset + b.size, kept.data());
      if (state_.has_master())
        state_.write(OptimizerState::master, view_.state_base(b), view_.owned_size(b),
                     kept.data() + (view_.owned_offset(b) - b.offset));
      if (!s16_) {
        be_.copy_from_host(params_.data() + b.offset, kept.data(), kept.size() * sizeof(float));
      } else {
        const std::vector<uint16_t> kept16 = s16_->narrow_host(kept);
        be_.copy_from_host(params16_.data() + b.offset, kept16.data(), kept16.size() * sizeof(uint16_t));
      }
    }
  }
  float* owned(const Bucket& b) override {
    return s16_ || state_.has_master() ? nullptr : params_.data() + view_.owned_offset(b);
  }
  // Mixed: round into the weights; master in host memory: stage and upload, per bucket's owned range.
  void take_updated(size_t begin, size_t n, const float* master) override {
    if (!state_.has_master()) return;  // fp32: Adam updated the kept parameters in place
    if (link_ && n > link_->span_max()) return split_updated(begin, n, master);
    const size_t elem = s16_ ? sizeof(uint16_t) : sizeof(float);
    const char* staged = link_ ? stage_weights(master, n) : nullptr;
    char* weights = s16_ ? reinterpret_cast<char*>(params16_.data()) : reinterpret_cast<char*>(params_.data());
    for (const Bucket& b : L_.buckets) {
      const size_t base = view_.state_base(b);
      const size_t lo = std::max(begin, base), hi = std::min(begin + n, base + view_.owned_size(b));
      if (lo >= hi) continue;
      char* dst = weights + (view_.owned_offset(b) + (lo - base)) * elem;
      if (link_) link_->upload(dst, staged + (lo - begin) * elem, (hi - lo) * elem);
      else s16_->narrow(reinterpret_cast<uint16_t*>(dst), master + (lo - begin), hi - lo);
    }
  }
  uint16_t* owned16(const Bucket& b) override {
    return s16_ && !link_ ? params16_.data() + view_.owned_offset(b) : nullptr;
  }
  const float* resident_unit(int unit) override {
    return s16_ ? nullptr : params_.data() + L_.units[unit].offset;
  }
  void fill(ParamSlot& s, int unit) override {  // mixed: the pool widens the kept 16-bit weights
    s.weights16 = params16_.data() + L_.units[unit].offset;
    s.widen_pending = true;
  }
  void gather_updated() override {  // in messages of up to allgather_bucket_size elements, spanning units
    if (stage0_) return;  // every rank updated everything
    std::vector<PendingOp> ops;
    for (const BucketMessage& run : bucket_messages(L_, 0, static_cast<int>(L_.buckets.size()), gather_limit_)) {
      const MessageSlices pieces{slice_counts(L_, run)};
      const size_t at = L_.buckets[run.first].offset;
      ops.push_back(s16_ ? dp_.iall_gather_in_place(params16_.mem(at), pieces)
                         : dp_.iall_gather_in_place(params_.mem(at), pieces));
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
  size_t gather_limit_;  // allgather_bucket_size
  DeviceBuffer<float> params_;
  DeviceBuffer<uint16_t> params16_;
};

// Stage 3: this rank's slice of every bucket (in memory, or in a swap file with offload_param on
// nvme), and the persistent buckets whole (always in the backend's memory). On a device backend
// with the optimizer offloaded (link_), offload_param keeps the slices in host memory (cpu) or
// the swap file (nvme, read into a pinned staging buffer per slot); a fill copies them up into
// their place in the slot through the link, and the all-gather runs in place there.
class ShardedParams final : public ParamStorage {
 public:
  ShardedParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& zero,
                const std::optional<Storage16>& s16, OptimizerState& state, const std::string& swap,
                const SwapFile::Options& swap_options, HostLink* link)
      : ParamStorage(be, dp, L, view, s16, state, link), elem_(s16 ? sizeof(uint16_t) : sizeof(float)) {
    // Where the kept slices live: the backend's memory, or host memory (offload_param cpu from a device).
    Backend& keep = link_ && zero.offload_param.device == OffloadDevice::cpu ? link_->cpu() : be;
    host_slices_ = &keep != &be;
    if (!swap.empty()) {
      swap_ = std::make_unique<SwapFile>(swap, uint64_t(L.shard_size) * elem_, swap_options);
      swapped_bytes_ = L.shard_size * elem_;
      sums_.assign(L.buckets.size(), 0);
    } else if (s16_) {
      params16_ = DeviceBuffer<uint16_t>(keep, L.shard_size, BufferUse::comm);
    } else {
      shard_params_ = DeviceBuffer<float>(keep, L.shard_size, BufferUse::comm);
    }
    if (s16_) resident16_ = DeviceBuffer<uint16_t>(be, L.resident_size, BufferUse::comm);
    else resident_ = DeviceBuffer<float>(be, L.resident_size, BufferUse::comm);
    (host_slices_ ? host_bytes_ : param_bytes_) += shard_params_.bytes() + params16_.bytes();
    param_bytes_ += resident_.bytes() + resident16_.bytes();
  }

  // Bucket by bucket, in shard order, so a model whose shard does not fit in memory beside the
  // rest (offload) never holds more than one bucket's slice here.
  void init(uint64_t seed, int n_layer) override {
    std::vector<float> resident(L_.resident_size), kept;
    for (const Bucket& b : L_.buckets) {
      const ShardInfo sl = L_.slice(b, dp_.rank());
      kept.resize(sl.size);
      gpt_initial_params(L_, n_layer, seed, b.offset + sl.offset, b.offset + sl.offset + sl.size, kept.data());
      if (state_.has_master()) {
        state_.write(OptimizerState::master, b.shard_offset, kept.size(), kept.data());
        take_updated(b.shard_offset, kept.size(), kept.data());  // a pass in shard order
      } else {
        be_.copy_from_host(shard_params_.data() + b.shard_offset, kept.data(), kept.size() * sizeof(float));
      }
      if (b.persistent)
        gpt_initial_params(L_, n_layer, seed, b.offset, b.offset + b.size, resident.data() + b.resident_offset);
    }
    if (s16_) {
      const std::vector<uint16_t> resident16 = s16_->narrow_host(resident);
      be_.copy_from_host(resident16_.data(), resident16.data(), resident16.size() * sizeof(uint16_t));
    } else {
      be_.copy_from_host(resident_.data(), resident.data(), resident.size() * sizeof(float));
    }
  }
  float* owned(const Bucket& b) override {
    return state_.has_master() ? nullptr : shard_params_.data() + b.shard_offset;  // else: master in the state
  }
  uint16_t* owned16(const Bucket& b) override {  // state order = shard order
    return s16_ && !link_ && !swap_ && !host_slices_ ? params16_.data() + b.shard_offset : nullptr;
  }
  void take_updated(size_t begin, size_t n, const float* master) override {  // state order = shard order
    if (link_ && n > link_->span_max()) return split_updated(begin, n, master);
    if (!swap_) {
      if (host_slices_) {  // the master and the slices are both in host memory
        if (s16_) narrow_on_host(params16_.data() + begin, master, n);
        else std::memcpy(shard_params_.data() + begin, master, n * sizeof(float));
      } else if (link_) {
        link_->upload(s16_ ? static_cast<void*>(params16_.data() + begin) : static_cast<void*>(shard_params_.data() + begin),
                      stage_weights(master, n), n * elem_);
      } else if (s16_) {
        s16_->narrow(params16_.data() + begin, master, n);
      }
      return;
    }
    if (begin == 0) std::fill(sums_.begin(), sums_.end(), 0);  // a new pass over the whole shard
    std::vector<uint16_t> w;  // swapping runs on the host backend only: host pointers
    const void* data = master;
    if (swap_->sizing()) {  // zero3d plan: the write counted, nothing narrowed or summed
      swap_->write(begin * elem_, data, n * elem_);
      return;
    }
    if (s16_) {
      w.resize(n);
      if (link_) narrow_on_host(w.data(), master, n);  // the master is in host memory
      else s16_->narrow(w.data(), master, n);
      data = w.data();
    }
    for (size_t i = 0; i < L_.buckets.size(); ++i) {  // each bucket slice's part of the span
      const Bucket& b = L_.buckets[i];
      const size_t lo = std::max(begin, b.shard_offset), hi = std::min(begin + n, b.shard_offset + b.size / dp_.size());
      if (lo < hi) sums_[i] += s16_ ? sum_of(w.data() + (lo - begin), hi - lo, lo) : sum_of(master + (lo - begin), hi - lo, lo);
    }
    swap_wait(*swap_, swap_->write(begin * elem_, data, n * elem_));
  }
  const float* resident_unit(int) override { return nullptr; }
  // Start the all-gathers of the unit's slices (into buf16 first in mixed precision); the
  // persistent buckets are copied whole. Slices not in the backend's memory come into their place
  // in the slot first, and their gathers (in place) start when the pool next needs the slot, so a
  // prefetched unit's reads and copies overlap the compute of the one before: swapped slices are
  // read there in the background (from a device backend: into the slot's pinned staging buffer,
  // then copied up through the link), slices kept in host memory copied up through the link.
  void fill(ParamSlot& s, int unit) override {
    const Unit& u = L_.units[unit];
    struct Slice {
      const Bucket* b;
      size_t at, mine, n;              // the bucket's place in the slot, this rank's slice's, its elements
      const char* src;                 // the slice in host memory (kept, or read from the swap file)
      SwapFile::Ticket read = 0;       // swapped: its read
      HostLink::Ticket copy = 0;       // from a device: its copy up
    };
    std::vector<Slice> later;  // the slices whose gathers wait for then_start
    char* slot = s16_ ? reinterpret_cast<char*>(s.buf16.data()) : reinterpret_cast<char*>(s.buf.data());
    char* staging = link_ && swap_ ? staging_for(s) : nullptr;
    for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
      const Bucket& b = L_.buckets[i];
      const size_t at = b.offset - u.offset, n = b.size / dp_.size(), mine = at + dp_.rank() * n;
      if (b.persistent) {
        be_.copy(slot + at * elem_, resident_at(b), b.size * elem_);
      } else if (swap_) {  // into place on the host backend, into the staging buffer from a device
        char* dst = staging ? staging : slot + mine * elem_;
        if (staging) staging += n * elem_;
        later.push_back({&b, at, mine, n, dst, swap_->read(b.shard_offset * elem_, dst, n * elem_)});
      } else if (host_slices_) {
        later.push_back({&b, at, mine, n, kept_at(b)});
        later.back().copy = link_->copy_to_device(slot + mine * elem_, kept_at(b), n * elem_);
      } else if (s16_) {
        s.ops.push_back(dp_.iall_gather(params16_.mem(b.shard_offset), s.buf16.mem(at), n));
      } else {
        s.ops.push_back(dp_.iall_gather(shard_params_.mem(b.shard_offset), s.buf.mem(at), n));
      }
    }
    s.weights16 = s16_ ? s.buf16.data() : nullptr;
    s.widen_pending = s16_.has_value();
    if (later.empty()) return;
    s.then_start = [this, &s, later, slot]() mutable {
      for (Slice& sl : later)
        if (swap_) {
          if (s16_) finish_read(*sl.b, sl.read, reinterpret_cast<const uint16_t*>(sl.src));
          else finish_read(*sl.b, sl.read, reinterpret_cast<const float*>(sl.src));
          if (link_) sl.copy = link_->copy_to_device(slot + sl.mine * elem_, sl.src, sl.n * elem_);
        }
      for (const Slice& sl : later) {
        if (link_) link_->wait(sl.copy);
        s.ops.push_back(s16_ ? dp_.iall_gather(s.buf16.mem(sl.mine), s.buf16.mem(sl.at), sl.n)
                             : dp_.iall_gather(s.buf.mem(sl.mine), s.buf.mem(sl.at), sl.n));
      }
    };
  }
  // The pinned buffer slot s stages swapped slices in: made at its first fill, as large as the
  // largest unit's slices.
  char* staging_for(const ParamSlot& s) {
    auto it = staging_.find(&s);
    if (it == staging_.end()) {
      size_t most = 0;
      for (const Unit& u : L_.units) most = std::max(most, u.size / dp_.size() + 1);
      it = staging_.emplace(&s, PinnedBuffer(be_, most * elem_)).first;
    }
    return it->second.data();
  }
  const char* resident_at(const Bucket& b) const {  // a persistent bucket, whole
    return s16_ ? reinterpret_cast<const char*>(resident16_.data() + b.resident_offset)
                : reinterpret_cast<const char*>(resident_.data() + b.resident_offset);
  }
  const char* kept_at(const Bucket& b) const {  // this rank's kept slice of bucket b
    return s16_ ? reinterpret_cast<const char*>(params16_.data() + b.shard_offset)
                : reinterpret_cast<const char*>(shard_params_.data() + b.shard_offset);
  }
  void gather_updated() override {  // the persistent buckets only
    std::vector<PendingOp> ops;
    for (const Bucket& b : L_.buckets) {
      if (!b.persistent) continue;
      const size_t n = b.size / dp_.size(), mine = b.resident_offset + dp_.rank() * n;
      if (s16_) ops.push_back(dp_.iall_gather(slice(b, resident16_.data() + mine, params16_), resident16_.mem(b.resident_offset), n));
      else ops.push_back(dp_.iall_gather(slice(b, resident_.data() + mine, shard_params_), resident_.mem(b.resident_offset), n));
    }
    for (auto& op : ops) op.wait();
  }
  void read_weights16(const Piece& p, uint16_t* out) const override {  // the slices in shard order
    const Bucket& b = view_.bucket_of(p.tensor);
    const size_t at = b.shard_offset + view_.offset_in_owned(p);
    if (host_slices_) return static_cast<void>(std::copy_n(params16_.data() + at, p.size, out));
    if (!swap_) return be_.copy_to_host(out, params16_.data() + at, p.size * sizeof(uint16_t));
    std::vector<uint16_t> slice(b.size / dp_.size());  // read and checked whole
    read_slice(b, slice.data());
    std::copy_n(slice.begin() + (at - b.shard_offset), p.size, out);
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
  // This rank's slice of bucket b (kept in `kept`) as the send buffer of an all-gather: where it is
  // kept in the backend's memory, or else brought into `dst`, its place in the receive buffer (the
  // gather runs in place): read from the swap file, or copied up from host memory.
  template <class T>
  MemRef<const T> slice(const Bucket& b, T* dst, const DeviceBuffer<T>& kept) {
    if (!swap_ && !host_slices_) return kept.mem(b.shard_offset);
    const size_t n = b.size / dp_.size();
    if (!link_) {  // the host backend: straight into place
      read_slice(b, dst);
      return host_mem(static_cast<const T*>(dst));
    }
    if (host_slices_) {  // from a device: kept in host memory, up into place
      be_.copy_from_host(dst, kept.data() + b.shard_offset, n * sizeof(T));
    } else {  // from a device: read into host memory, then up into place
      std::vector<T> host(n);
      read_slice(b, host.data());
      be_.copy_from_host(dst, host.data(), n * sizeof(T));
    }
    return be_.mem(static_cast<const T*>(dst));
  }
  // Bucket b's slice from the swap file into dst, checked against the sum it was written with.
  template <class T>
  void read_slice(const Bucket& b, T* dst) const {
    finish_read(b, swap_->read(b.shard_offset * elem_, dst, b.size / dp_.size() * elem_), dst);
  }
  template <class T>
  void finish_read(const Bucket& b, SwapFile::Ticket ticket, T* dst) const {
    const size_t n = b.size / dp_.size();
    swap_wait(*swap_, ticket);
    if (!swap_->sizing() && sum_of(dst, n, b.shard_offset) != sums_[&b - L_.buckets.data()])
      swap_failed(strprintf("swap file '%s': the slice of bucket %zu (%zu bytes at offset %zu) does not read back "
                            "what was written (checksum mismatch: the file was changed under the run)",
                            swap_->path().c_str(), static_cast<size_t>(&b - L_.buckets.data()), n * elem_,
                            b.shard_offset * elem_));
  }

  size_t elem_;
  bool host_slices_ = false;  // the kept slices are in host memory (offload_param cpu from a device)
  std::unordered_map<const ParamSlot*, PinnedBuffer> staging_;  // swapped, from a device: per slot
  std::vector<uint64_t> sums_;  // swapped: per bucket, the checksum of its slice as written
  DeviceBuffer<float> shard_params_, resident_;
  DeviceBuffer<uint16_t> params16_, resident16_;
};

}  // namespace

std::unique_ptr<ParamStorage> make_param_storage(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                                 const ShardView& view, const ZeroConfig& zero,
                                                 const std::optional<Storage16>& s16, OptimizerState& state,
                                                 const std::string& param_swap, const SwapFile::Options& swap_options,
                                                 HostLink* link) {
  if (zero.stage < 3) return std::make_unique<FullParams>(be, dp, layout, view, zero, s16, state, link);
  return std::make_unique<ShardedParams>(be, dp, layout, view, zero, s16, state, param_swap, swap_options, link);
}

}  // namespace zero3d
