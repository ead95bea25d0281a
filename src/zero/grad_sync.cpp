#include "zero/grad_sync.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/check.h"

namespace zero3d {

namespace {

template <typename T>
MemRef<char> bytes_of(MemRef<T> m) {
  return {reinterpret_cast<char*>(m.ptr), m.kind};
}

// The collective that reduces one message of gradients, chosen once at construction: all-reduce
// in place, or reduce-scatter into the owners' slices; of fp32 or of 16-bit gradients (the type).
// The message is n elements at element `at` of send; this rank's slices land at element `slice_at`
// of recv (reduce-scatter only: recv is empty otherwise).
struct GradReduce {
  bool scatter = false;
  CommType type = CommType::f32;
  PendingOp issue(ProcessGroup& dp, MemRef<char> send, size_t at, MemRef<char> recv, size_t slice_at, size_t n,
                  const MessageSlices& s) const {
    const size_t e = elem_bytes(type);
    return scatter ? dp.reduce_scatter(send + at * e, recv + slice_at * e, s, type)
                   : dp.all_reduce(send + at * e, n, type, RedOp::sum);
  }
};

// A full-size gradient buffer for one unit at a time, with the receive buffers of its
// reductions and the requests still in flight. In mixed precision g16 holds the unit's gradient
// rounded to 16 bits (what is reduced), recv16 the reduced slices, recv their widening.
struct Slab {
  DeviceBuffer<float> grads, recv;
  DeviceBuffer<uint16_t> g16, recv16;
  MemRef<char> send_bytes, recv_bytes;  // what the reductions send (grads or g16) and land in (recv or recv16)
  int unit = -1;
  bool reducing = false;  // done() has posted its reductions (the unit may be open in another slab)
  std::vector<PendingOp> ops;
};

// The unit buffers backward accumulates into: the embeddings' own and two rotating ones for
// the rest, so one unit's reduction can be in flight while the next is computed.
class SlabSync : public GradSync {
 protected:
  SlabSync(Backend& be, const FlatLayout& L) : be_(be), L_(L) {}
  ~SlabSync() override {
    for (auto& s : slabs_) s->ops.clear();  // waits for anything in flight
  }

  void make_slabs(int p, bool recv, bool g16, bool recv16) {
    size_t max_block = 0;
    for (size_t u = 1; u + 1 < L_.units.size(); ++u) max_block = std::max(max_block, L_.units[u].size);
    const size_t max_rest = std::max(max_block, L_.units.back().size);
    for (size_t n : {L_.units[0].size, max_rest, max_rest}) {
      auto s = std::make_unique<Slab>();
      s->grads = DeviceBuffer<float>(be_, n, BufferUse::comm);
      if (recv) s->recv = DeviceBuffer<float>(be_, n / p);
      if (g16) s->g16 = DeviceBuffer<uint16_t>(be_, n, BufferUse::comm);
      if (recv16) s->recv16 = DeviceBuffer<uint16_t>(be_, n / p);
      s->send_bytes = g16 ? bytes_of(s->g16.mem()) : bytes_of(s->grads.mem());
      s->recv_bytes = recv16 ? bytes_of(s->recv16.mem()) : bytes_of(s->recv.mem());
      buffer_bytes_ += s->grads.bytes() + s->recv.bytes() + s->g16.bytes() + s->recv16.bytes();
      slabs_.push_back(std::move(s));
    }
  }

  // Waits for a slab's reductions and lands their result (nothing for a slab without any).
  virtual void complete(Slab& s) { (void)s; }

  float* take(int unit) {
    Slab* s = nullptr;
    if (unit == 0) {
      s = slabs_[0].get();
    } else {
      s = slabs_[1 + next_slab_].get();
      next_slab_ = 1 - next_slab_;
    }
    complete(*s);  // its previous unit's reduction must land before the buffer is reused
    s->unit = unit;
    be_.zero(s->grads.data(), L_.units[unit].size * sizeof(float));
    for (auto& other : slabs_)  // progress the other reductions (MPI has no progress thread)
      for (auto& op : other->ops) op.test();
    return s->grads.data();
  }

  // The slab accumulating `unit` now (an older one may still be reducing it), marked reducing,
  // with the injected inf if one is due.
  Slab& close(int unit) {
    Slab* s = nullptr;
    for (auto& c : slabs_)
      if (c->unit == unit && !c->reducing) s = c.get();
    Z3D_ASSERT(s != nullptr, "grads_done for a unit that holds no gradient buffer");
    s->reducing = true;
    if (inject_inf_) {  // fault injection: an overflowed gradient
      const float inf = std::numeric_limits<float>::infinity();
      be_.copy_from_host(s->grads.data(), &inf, sizeof inf);
      inject_inf_ = false;
    }
    return *s;
  }

