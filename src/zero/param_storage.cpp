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

namespace {

// The kept weights' precision, a part chosen once (make_param_storage) as the storages' template
// argument K; K::W is a kept element. Kept32: fp32 weights, the master's own bits, so each step is
// the identity (a copy, or the pointer itself). Kept16: the master rounded to 16 bits (mixed).
//   host(x):                 fp32 values on the host as kept
//   round(be, dst, src, n):  the master as kept weights, on be (fp32: only from a master in
//                            host memory, into host memory: a memcpy)
//   kept_of(be, src, w, n):  the master as kept weights, in w where they differ
//   fp32(p), bits16(p):      kept weights as the model's fp32 or the update's 16 bits, else nullptr
//   slot(s), widen_from:     the pool slot's buffer the gathers fill; what the pool then widens
struct Kept32 {
  using W = float;
  explicit Kept32(const std::optional<Storage16>&) {}
  const std::vector<float>& host(const std::vector<float>& x) const { return x; }
  void round(Backend&, float* dst, const float* src, size_t n) const { std::memcpy(dst, src, n * sizeof(float)); }
  const float* kept_of(Backend&, const float* src, std::vector<float>&, size_t) const { return src; }
  static float* fp32(float* p) { return p; }
  static uint16_t* bits16(const float*) { return nullptr; }
  static DeviceBuffer<float>& slot(ParamSlot& s) { return s.buf; }
  static void widen_from(ParamSlot& s, const float*) {
    s.weights16 = nullptr;
    s.widen_pending = false;
  }
};
struct Kept16 {
  using W = uint16_t;
  explicit Kept16(const std::optional<Storage16>& s) : s16(*s) {}
  std::vector<uint16_t> host(const std::vector<float>& x) const { return s16.narrow_host(x); }
  void round(Backend& be, uint16_t* dst, const float* src, size_t n) const {
    Storage16(be, s16.type()).narrow(dst, src, n);
  }
  const uint16_t* kept_of(Backend& be, const float* src, std::vector<uint16_t>& w, size_t n) const {
    w.resize(n);
    round(be, w.data(), src, n);
    return w.data();
  }
  static float* fp32(uint16_t*) { return nullptr; }
  static uint16_t* bits16(uint16_t* p) { return p; }
  static const uint16_t* bits16(const uint16_t* p) { return p; }
  static DeviceBuffer<uint16_t>& slot(ParamSlot& s) { return s.buf16; }
  static void widen_from(ParamSlot& s, const uint16_t* w) {  // the pool widens the slot from w
    s.weights16 = w;
    s.widen_pending = true;
  }
  const Storage16& s16;
};

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

// With the master in host memory (link): master elements [0, n) as the kept weights, rounded on
// the CPU into an upload buffer of the link.
template <class K>
const char* stage_weights(HostLink& link, const K& k, const float* master, size_t n) {
  char* buf = link.upload_buffer();
  k.round(link.cpu(), reinterpret_cast<typename K::W*>(buf), master, n);
  return buf;
}

// Stages 0-2: the whole flat layout on every rank.
template <class K>
class FullParams final : public ParamStorage {
  using W = typename K::W;