  Backend& be_;
  const FlatLayout& L_;
  std::vector<std::unique_ptr<Slab>> slabs_;
  int next_slab_ = 0;
  bool inject_inf_ = false;
};

// Stages 0-1: the full gradient accumulates over the micro-batches. Its buckets are reduced
// unit by unit as the last micro-batch's backward completes each unit (overlap_comm), or all at
// the boundary. Stage 1 reduce-scatters each bucket into the rank's shard of the gradient.
// The schedule is here; where backward accumulates and what the optimizer reads is the
// precision's (BoundarySync32, BoundarySync16).
class BoundarySync : public SlabSync {
 public:
  void begin_step(int micro_batches) override {
    micro_batches_ = micro_batches;
    std::fill(micro_done_.begin(), micro_done_.end(), 0);
    std::fill(started_.begin(), started_.end(), false);
    be_.zero(send_.ptr, grad_bytes_);  // the accumulator is what the reductions send
  }
  float* acquire(int unit) override {
    for (auto& op : ops_) op.test();  // progress the reductions in flight (MPI has no progress thread)
    return accumulator(unit);
  }
  void done(int unit) override {
    land(unit);
    if (overlap_ && ++micro_done_[unit] == micro_batches_) start(unit);  // the unit's gradient is final
  }
  void finish() override {
    if (overlap_)
      for (size_t u = 0; u < L_.units.size(); ++u) start(static_cast<int>(u));  // what is not in flight yet
    else
      reduce(0, static_cast<int>(L_.buckets.size()));  // everything now: a message may span units
    for (auto& op : ops_) op.wait();
    ops_.clear();
    widen();
  }

 protected:
  // type: what the reductions sum (the accumulator's element type).
  BoundarySync(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& cfg,
               CommType type)
      : SlabSync(be, L), dp_(dp), view_(view), stage_(cfg.stage), scatter_(cfg.stage == 1 && cfg.reduce_scatter),
        overlap_(cfg.overlap_comm), limit_(static_cast<size_t>(cfg.reduce_bucket_size)), reduce_{scatter_, type},
        micro_done_(L.units.size(), 0), started_(L.units.size(), false) {}
  virtual float* accumulator(int unit) = 0;  // where backward accumulates the unit's gradient
  virtual void land(int unit) { (void)unit; }  // backward finished the unit: into the accumulator
  virtual void widen() {}  // after the reductions: the fp32 gradients the optimizer reads

  ProcessGroup& dp_;
  const ShardView& view_;
  int stage_;
  bool scatter_;  // stage 1 with reduce_scatter: reduce-scatter, else all-reduce
  MemRef<char> send_, recv_;  // the reductions' buffers (set by the precision): the accumulator, the shard

 private:
  // Issues the reductions of a unit's buckets, once per step.
  void start(int unit) {
    if (started_[unit]) return;
    started_[unit] = true;
    const Unit& u = L_.units[unit];
    reduce(u.first_bucket, u.first_bucket + u.num_buckets);
  }
  // Issues the reductions of buckets [first, last) in messages of up to reduce_bucket_size
  // elements: all-reduce in place, or reduce-scatter into the shard.
  void reduce(int first, int last) {
    for (const BucketMessage& run : bucket_messages(L_, first, last, limit_)) {
      const Bucket &b = L_.buckets[run.first], &end = L_.buckets[run.last - 1];
      const size_t n = end.offset + end.size - b.offset;
      ops_.push_back(reduce_.issue(dp_, send_, b.offset, recv_, b.shard_offset, n, MessageSlices{slice_counts(L_, run)}));
    }
  }

  bool overlap_;
  size_t limit_;  // reduce_bucket_size
  GradReduce reduce_;
  int micro_batches_ = 1;
  std::vector<int> micro_done_;  // per unit: micro-batches whose backward completed it this step
  std::vector<bool> started_;    // per unit: its reductions were issued this step
  std::vector<PendingOp> ops_;
};

// fp32: backward accumulates into the full gradient in place, which is reduced as it is.
class BoundarySync32 final : public BoundarySync {
 public:
  BoundarySync32(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& cfg)
      : BoundarySync(be, dp, L, view, cfg, CommType::f32) {
    grads_ = DeviceBuffer<float>(be, L.total, BufferUse::comm);
    if (scatter_) shard_ = DeviceBuffer<float>(be, L.shard_size);  // laid out like the shard (b.shard_offset)
    grad_bytes_ = grads_.bytes();
    buffer_bytes_ += shard_.bytes();
    send_ = bytes_of(grads_.mem());
    recv_ = bytes_of(shard_.mem());
  }
  float* owned(const Bucket& b) override {
    return scatter_ ? shard_.data() + b.shard_offset : grads_.data() + view_.owned_offset(b);
  }
  void inject_inf() override {  // straight into the gradient
    const float inf = std::numeric_limits<float>::infinity();
    be_.copy_from_host(grads_.data(), &inf, sizeof inf);
  }

 private:
  float* accumulator(int unit) override { return grads_.data() + L_.units[unit].offset; }

  DeviceBuffer<float> grads_, shard_;
};

// Mixed: backward's fp32 unit gradient (in a unit buffer) is rounded into the full 16-bit
// gradient, which is reduced; the optimizer's part of the result is widened into grads32_
// (laid out like the master).
class BoundarySync16 final : public BoundarySync {
 public:
  BoundarySync16(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ShardView& view, const ZeroConfig& cfg,
                 const Storage16& s16)
      : BoundarySync(be, dp, L, view, cfg, comm_type(s16.type())), s16_(s16) {
    grads16_ = DeviceBuffer<uint16_t>(be, L.total, BufferUse::comm);
    if (scatter_) shard16_ = DeviceBuffer<uint16_t>(be, L.shard_size);
    make_slabs(dp.size(), false, false, false);
    grads32_ = DeviceBuffer<float>(be, stage_ == 0 ? L.total : L.shard_size);
    grad_bytes_ = grads16_.bytes();
    buffer_bytes_ += shard16_.bytes() + grads32_.bytes();
    send_ = bytes_of(grads16_.mem());
    recv_ = bytes_of(shard16_.mem());
  }
  float* owned(const Bucket& b) override { return grads32_.data() + view_.state_base(b); }  // laid out like the master
  void inject_inf() override { inject_inf_ = true; }  // at the next unit backward hands over

 private:
  float* accumulator(int unit) override { return take(unit); }
  void land(int unit) override {
    Slab& s = close(unit);
    const Unit& u = L_.units[unit];
    s16_.accumulate(grads16_.data() + u.offset, s.grads.data(), u.size);
    s.unit = -1;
    s.reducing = false;
  }
  void widen() override {
    if (stage_ == 0) return s16_.widen(grads32_.data(), grads16_.data(), L_.total);
    for (const Bucket& b : L_.buckets)
      s16_.widen(owned(b), scatter_ ? shard16_.data() + b.shard_offset : grads16_.data() + view_.owned_offset(b),
                 view_.owned_size(b));
  }

  const Storage16& s16_;
  DeviceBuffer<float> grads32_;
  DeviceBuffer<uint16_t> grads16_, shard16_;
};

// Stages 2-3: each unit's gradient is reduced as soon as backward hands it over, into the
// rank's shard. The schedule is here; what is reduced and how it lands in the shard is the
// precision's (UnitSync32, UnitSync16).
class UnitSync : public SlabSync {
 public:
  float* acquire(int unit) override { return take(unit); }
  void done(int unit) override {
    Slab& s = close(unit);
    const Unit& u = L_.units[unit];
    narrow(s, u);
    const size_t shard_base = L_.buckets[u.first_bucket].shard_offset;
    // In messages of up to reduce_bucket_size elements.
    for (const BucketMessage& run : bucket_messages(L_, u.first_bucket, u.first_bucket + u.num_buckets, limit_)) {
      const Bucket &b = L_.buckets[run.first], &end = L_.buckets[run.last - 1];
      const size_t at = b.offset - u.offset, slice_at = b.shard_offset - shard_base;
      const size_t n = end.offset + end.size - b.offset;
      const MessageSlices pieces{slice_counts(L_, run)};
      s.ops.push_back(reduce_.issue(dp_, s.send_bytes, at, s.recv_bytes, slice_at, n, pieces));
    }
    if (!overlap_) complete(s);
  }
  void finish() override {
    for (auto& s : slabs_) complete(*s);
    widen();
  }
  void begin_step(int) override { be_.zero(shard_acc_, grad_bytes_); }
  float* owned(const Bucket& b) override { return shard32_ + b.shard_offset; }
  void inject_inf() override { inject_inf_ = true; }

 protected:
  UnitSync(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ZeroConfig& cfg, CommType type)
      : SlabSync(be, L), dp_(dp), scatter_(cfg.reduce_scatter), overlap_(cfg.overlap_comm),
        limit_(static_cast<size_t>(cfg.reduce_bucket_size)), reduce_{scatter_, type} {}
  virtual void narrow(Slab& s, const Unit& u) { (void)s, (void)u; }  // the unit's gradient as reduced
  // Adds bucket b's n reduced elements into the shard gradients: they are at `at` of the unit's
  // gradient (all-reduce), or at `recv_at` of the slab's receive buffers (reduce-scatter).
  virtual void land(Slab& s, const Bucket& b, size_t at, size_t recv_at, size_t n) = 0;
  virtual void widen() {}  // after the reductions: the fp32 gradients the optimizer reads