 public:
  FullParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& zero,
             const K& k, OptimizerState& state, HostLink* link)
      : ParamStorage(be, dp, L, view, state, link), k_(k), stage0_(zero.stage == 0),
        gather_limit_(static_cast<size_t>(zero.allgather_bucket_size)) {
    params_ = DeviceBuffer<W>(be, L.total, BufferUse::comm);
    param_bytes_ = params_.bytes();
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
      const auto& h = k_.host(kept);
      be_.copy_from_host(params_.data() + b.offset, h.data(), h.size() * sizeof(W));
    }
  }
  float* owned(const Bucket& b) override {
    return state_.has_master() ? nullptr : K::fp32(params_.data() + view_.owned_offset(b));
  }
  // Mixed: round into the weights; master in host memory: stage and upload, per bucket's owned range.
  void take_updated(size_t begin, size_t n, const float* master) override {
    if (!state_.has_master()) return;  // fp32: Adam updated the kept parameters in place
    if (link_ && n > link_->span_max()) return split_updated(begin, n, master);
    const char* staged = link_ ? stage_weights(*link_, k_, master, n) : nullptr;
    for (const Bucket& b : L_.buckets) {
      const size_t base = view_.state_base(b);
      const size_t lo = std::max(begin, base), hi = std::min(begin + n, base + view_.owned_size(b));
      if (lo >= hi) continue;
      W* dst = params_.data() + view_.owned_offset(b) + (lo - base);
      if (link_) link_->upload(dst, staged + (lo - begin) * sizeof(W), (hi - lo) * sizeof(W));
      else k_.round(be_, dst, master + (lo - begin), hi - lo);
    }
  }
  uint16_t* owned16(const Bucket& b) override {
    return link_ ? nullptr : K::bits16(params_.data() + view_.owned_offset(b));
  }
  const float* resident_unit(int unit) override { return K::fp32(params_.data() + L_.units[unit].offset); }
  void fill(ParamSlot& s, int unit) override { K::widen_from(s, params_.data() + L_.units[unit].offset); }
  void gather_updated() override {  // in messages of up to allgather_bucket_size elements, spanning units
    if (stage0_) return;  // every rank updated everything
    std::vector<PendingOp> ops;
    for (const BucketMessage& run : bucket_messages(L_, 0, static_cast<int>(L_.buckets.size()), gather_limit_)) {
      const MessageSlices pieces{slice_counts(L_, run)};
      ops.push_back(dp_.iall_gather_in_place(params_.mem(L_.buckets[run.first].offset), pieces));
    }
    for (auto& op : ops) op.wait();
  }
  void read_weights16(const Piece& p, uint16_t* out) const override {
    const size_t at = view_.owned_offset(view_.bucket_of(p.tensor)) + view_.offset_in_owned(p);
    be_.copy_to_host(out, K::bits16(params_.data() + at), p.size * sizeof(uint16_t));
  }
  Replicated replicated() const override {  // everything, at its flat offset
    std::vector<std::pair<size_t, size_t>> tensors;
    for (const Bucket& b : L_.buckets)
      for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t)
        tensors.push_back({static_cast<size_t>(t), L_.tensors[t].offset});
    return {params_.data(), L_.total, sizeof(W), std::move(tensors)};
  }

 private:
  K k_;
  bool stage0_;
  size_t gather_limit_;  // allgather_bucket_size
  DeviceBuffer<W> params_;
};

// Stage 3: this rank's slice of every bucket (in memory, or in a swap file with offload_param on
// nvme), and the persistent buckets whole (always in the backend's memory). On a device backend
// with the optimizer offloaded (link_), offload_param keeps the slices in host memory (cpu) or
// the swap file (nvme, read into a pinned staging buffer per slot); a fill copies them up into
// their place in the slot through the link, and the all-gather runs in place there.
template <class K>
class ShardedParams final : public ParamStorage {
  using W = typename K::W;
  static constexpr size_t elem_ = sizeof(W);