  ProcessGroup& dp_;
  bool scatter_;
  // Set by the precision: the shard's accumulator (grad_bytes_ of it, zeroed each step) and its fp32
  // gradients (what the optimizer reads: the accumulator itself in fp32).
  void* shard_acc_ = nullptr;
  float* shard32_ = nullptr;

 private:
  // Waits for a slab's reductions and adds the rank's reduced slices into the shard gradients.
  void complete(Slab& s) override {
    if (s.unit < 0) return;
    for (auto& op : s.ops) op.wait();
    s.ops.clear();
    const Unit& u = L_.units[s.unit];
    const size_t shard_base = L_.buckets[u.first_bucket].shard_offset;
    for (int i = u.first_bucket; i < u.first_bucket + u.num_buckets; ++i) {
      const Bucket& b = L_.buckets[i];
      const size_t n = b.size / dp_.size(), at = b.offset - u.offset + L_.slice(b, dp_.rank()).offset;
      land(s, b, at, b.shard_offset - shard_base, n);
    }
    s.unit = -1;
    s.reducing = false;
  }

  bool overlap_;
  size_t limit_;  // reduce_bucket_size
  GradReduce reduce_;
};

// fp32: the unit's gradient is reduced as it is and accumulated into the shard.
class UnitSync32 final : public UnitSync {
 public:
  UnitSync32(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ZeroConfig& cfg)
      : UnitSync(be, dp, L, cfg, CommType::f32) {
    shard_grads_ = DeviceBuffer<float>(be, L.shard_size);
    make_slabs(dp.size(), scatter_, false, false);
    grad_bytes_ = shard_grads_.bytes();
    shard_acc_ = shard32_ = shard_grads_.data();
  }

 private:
  void land(Slab& s, const Bucket& b, size_t at, size_t recv_at, size_t n) override {
    be_.accumulate(shard_grads_.data() + b.shard_offset, scatter_ ? s.recv.data() + recv_at : s.grads.data() + at, n);
  }

  DeviceBuffer<float> shard_grads_;
};

// Mixed: the unit's gradient is rounded to 16 bits (g16) and reduced; the reduced slices are
// widened (into the slab's recv) and accumulated into the 16-bit shard, widened at the boundary.
class UnitSync16 final : public UnitSync {
 public:
  UnitSync16(Backend& be, ProcessGroup& dp, const FlatLayout& L, const ZeroConfig& cfg, const Storage16& s16)
      : UnitSync(be, dp, L, cfg, comm_type(s16.type())), s16_(s16) {
    shard_grads16_ = DeviceBuffer<uint16_t>(be, L.shard_size);
    make_slabs(dp.size(), true, true, scatter_);
    grads32_ = DeviceBuffer<float>(be, L.shard_size);
    grad_bytes_ = shard_grads16_.bytes();
    buffer_bytes_ += grads32_.bytes();
    shard_acc_ = shard_grads16_.data();
    shard32_ = grads32_.data();
  }

 private:
  void narrow(Slab& s, const Unit& u) override { s16_.narrow(s.g16.data(), s.grads.data(), u.size); }
  void land(Slab& s, const Bucket& b, size_t at, size_t recv_at, size_t n) override {
    float* recv = s.recv.data() + recv_at;
    s16_.widen(recv, scatter_ ? s.recv16.data() + recv_at : s.g16.data() + at, n);
    s16_.accumulate(shard_grads16_.data() + b.shard_offset, recv, n);
  }
  void widen() override { s16_.widen(grads32_.data(), shard_grads16_.data(), L_.shard_size); }

  const Storage16& s16_;
  DeviceBuffer<float> grads32_;
  DeviceBuffer<uint16_t> shard_grads16_;
};

}  // namespace

// The precision is chosen here, once: the fp32 and the mixed variant of each stage family.
std::unique_ptr<GradSync> make_grad_sync(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                         const ShardView& view, const ZeroConfig& cfg,
                                         const std::optional<Storage16>& s16) {
  if (cfg.stage < 2) {
    if (s16) return std::make_unique<BoundarySync16>(be, dp, layout, view, cfg, *s16);
    return std::make_unique<BoundarySync32>(be, dp, layout, view, cfg);
  }
  if (s16) return std::make_unique<UnitSync16>(be, dp, layout, cfg, *s16);
  return std::make_unique<UnitSync32>(be, dp, layout, cfg);
}

}  // namespace zero3d