 public:
  ShardedParams(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& zero,
                const K& k, OptimizerState& state, const std::string& swap, const SwapFile::Options& swap_options,
                HostLink* link)
      : ParamStorage(be, dp, L, view, state, link), k_(k) {
    // Where the kept slices live: the backend's memory, or host memory (offload_param cpu from a device).
    Backend& keep = link_ && zero.offload_param.device == OffloadDevice::cpu ? link_->cpu() : be;
    host_slices_ = &keep != &be;
    if (!swap.empty()) {
      swap_ = std::make_unique<SwapFile>(swap, uint64_t(L.shard_size) * elem_, swap_options);
      swapped_bytes_ = L.shard_size * elem_;
      sums_.assign(L.buckets.size(), 0);
    } else {
      kept_ = DeviceBuffer<W>(keep, L.shard_size, BufferUse::comm);
    }
    resident_ = DeviceBuffer<W>(be, L.resident_size, BufferUse::comm);
    (host_slices_ ? host_bytes_ : param_bytes_) += kept_.bytes();
    param_bytes_ += resident_.bytes();
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
      } else {  // fp32 in the backend's memory: the kept slices are the master
        be_.copy_from_host(K::fp32(kept_.data() + b.shard_offset), kept.data(), kept.size() * sizeof(float));
      }
      if (b.persistent)
        gpt_initial_params(L_, n_layer, seed, b.offset, b.offset + b.size, resident.data() + b.resident_offset);
    }
    const auto& h = k_.host(resident);
    be_.copy_from_host(resident_.data(), h.data(), h.size() * sizeof(W));
  }
  float* owned(const Bucket& b) override {
    return state_.has_master() ? nullptr : K::fp32(kept_.data() + b.shard_offset);  // else: master in the state
  }
  uint16_t* owned16(const Bucket& b) override {  // state order = shard order
    return link_ || swap_ || host_slices_ ? nullptr : K::bits16(kept_.data() + b.shard_offset);
  }
  void take_updated(size_t begin, size_t n, const float* master) override {  // state order = shard order
    if (link_ && n > link_->span_max()) return split_updated(begin, n, master);
    if (!swap_) {
      if (host_slices_) k_.round(link_->cpu(), kept_.data() + begin, master, n);  // both in host memory
      else if (link_) link_->upload(kept_.data() + begin, stage_weights(*link_, k_, master, n), n * elem_);
      else k_.round(be_, kept_.data() + begin, master, n);
      return;
    }
    if (begin == 0) std::fill(sums_.begin(), sums_.end(), 0);  // a new pass over the whole shard
    if (swap_->sizing()) {  // zero3d plan: the write counted, nothing narrowed or summed
      swap_->write(begin * elem_, master, n * elem_);
      return;
    }
    std::vector<W> w;  // swapping runs on the host backend only: host pointers
    const W* data = k_.kept_of(link_ ? link_->cpu() : be_, master, w, n);  // the master is in host memory
    for (size_t i = 0; i < L_.buckets.size(); ++i) {  // each bucket slice's part of the span
      const Bucket& b = L_.buckets[i];
      const size_t lo = std::max(begin, b.shard_offset), hi = std::min(begin + n, b.shard_offset + b.size / dp_.size());
      if (lo < hi) sums_[i] += sum_of(data + (lo - begin), hi - lo, lo);
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
    DeviceBuffer<W>& buf = K::slot(s);
    char* slot = reinterpret_cast<char*>(buf.data());
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
      } else {
        s.ops.push_back(dp_.iall_gather(kept_.mem(b.shard_offset), buf.mem(at), n));
      }
    }
    K::widen_from(s, buf.data());
    if (later.empty()) return;
    s.then_start = [this, &s, &buf, later, slot]() mutable {
      for (Slice& sl : later)
        if (swap_) {
          finish_read(*sl.b, sl.read, reinterpret_cast<const W*>(sl.src));
          if (link_) sl.copy = link_->copy_to_device(slot + sl.mine * elem_, sl.src, sl.n * elem_);
        }
      for (const Slice& sl : later) {
        if (link_) link_->wait(sl.copy);
        s.ops.push_back(dp_.iall_gather(buf.mem(sl.mine), buf.mem(sl.at), sl.n));
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
    return reinterpret_cast<const char*>(resident_.data() + b.resident_offset);
  }
  const char* kept_at(const Bucket& b) const {  // this rank's kept slice of bucket b
    return reinterpret_cast<const char*>(kept_.data() + b.shard_offset);
  }
  void gather_updated() override {  // the persistent buckets only
    std::vector<PendingOp> ops;
    for (const Bucket& b : L_.buckets) {
      if (!b.persistent) continue;
      const size_t n = b.size / dp_.size(), mine = b.resident_offset + dp_.rank() * n;
      ops.push_back(dp_.iall_gather(slice(b, resident_.data() + mine, kept_), resident_.mem(b.resident_offset), n));
    }
    for (auto& op : ops) op.wait();
  }
  void read_weights16(const Piece& p, uint16_t* out) const override {  // the slices in shard order
    const Bucket& b = view_.bucket_of(p.tensor);
    const size_t at = b.shard_offset + view_.offset_in_owned(p);
    if (host_slices_) {
      const uint16_t* kept16 = K::bits16(kept_.data() + at);
      Z3D_ASSERT(kept16 != nullptr, "read_weights16 of fp32 weights");  // mixed only
      return static_cast<void>(std::copy_n(kept16, p.size, out));
    }
    if (!swap_) return be_.copy_to_host(out, K::bits16(kept_.data() + at), p.size * sizeof(uint16_t));
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
    return {resident_.data(), L_.resident_size, elem_, std::move(tensors)};
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

  K k_;
  bool host_slices_ = false;  // the kept slices are in host memory (offload_param cpu from a device)
  std::unordered_map<const ParamSlot*, PinnedBuffer> staging_;  // swapped, from a device: per slot
  std::vector<uint64_t> sums_;  // swapped: per bucket, the checksum of its slice as written
  DeviceBuffer<W> kept_, resident_;  // this rank's slices (in memory), the persistent buckets whole
};

}  // namespace

std::unique_ptr<ParamStorage> make_param_storage(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                                 const ShardView& view, const ZeroConfig& zero,
                                                 const std::optional<Storage16>& s16, OptimizerState& state,
                                                 const std::string& param_swap, const SwapFile::Options& swap_options,
                                                 HostLink* link) {
  auto make = [&](auto kept) -> std::unique_ptr<ParamStorage> {  // the stage's storage, in the precision's weights
    using K = decltype(kept);
    if (zero.stage < 3) return std::make_unique<FullParams<K>>(be, dp, layout, view, zero, kept, state, link);
    return std::make_unique<ShardedParams<K>>(be, dp, layout, view, zero, kept, state, param_swap, swap_options, link);
  };
  return s16 ? make(Kept16(s16)) : make(Kept32(s16));  // the precision, chosen once
}

}  // namespace zero3d
