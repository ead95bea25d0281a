// Collectives on every group of several 3-D layouts, verifiable on every rank: inputs are small
// integers seeded by (world rank, index), so each rank computes its exact expected result from
// the topology alone; failures are summed over the world into the exit code (nccl-tests style).
// Every data collective runs twice: on host buffers, and on fake device buffers (FakeDevice:
// memory that faults when touched except through its own copies), which the MPI group must stage
// through pinned host buffers it allocates once and reuses; then a fake device library
// (FakeLibrary: NCCL's part) moves them, which the group must hand every device operation to.
// With --cuda the same checks run on a GPU's memory through NCCL (exit 77, skipped, without one).
// usage: mpirun -np N test_collectives [--cuda]
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/shared_memory.h"
#include "kernels/backend.h"
#include "kernels/math/dtype.h"
#include "parallel/groups.h"
#include "parallel/shm_collectives.h"

using namespace zero3d;

static int failures = 0, checks = 0;

static void check(bool ok, const std::string& what, int rank) {
  ++checks;
  if (!ok) {
    ++failures;
    fprintf(stderr, "rank %d: FAIL %s\n", rank, what.c_str());
  }
}

static float value(int world_rank, size_t i) { return static_cast<float>((world_rank * 7 + i * 3) % 13); }

// "Device" memory that nobody but this class can read or write: each buffer is its own mapping,
// PROT_NONE except inside to_host/to_device, so a collective that hands a device pointer to MPI
// (or memcpy) faults instead of passing.
class FakeDevice final : public DeviceMemory {
 public:
  void* alloc(size_t bytes) {
    const size_t len = round_up(std::max<size_t>(bytes, 1));
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) MPI_Abort(MPI_COMM_WORLD, 1);
    regions_.push_back({static_cast<char*>(p), len});
    return p;
  }
  void free(void* p) {
    for (auto it = regions_.begin(); it != regions_.end(); ++it)
      if (it->p == p) {
        munmap(it->p, it->len);
        regions_.erase(it);
        return;
      }
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    open(src, bytes, PROT_READ);
    std::memcpy(dst, src, bytes);
    open(src, bytes, PROT_NONE);
    bytes_to_host += bytes;
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    open(dst, bytes, PROT_READ | PROT_WRITE);
    std::memcpy(dst, src, bytes);
    open(dst, bytes, PROT_NONE);
    bytes_to_device += bytes;
  }
  void synchronize() override {}
  void* alloc_pinned(size_t bytes) override {
    ++pinned_allocs;
    return ::operator new(bytes);
  }
  void free_pinned(void* p) override { ::operator delete(p); }
  std::unique_ptr<DeviceCollectives> make_collectives(int size, int rank, const std::string& name,
                                                      bool point_to_point, const Share& share) override;

  size_t bytes_to_host = 0, bytes_to_device = 0, pinned_allocs = 0;
  bool with_library = false;  // make_collectives gives a FakeLibrary
  size_t library_ops = 0, library_groups = 0, library_polls_pending = 0;

 private:
  struct Region {
    char* p;
    size_t len;
  };
  static size_t round_up(size_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (n + page - 1) / page * page;
  }
  void open(const void* at, size_t bytes, int prot) {
    const char* c = static_cast<const char*>(at);
    for (const Region& r : regions_)
      if (c >= r.p && c + bytes <= r.p + r.len) {
        mprotect(r.p, r.len, prot);
        return;
      }
    fprintf(stderr, "FakeDevice: %p (%zu bytes) is not device memory\n", at, bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<Region> regions_;
};

// Where Buf keeps its device copies: the fake device, or (--cuda) a GPU through its backend.
struct TestDevice {
  DeviceMemory* mem;
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
};
static TestDevice* test_device = nullptr;  // non-null: the buffers below live on it

// A device library (NCCL's part) for FakeDevice memory: each operation reads its inputs through
// the device's copies, moves them with non-blocking MPI on the group's own communicator, and at
// completion computes and writes its outputs back. Sums are in group-rank order (all-gathered,
// then added), so results are exact and alike on every rank. Sends and receives match in issue
// order (one tag), as NCCL's do. done() says "not yet" at least once, so callers must poll.
class FakeLibrary final : public DeviceCollectives {
 public:
  FakeLibrary(FakeDevice& dev, int size, int rank, bool p2p, const DeviceMemory::Share& share)
      : dev_(dev), p_(size), r_(rank), p2p_(p2p) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::vector<int> members(size);
    share(&world_rank, members.data(), sizeof(int));
    MPI_Group world = MPI_GROUP_NULL, mine = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, size, members.data(), &mine);
    MPI_Comm_create_group(MPI_COMM_WORLD, mine, 99, &comm_);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    int r = -1;
    MPI_Comm_rank(comm_, &r);
    if (r != rank) fail("the shared ranks are not the group's");
    ++dev_.library_groups;
  }
  ~FakeLibrary() override { MPI_Comm_free(&comm_); }
  std::string describe() const override { return "a fake library"; }
  bool point_to_point() const override { return p2p_; }

  OpPtr all_reduce(void* buf, size_t n, zero3d::CommType t, RedOp op) override {
    auto o = gather_all(buf, n * elem_bytes(t));
    o->then = [this, o = o.get(), buf, n, t, op] {
      std::vector<char> out(n * elem_bytes(t));
      for (size_t i = 0; i < n; ++i) put(out.data(), i, t, reduce(o->all.data(), n, i, t, op));
      dev_.to_device(buf, out.data(), out.size());
    };
    return o;
  }
  OpPtr reduce_scatter(const void* send, void* recv, const MessageSlices& pc, zero3d::CommType t) override {
    const size_t eb = elem_bytes(t), whole = p_ * pc.part();
    auto o = gather_all(send, whole * eb);
    o->then = [this, o = o.get(), recv, pc, t, whole, eb] {
      std::vector<char> out(pc.part() * eb);
      size_t from = 0, at = 0;
      for (size_t c : pc.counts) {
        for (size_t k = 0; k < c; ++k) put(out.data(), at + k, t, reduce(o->all.data(), whole, from + r_ * c + k, t, RedOp::sum));
        from += p_ * c, at += c;
      }
      dev_.to_device(recv, out.data(), out.size());
    };
    return o;
  }
  OpPtr all_gather(const void* send, void* recv, const MessageSlices& pc, zero3d::CommType t) override {
    const size_t eb = elem_bytes(t), part = pc.part();
    std::vector<char> mine(part * eb);
    if (send) {
      dev_.to_host(mine.data(), send, mine.size());
    } else {
      std::vector<char> whole(p_ * part * eb);
      dev_.to_host(whole.data(), recv, whole.size());
      pc.pack(whole.data(), mine.data(), p_, r_, eb);
    }
    auto o = gather_all_host(std::move(mine));
    o->then = [this, o = o.get(), recv, pc, part, eb] {
      std::vector<char> whole(p_ * part * eb);
      for (int q = 0; q < p_; ++q) pc.unpack(o->all.data() + q * part * eb, whole.data(), p_, q, eb);
      dev_.to_device(recv, whole.data(), whole.size());
    };
    return o;
  }
  OpPtr broadcast(void* buf, size_t bytes, int root) override {
    auto o = std::make_unique<Pending>(dev_);
    o->all.resize(bytes);
    if (r_ == root) dev_.to_host(o->all.data(), buf, bytes);
    MPI_Ibcast(o->all.data(), static_cast<int>(bytes), MPI_BYTE, root, comm_, &o->req);
    o->then = [this, o = o.get(), buf, bytes] { dev_.to_device(buf, o->all.data(), bytes); };
    return o;
  }
  OpPtr send(const void* buf, size_t bytes, int peer) override {
    if (!p2p_) fail("send on a group made without point_to_point");
    auto o = std::make_unique<Pending>(dev_);
    o->all.resize(bytes);
    dev_.to_host(o->all.data(), buf, bytes);
    MPI_Isend(o->all.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &o->req);
    return o;
  }
  OpPtr recv(void* buf, size_t bytes, int peer) override {
    if (!p2p_) fail("receive on a group made without point_to_point");
    auto o = std::make_unique<Pending>(dev_);
    o->all.resize(bytes);
    MPI_Irecv(o->all.data(), static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &o->req);
    o->then = [this, o = o.get(), buf, bytes] { dev_.to_device(buf, o->all.data(), bytes); };
    return o;
  }
  void abort() override {}

 private:
  struct Pending final : Op {
    explicit Pending(FakeDevice& d) : dev(d) { ++dev.library_ops; }
    bool done() override {
      if (!polled++) {  // never done at the first poll
        ++dev.library_polls_pending;
        return false;
      }
      int flag = 1;
      if (req != MPI_REQUEST_NULL) MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (flag && then) std::exchange(then, nullptr)();
      return flag != 0;
    }
    FakeDevice& dev;
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<char> mine, all;
    std::function<void()> then;
    int polled = 0;
  };
  [[noreturn]] static void fail(const char* why) {
    fprintf(stderr, "FakeLibrary: %s\n", why);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }
  // Every rank's `bytes` at device pointer `from`, in rank order.
  std::unique_ptr<Pending> gather_all(const void* from, size_t bytes) {
    std::vector<char> mine(bytes);
    dev_.to_host(mine.data(), from, bytes);
    return gather_all_host(std::move(mine));
  }
  std::unique_ptr<Pending> gather_all_host(std::vector<char> mine) {
    auto o = std::make_unique<Pending>(dev_);
    o->mine = std::move(mine);
    o->all.resize(o->mine.size() * p_);
    MPI_Iallgather(o->mine.data(), static_cast<int>(o->mine.size()), MPI_BYTE, o->all.data(),
                   static_cast<int>(o->mine.size()), MPI_BYTE, comm_, &o->req);
    return o;
  }
  static float get(const char* buf, size_t i, zero3d::CommType t) {
    uint16_t h;
    switch (t) {
      case zero3d::CommType::f32: { float f; std::memcpy(&f, buf + 4 * i, 4); return f; }
      case zero3d::CommType::bf16: std::memcpy(&h, buf + 2 * i, 2); return math::float_from_bf16(h);
      case zero3d::CommType::fp16: std::memcpy(&h, buf + 2 * i, 2); return math::float_from_fp16(h);
    }
    return 0;
  }
  static void put(char* buf, size_t i, zero3d::CommType t, float x) {
    if (t == zero3d::CommType::f32) return std::memcpy(buf + 4 * i, &x, 4), void();
    const uint16_t h = t == zero3d::CommType::bf16 ? math::bf16_from_float(x) : math::fp16_from_float(x);
    std::memcpy(buf + 2 * i, &h, 2);
  }
  // Element i over the p ranks' buffers of n elements each (in `all`), in rank order; 16-bit sums
  // round each pairwise addition, as the library and MPI's 16-bit op do.
  float reduce(const char* all, size_t n, size_t i, zero3d::CommType t, RedOp op) const {
    const size_t eb = elem_bytes(t);
    float acc = get(all, i, t);
    for (int q = 1; q < p_; ++q) {
      const float x = get(all + q * n * eb, i, t);
      acc = op == RedOp::max ? std::max(acc, x) : acc + x;
      if (t == zero3d::CommType::bf16) acc = math::float_from_bf16(math::bf16_from_float(acc));
      if (t == zero3d::CommType::fp16) acc = math::float_from_fp16(math::fp16_from_float(acc));
    }
    return acc;
  }
  FakeDevice& dev_;
  int p_, r_;
  bool p2p_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

std::unique_ptr<DeviceCollectives> FakeDevice::make_collectives(int size, int rank, const std::string&,
                                                                bool point_to_point, const Share& share) {
  if (!with_library) return nullptr;
  return std::make_unique<FakeLibrary>(*this, size, rank, point_to_point, share);
}

// A test buffer: its values on the host (data), and where the collective sees them (mem): the
// same memory, or a fake device copy that put() fills and get() reads back. `shared`: the host
// memory is a comm buffer (core/shared_memory.h), which the shared-memory collectives read in place.
template <typename T>
class Buf {
 public:
  Buf(size_t n, T fill, bool shared = false) : n_(n) {
    if (shared) shared_ = static_cast<T*>(alloc_shared(std::max<size_t>(n, 1) * sizeof(T)));
    else host_.resize(n);
    std::fill(data(), data() + n, fill);
    if (test_device) dev_ = static_cast<T*>(test_device->alloc(std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~Buf() {
    if (dev_) test_device->free(dev_);
    if (shared_) free_shared(shared_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T& operator[](size_t i) { return data()[i]; }
  T* data() { return shared_ ? shared_ : host_.data(); }
  size_t size() const { return n_; }
  MemRef<T> mem(size_t at = 0) { return dev_ ? MemRef<T>{dev_ + at, MemKind::device} : host_mem(data() + at); }
  Buf& put() {
    if (dev_) test_device->mem->to_device(dev_, data(), n_ * sizeof(T));
    return *this;
  }
  Buf& get() {
    if (dev_) test_device->mem->to_host(data(), dev_, n_ * sizeof(T));
    return *this;
  }

 private:
  size_t n_;
  std::vector<T> host_;
  T* shared_ = nullptr;
  T* dev_ = nullptr;
};

// Several reduce-scatters and in-place all-gathers as one operation (MessageSlices of unequal counts, one
// empty), float and bf16, both in flight at once: each rank's blocks where the layout puts them.
// Inputs are integers in [-6, 6], so every sum is exact whatever the order. `shared`: inputs in
// comm buffers (the single-copy path, where thresholds allow).
template <typename T>
static void test_pieces(ProcessGroup& g, const std::vector<int>& members, int me, const std::string& tag,
                        bool shared) {
  const int p = g.size(), r = g.rank();
  const MessageSlices pc{{5, 0, 1, 1003, 16}};
  const size_t part = pc.part();
  auto val = [](int m, size_t i) { return value(m, i) - 6.0f; };
  auto enc = [](float x) -> T {
    if constexpr (std::is_same_v<T, float>) return x;
    else return math::bf16_from_float(x);
  };
  auto dec = [](T x) -> float {
    if constexpr (std::is_same_v<T, float>) return x;
    else return math::float_from_bf16(x);
  };
  Buf<T> send(p * part, enc(0), shared), recv(part + 1, enc(-7)), all(p * part, enc(-1), shared);
  for (size_t i = 0; i < send.size(); ++i) send[i] = enc(val(me, i));
  size_t whole = 0;
  for (size_t c : pc.counts) {
    for (size_t j = 0; j < c; ++j) all[whole + r * c + j] = enc(val(me, whole + r * c + j));
    whole += p * c;
  }
  PendingOp rs, ag;
  if constexpr (std::is_same_v<T, float>) rs = g.ireduce_scatter_sum(send.put().mem(), recv.put().mem(), pc);
  else rs = g.ireduce_scatter_sum(send.put().mem(), recv.put().mem(), pc, Dtype16::bf16);
  ag = g.iall_gather_in_place(all.put().mem(), pc);
  ag.wait(), rs.wait();
  recv.get(), all.get();
  bool rs_ok = dec(recv[part]) == -7.0f, ag_ok = true;  // nothing past the part is written
  whole = 0;
  size_t at = 0;
  for (size_t c : pc.counts) {
    for (size_t j = 0; j < c; ++j) {
      float want = 0;
      for (int m : members) want += val(m, whole + r * c + j);
      rs_ok &= dec(recv[at + j]) == want;
    }
    for (int q = 0; q < p; ++q)
      for (size_t j = 0; j < c; ++j) ag_ok &= dec(all[whole + q * c + j]) == val(members[q], whole + q * c + j);
    whole += p * c, at += c;
  }
  const std::string what = tag + (std::is_same_v<T, float> ? " f32" : " bf16") + (shared ? " comm buffers" : "");
  check(rs_ok, what + " reduce-scatter of pieces", me);
  check(ag_ok, what + " all-gather of pieces in place", me);
}

// 16-bit collectives. Inputs are integers in [-6, 6], so every partial sum (|sum| <= 48 on 8 ranks)
// is exact in bf16 and fp16 and the result does not depend on MPI's reduction order.
static void test_group16(ProcessGroup& g, const std::vector<int>& members, int me, const std::string& tag) {
  const int p = g.size();
  const size_t count = 1000 + 3;
  auto v16 = [](int world_rank, size_t i) { return value(world_rank, i) - 6.0f; };
  for (Dtype16 t : {Dtype16::bf16, Dtype16::fp16}) {
    const std::string name = tag + (t == Dtype16::bf16 ? " bf16" : " fp16");
    uint16_t (*to16)(float) = t == Dtype16::bf16 ? math::bf16_from_float : math::fp16_from_float;
    float (*from16)(uint16_t) = t == Dtype16::bf16 ? math::float_from_bf16 : math::float_from_fp16;
    g.reset_bytes_sent();

    Buf<uint16_t> buf(count, 0);
    for (size_t i = 0; i < count; ++i) buf[i] = to16(v16(me, i));
    g.all_reduce_sum(buf.put().mem(), count, t);
    buf.get();
    bool ok = true;
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int m : members) want += v16(m, i);
      ok &= from16(buf[i]) == want;
    }
    check(ok, name + " all-reduce", me);

    Buf<uint16_t> send(count * p, 0), recv(count, 0xffff);
    for (size_t i = 0; i < send.size(); ++i) send[i] = to16(v16(me, i));
    g.ireduce_scatter_sum(send.put().mem(), recv.put().mem(), count, t).wait();
    recv.get();
    ok = true;
    for (size_t k = 0; k < count; ++k) {
      float want = 0;
      for (int m : members) want += v16(m, g.rank() * count + k);
      ok &= from16(recv[k]) == want;
    }
    check(ok, name + " reduce-scatter", me);

    // all-gather copies bits: out of place, then in place
    Buf<uint16_t> mine(count, 0), all(count * p, 0xffff), inplace(count * p, 0xffff);
    for (size_t k = 0; k < count; ++k) mine[k] = to16(v16(me, k));
    g.iall_gather(mine.put().mem(), all.put().mem(), count).wait();
    all.get();
    std::copy(mine.data(), mine.data() + count, inplace.data() + g.rank() * count);
    g.all_gather(inplace.put().mem(g.rank() * count), inplace.mem(), count);
    inplace.get();
    ok = true;
    for (int r = 0; r < p; ++r)
      for (size_t k = 0; k < count; ++k)
        ok &= all[r * count + k] == to16(v16(members[r], k)) && inplace[r * count + k] == all[r * count + k];
    check(ok, name + " all-gather", me);

    // the float formulas at 2 bytes per element
    const uint64_t want_bytes = (2 * (p - 1) * count * 2) / p + 3 * (p - 1) * count * 2;
    check(g.bytes_sent() == want_bytes,
          name + " bytes_sent " + std::to_string(g.bytes_sent()) + " vs " + std::to_string(want_bytes), me);
  }

  if (p > 1) {
    // fp16 overflow: 60000 (exact in fp16) from every rank sums past 65504 to +inf, in any order
    // (inf + finite = inf), so a later inf check sees it. Element 1 stays finite.
    Buf<uint16_t> big(2, 0);
    big[0] = math::fp16_from_float(60000.0f), big[1] = math::fp16_from_float(1.0f);
    g.all_reduce_sum(big.put().mem(), 2, Dtype16::fp16);
    big.get();
    check(big[0] == 0x7c00 && math::float_from_fp16(big[1]) == static_cast<float>(p),
          tag + " fp16 overflow to inf", me);
  }
  if (p == 2) {
    // one addition, so the rounding is order-free: 256 + 3 = 259 is a tie in bf16 (ulp 2) and
    // rounds to even, 260 (truncation would give 258); fp16 holds 259 exactly.
    Buf<uint16_t> b(1, math::bf16_from_float(g.rank() == 0 ? 256.0f : 3.0f));
    Buf<uint16_t> h(1, math::fp16_from_float(g.rank() == 0 ? 256.0f : 3.0f));
    g.all_reduce_sum(b.put().mem(), 1, Dtype16::bf16);
    g.all_reduce_sum(h.put().mem(), 1, Dtype16::fp16);
    check(math::float_from_bf16(b.get()[0]) == 260.0f && math::float_from_fp16(h.get()[0]) == 259.0f,
          tag + " 16-bit rounding", me);
  }
}

static void test_group(const ProcessGroup& g_const, const std::vector<int>& members, int me, const std::string& tag) {
  ProcessGroup& g = const_cast<ProcessGroup&>(g_const);
  const int p = g.size();
  check(p == static_cast<int>(members.size()), tag + " size", me);
  check(members[g.rank()] == me, tag + " rank order", me);
  const size_t count = 1000 + 3;  // odd sizes on purpose
  g.reset_bytes_sent();

  // all-reduce
  Buf<float> buf(count, 0);
  for (size_t i = 0; i < count; ++i) buf[i] = value(me, i);
  g.all_reduce_sum(buf.put().mem(), count);
  buf.get();
  bool ok = true;
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int m : members) want += value(m, i);
    ok &= buf[i] == want;
  }
  check(ok, tag + " all-reduce", me);

  // reduce-scatter: this rank gets block rank() of the sum
  Buf<float> send(count * p, 0), recv(count, 0);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value(me, i);
  g.reduce_scatter_sum(send.put().mem(), recv.mem(), count);
  recv.get();
  ok = true;
  for (size_t k = 0; k < count; ++k) {
    float want = 0;
    for (int m : members) want += value(m, g.rank() * count + k);
    ok &= recv[k] == want;
  }
  check(ok, tag + " reduce-scatter", me);

  // all-gather, out of place and in place, non-blocking with work in between
  Buf<float> mine(count, 0), all(count * p, -1.0f);
  for (size_t k = 0; k < count; ++k) mine[k] = value(me, k);
  PendingOp op = g.iall_gather(mine.put().mem(), all.put().mem(), count);
  volatile double busy = 0;
  for (int i = 0; i < 10000; ++i) busy = busy + i;
  op.wait();
  all.get();
  Buf<float> inplace(count * p, -1.0f);
  std::copy(mine.data(), mine.data() + count, inplace.data() + g.rank() * count);
  g.all_gather(inplace.put().mem(g.rank() * count), inplace.mem(), count);
  inplace.get();
  ok = true;
  for (int r = 0; r < p; ++r)
    for (size_t k = 0; k < count; ++k) ok &= all[r * count + k] == value(members[r], k) && inplace[r * count + k] == all[r * count + k];
  check(ok, tag + " all-gather", me);

  // ring volume: all-reduce 2(p-1)/p*n, reduce-scatter (p-1)*n (its input is p*n), two all-gathers (p-1)*n each
  const uint64_t want_bytes = (2 * (p - 1) * count * 4) / p + 3 * (p - 1) * count * 4;
  check(g.bytes_sent() == want_bytes, tag + " bytes_sent " + std::to_string(g.bytes_sent()) + " vs " + std::to_string(want_bytes), me);

  // broadcast from the last group rank
  Buf<float> b(7, static_cast<float>(me));
  g.broadcast(b.put().mem(), b.size() * 4, p - 1);
  b.get();
  ok = true;
  for (size_t i = 0; i < b.size(); ++i) ok &= b[i] == static_cast<float>(members[p - 1]);
  check(ok, tag + " broadcast", me);

  // ring of point-to-point messages
  if (p > 1) {
    Buf<float> out(5, static_cast<float>(me)), in(5, -1.0f);
    PendingOp r = g.irecv(in.put().mem(), in.size(), (g.rank() + p - 1) % p, 7);
    PendingOp s = g.isend(out.put().mem(), out.size(), (g.rank() + 1) % p, 7);
    r.wait();
    s.wait();
    in.get();
    check(in[0] == static_cast<float>(members[(g.rank() + p - 1) % p]), tag + " send/recv ring", me);
  }

  // scalars
  double sum = g.all_reduce_sum(static_cast<double>(me));
  double want_sum = 0;
  for (int m : members) want_sum += m;
  check(sum == want_sum, tag + " scalar sum", me);
  check(g.all_reduce_max(static_cast<int64_t>(me)) == members.back(), tag + " scalar max", me);

  test_group16(g, members, me, tag);
  test_pieces<float>(g, members, me, tag, false);
  test_pieces<uint16_t>(g, members, me, tag, false);
}

// The control helpers on a group: a barrier, a string of any length from the last rank, and agree():
// nothing thrown when no rank fails; the lowest failing rank's message on every rank otherwise.
static void test_control(ProcessGroup& g, int me, const std::string& tag) {
  g.barrier();
  const int root = g.size() - 1;
  const std::string long_text(3000 + root, 'x'), sent = g.rank() == root ? long_text + "!" : "";
  check(g.broadcast_string(sent, root) == long_text + "!", tag + " broadcast_string", me);
  // An empty string is one broadcast (its length) and nothing else: no second wait on a stale request,
  // which left a freed request behind that MPI_Finalize crashed on (a run outside Slurm, its job id "").
  for (int k = 0; k < 3; ++k) check(g.broadcast_string(g.rank() == root ? "" : "junk", root).empty(), tag + " broadcast_string of \"\"", me);
  bool threw = false;
  try {
    g.agree([] {});
  } catch (const UserError&) {
    threw = true;
  }
  check(!threw, tag + " agree without a failure", me);
  std::string got;
  try {
    g.agree([&] {
      if (g.rank() % 2 == 1 || g.size() == 1) throw UserError("failed on group rank " + std::to_string(g.rank()));
    });
  } catch (const UserError& e) {
    got = e.what();
  }
  check(got == (g.size() == 1 ? "failed on group rank 0" : "failed on group rank 1"), tag + " agree: " + got, me);
}

// ---- shared-memory collectives against MPI's ----

// Non-integer values, so sums round and their order shows in the bits.
static float fuzzy(int world_rank, size_t i) {
  return static_cast<float>((world_rank * 2654435761u + i * 40503u) % 10007u) / 1009.0f - 4.9f;
}

// The sum of every member's fuzzy(m, i) as the shared-memory collectives make it, each term
// rounded by `round`: in group-rank order, in fp32; with ranks_per_node = k > 0 (one node made to
// look like several), each node's sum in rank order, rounded by `round` as it leaves the node, then
// the node sums (in node order: for two nodes MPI's one addition, commutative; more nodes are not
// checked bit for bit).
static int ranks_per_node = 0;
static int node_of(int world_rank) { return ranks_per_node > 0 ? world_rank / ranks_per_node : 0; }
template <typename Round>
static float shm_sum(const std::vector<int>& members, size_t i, Round round) {
  std::vector<float> partial;
  std::vector<int> nodes;
  for (int m : members) {
    const float x = round(fuzzy(m, i));
    auto at = std::find(nodes.begin(), nodes.end(), node_of(m));
    if (at == nodes.end()) nodes.push_back(node_of(m)), partial.push_back(x);
    else partial[at - nodes.begin()] += x;
  }
  if (partial.size() == 1) return partial[0];
  float acc = round(partial[0]);  // a node's sum is rounded to the type before it leaves the node
  for (size_t j = 1; j < partial.size(); ++j) acc += round(partial[j]);
  return acc;
}
// How a group's collectives travel: one node (or one rank): shared memory (MPI for one rank);
// several nodes with the same number k > 1 of members each: the hierarchy; else MPI.
static std::string expected_path(const std::vector<int>& members) {
  std::vector<int> nodes, count;
  for (int m : members) {
    auto at = std::find(nodes.begin(), nodes.end(), node_of(m));
    if (at == nodes.end()) nodes.push_back(node_of(m)), count.push_back(1);
    else ++count[at - nodes.begin()];
  }
  if (members.size() == 1) return "MPI";
  if (nodes.size() == 1) return "shared memory";
  const bool even = std::count(count.begin(), count.end(), count[0]) == static_cast<long>(count.size());
  if (!even || count[0] == 1) return "MPI";
  return "shared memory in each node (" + std::to_string(count[0]) + " ranks), MPI across the " +
         std::to_string(nodes.size()) + " nodes";
}

// The same operations through shared memory (s) and through MPI (m), same groups: s's results
// are exactly the rank-order sums (deterministic), equal to MPI's bit for bit on 2 ranks (one
// addition, whatever the order), within rounding on more. Sizes: empty, one element, odd, and
// several rounds of the small chunk the pass sets; in place and out of place; three in flight.
static void test_shm_against_mpi(ProcessGroup& s, ProcessGroup& m, const std::vector<int>& members, int me,
                                 const std::string& tag) {
  const int p = s.size();
  const std::string path = expected_path(members);
  // The expected bits are known for one node, and for two (MPI's one addition across them).
  const bool exact = path == "shared memory" || path.find("across the 2 nodes") != std::string::npos;
  check(s.collectives_path() == path && m.collectives_path() == "MPI",
        tag + " paths: " + s.collectives_path() + " / " + m.collectives_path(), me);
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  auto close = [](float a, float b) { return std::abs(a - b) <= 1e-5f * (1 + std::abs(b)); };
  auto ident = [](float x) { return x; };
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1003}, size_t{5001}}) {
    const std::string at = tag + " count " + std::to_string(count);
    // all-reduce (in place), n = count * p + 1: blocks of unequal size
    const size_t n = count * p + 1;
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < n; ++i) a[i] = b[i] = fuzzy(me, i);
    PendingOp op = s.iall_reduce_sum(host_mem(a.data()), n);
    m.all_reduce_sum(host_mem(b.data()), n);
    op.wait();
    bool det = true, vs_mpi = true;
    for (size_t i = 0; i < n; ++i) {
      det &= !exact || same(a[i], shm_sum(members, i, ident));
      vs_mpi &= p <= 2 ? same(a[i], b[i]) : close(a[i], b[i]);
    }
    check(det && vs_mpi, at + " all-reduce f32", me);

    // reduce-scatter and all-gather, three operations in flight on the shared-memory group
    std::vector<float> send(count * p), rs(count + 1, -7.0f), rm(count + 1, -7.0f), mine(count), ag(count * p, -1.0f),
        agm(count * p, -1.0f), inplace(count * p, -1.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = fuzzy(me, i);
    for (size_t k = 0; k < count; ++k) mine[k] = inplace[s.rank() * count + k] = fuzzy(me, 3 * k);
    PendingOp o1 = s.ireduce_scatter_sum(host_mem(send.data()), host_mem(rs.data()), count);
    PendingOp o2 = s.iall_gather(host_mem(mine.data()), host_mem(ag.data()), count);
    PendingOp o3 = s.iall_gather(host_mem(inplace.data() + s.rank() * count), host_mem(inplace.data()), count);
    m.reduce_scatter_sum(host_mem(send.data()), host_mem(rm.data()), count);
    m.all_gather(host_mem(mine.data()), host_mem(agm.data()), count);
    o3.wait(), o2.wait(), o1.wait();
    det = rs[count] == -7.0f, vs_mpi = true;  // nothing past the block is written
    for (size_t k = 0; k < count; ++k) {
      det &= !exact || same(rs[k], shm_sum(members, s.rank() * count + k, ident));
      vs_mpi &= p <= 2 ? same(rs[k], rm[k]) : close(rs[k], rm[k]);
    }
    check(det && vs_mpi, at + " reduce-scatter f32", me);
    check(ag == agm && inplace == agm, at + " all-gather f32 (out of place, in place)", me);

    // 16-bit: widened, summed in rank order in fp32, rounded once
    for (Dtype16 t : {Dtype16::bf16, Dtype16::fp16}) {
      uint16_t (*to16)(float) = t == Dtype16::bf16 ? math::bf16_from_float : math::fp16_from_float;
      float (*from16)(uint16_t) = t == Dtype16::bf16 ? math::float_from_bf16 : math::float_from_fp16;
      auto round = [&](float x) { return from16(to16(x)); };
      // MPI rounds after each of its p-1 additions, each off by at most eps times the partial
      // sum, itself at most the sum of the terms' magnitudes.
      const float eps = t == Dtype16::bf16 ? 1.0f / 256 : 1.0f / 2048;
      auto near_mpi = [&](uint16_t got, uint16_t mpi, size_t i) {
        if (p <= 2) return got == mpi;
        float magnitude = 0;
        for (int r : members) magnitude += std::abs(fuzzy(r, i));
        return std::abs(from16(got) - from16(mpi)) <= p * eps * magnitude;
      };
      const std::string name = at + (t == Dtype16::bf16 ? " bf16" : " fp16");
      std::vector<uint16_t> h(n), hm(n), hs(count * p), hr(count), hrm(count), hg(count * p), hgm(count * p);
      for (size_t i = 0; i < n; ++i) h[i] = hm[i] = to16(fuzzy(me, i));
      for (size_t i = 0; i < hs.size(); ++i) hs[i] = to16(fuzzy(me, i));
      s.all_reduce_sum(host_mem(h.data()), n, t);
      m.all_reduce_sum(host_mem(hm.data()), n, t);
      s.reduce_scatter_sum(host_mem(hs.data()), host_mem(hr.data()), count, t);
      m.reduce_scatter_sum(host_mem(hs.data()), host_mem(hrm.data()), count, t);
      s.all_gather(host_mem(hr.data()), host_mem(hg.data()), count);
      m.all_gather(host_mem(hr.data()), host_mem(hgm.data()), count);
      det = true, vs_mpi = true;
      for (size_t i = 0; i < n; ++i) {
        det &= !exact || h[i] == to16(shm_sum(members, i, round));
        vs_mpi &= near_mpi(h[i], hm[i], i);
      }
      for (size_t k = 0; k < count; ++k) {
        det &= !exact || hr[k] == to16(shm_sum(members, s.rank() * count + k, round));
        vs_mpi &= near_mpi(hr[k], hrm[k], s.rank() * count + k);
      }
      check(det, name + " all-reduce and reduce-scatter in rank order", me);
      check(vs_mpi, name + " all-reduce and reduce-scatter against MPI", me);
      check(hg == hgm, name + " all-gather", me);
    }
  }
  // max (the float all-reduce's other operation)
  std::vector<float> x(4099), xm(4099);
  for (size_t i = 0; i < x.size(); ++i) x[i] = xm[i] = fuzzy(me, i);
  s.all_reduce_max(host_mem(x.data()), x.size());
  m.all_reduce_max(host_mem(xm.data()), xm.size());
  check(x == xm, tag + " all-reduce max", me);
}

// A comm buffer: shared memory the other ranks of the node can map (core/shared_memory.h).
template <typename T>
class SharedVec {
 public:
  explicit SharedVec(size_t n) : n_(n), p_(static_cast<T*>(alloc_shared(std::max<size_t>(n, 1) * sizeof(T)))) {}
  ~SharedVec() { free_shared(p_); }
  SharedVec(const SharedVec&) = delete;
  SharedVec& operator=(const SharedVec&) = delete;
  T* data() { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  std::vector<T> vec() const { return std::vector<T>(p_, p_ + n_); }

 private:
  size_t n_;
  T* p_;
};

// The single-copy path: inputs in comm buffers, read in place by the other ranks (the thresholds
// are 0 in this pass); several operations in flight. The same results as MPI's and as the rank-order sums; a group where one
// rank's buffer is private takes the two-copy path on every rank, with the same results.
static void test_single_copy(ProcessGroup& s, ProcessGroup& m, const std::vector<int>& members, int me,
                             const std::string& tag) {
  const int p = s.size(), r = s.rank();
  if (p < 2) return;
  const std::string path = expected_path(members);
  const bool exact = path == "shared memory" || path.find("across the 2 nodes") != std::string::npos;
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  auto close = [](float a, float b) { return std::abs(a - b) <= 1e-5f * (1 + std::abs(b)); };
  auto ident = [](float x) { return x; };
  for (bool mixed : {false, true}) {
    const uint64_t before = shm_single_copy_ops();
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1003}, size_t{5001}}) {
      const std::string at = tag + (mixed ? " one private buffer" : " comm buffers") + " count " + std::to_string(count);
      // rank 0's buffers private in the mixed case: everyone must take the two-copy path
      const bool priv = mixed && r == 0;
      const size_t n = count * p + 1;
      SharedVec<float> a(n), send(count * p), mine(count), agin(count * p);
      std::vector<float> pa(n), psend(count * p), pmine(count), pagin(count * p);
      float* A = priv ? pa.data() : a.data();
      float* S = priv ? psend.data() : send.data();
      float* M = priv ? pmine.data() : mine.data();
      float* G = priv ? pagin.data() : agin.data();
      std::vector<float> b(n), rs(count + 1, -7.0f), rm(count), ag(count * p), agm(count * p);
      for (size_t i = 0; i < n; ++i) A[i] = b[i] = fuzzy(me, i);
      for (size_t i = 0; i < count * p; ++i) S[i] = fuzzy(me, i);
      for (size_t k = 0; k < count; ++k) M[k] = G[r * count + k] = fuzzy(me, 3 * k);
      PendingOp o1 = s.iall_reduce_sum(host_mem(A), n);
      PendingOp o2 = s.ireduce_scatter_sum(host_mem(static_cast<const float*>(S)), host_mem(rs.data()), count);
      PendingOp o4 = s.iall_gather(host_mem(static_cast<const float*>(M)), host_mem(ag.data()), count);
      PendingOp o5 = s.iall_gather(host_mem(static_cast<const float*>(G + r * count)), host_mem(G), count);
      m.all_reduce_sum(host_mem(b.data()), n);
      m.reduce_scatter_sum(host_mem(static_cast<const float*>(S)), host_mem(rm.data()), count);
      m.all_gather(host_mem(static_cast<const float*>(M)), host_mem(agm.data()), count);
      o5.wait(), o4.wait(), o2.wait(), o1.wait();
      bool det = rs[count] == -7.0f, vs_mpi = true;
      for (size_t i = 0; i < n; ++i) {
        det &= !exact || same(A[i], shm_sum(members, i, ident));
        vs_mpi &= p <= 2 ? same(A[i], b[i]) : close(A[i], b[i]);
      }
      for (size_t k = 0; k < count; ++k) {
        det &= !exact || same(rs[k], shm_sum(members, r * count + k, ident));
        vs_mpi &= p <= 2 ? same(rs[k], rm[k]) : close(rs[k], rm[k]);
      }
      check(det && vs_mpi, at + " all-reduce and reduce-scatter f32", me);
      check(ag == agm && std::vector<float>(G, G + count * p) == agm, at + " all-gather f32 (out of place, in place)",
            me);

      // bf16 all-reduce and reduce-scatter: summed in fp32 in rank order, rounded once
      auto round = [](float x) { return math::float_from_bf16(math::bf16_from_float(x)); };
      SharedVec<uint16_t> h(n), hs(count * p);
      std::vector<uint16_t> ph(n), phs(count * p), hr(count);
      uint16_t* H = priv ? ph.data() : h.data();
      uint16_t* HS = priv ? phs.data() : hs.data();
      for (size_t i = 0; i < n; ++i) H[i] = math::bf16_from_float(fuzzy(me, i));
      for (size_t i = 0; i < count * p; ++i) HS[i] = math::bf16_from_float(fuzzy(me, i));
      s.all_reduce_sum(host_mem(H), n, Dtype16::bf16);
      s.reduce_scatter_sum(host_mem(static_cast<const uint16_t*>(HS)), host_mem(hr.data()), count, Dtype16::bf16);
      det = true;
      for (size_t i = 0; i < n; ++i) det &= !exact || H[i] == math::bf16_from_float(shm_sum(members, i, round));
      for (size_t k = 0; k < count; ++k)
        det &= !exact || hr[k] == math::bf16_from_float(shm_sum(members, r * count + k, round));
      check(det, at + " bf16 all-reduce and reduce-scatter in rank order", me);
    }
    // Which path ran: on one node, in place unless a buffer is private; across nodes, in place
    // always (the node steps run on the hierarchy's own comm buffers).
    const bool across = path.find("across") != std::string::npos;
    const bool in_place = across || !mixed;
    if (path == "shared memory" || across) check((shm_single_copy_ops() > before) == in_place, tag + (mixed ? " mixed" : "") + " single-copy path taken: " +
          std::to_string(shm_single_copy_ops() - before) + " operations", me);
  }
}

// Every group of every tp x pp layout of the world, on host memory (dev null) or on device memory
// that `dev` moves (staged, or by its library); `label` names the pass, `path` is the device path
// every group must report (a prefix of it).
static void test_layouts(int world, int me, TestDevice* dev, const std::string& label, const std::string& path,
                         bool pieces) {
  for (int tp = 1; tp <= world; tp *= 2) {
    for (int pp = 1; tp * pp <= world; pp *= 2) {
      if (world % (tp * pp)) continue;
      test_device = dev;
      ProcessGroups g = ProcessGroups::create(tp, pp);
      g.use_device_memory(dev ? dev->mem : nullptr, /*p2p_everywhere=*/true);
      check(g.dp->device_path().rfind(path, 0) == 0, "device path: " + g.dp->device_path(), me);
      const std::string layout = label + " tp" + std::to_string(tp) + "pp" + std::to_string(pp) + " ";
      test_group(*g.tp, g.topo.tp_group(me), me, layout + "tp");
      test_group(*g.dp, g.topo.dp_group(me), me, layout + "dp");
      test_group(*g.pp, g.topo.pp_group(me), me, layout + "pp");
      const bool edge = g.topo.is_first_stage(me) || g.topo.is_last_stage(me);
      check((g.embedding != nullptr) == edge, layout + "embedding membership", me);
      if (g.embedding) test_group(*g.embedding, g.topo.embedding_group(me), me, layout + "embedding");
      test_control(*g.dp, me, layout + "dp");
      test_control(*g.world, me, layout + "world");
      if (pieces) {
        std::vector<int> everyone(world);
        for (int r = 0; r < world; ++r) everyone[r] = r;
        test_pieces<float>(*g.dp, g.topo.dp_group(me), me, layout + "dp", false);
        test_pieces<uint16_t>(*g.world, everyone, me, layout + "world", false);
      }
    }
  }
  test_device = nullptr;
}

// --cuda: the groups on a real GPU's memory, moved by its library (NCCL), rank r on device
// r mod (devices seen). Exit 77 (skipped) where there is no device.
static int test_cuda(int world, int me) {
#if defined(ZERO3D_HAVE_CUDA)
  const int devices = cuda_device_count();
  if (devices == 0) {
    if (me == 0) printf("collectives on CUDA: skipped (no CUDA device here)\n");
    return 77;
  }
  std::unique_ptr<Backend> be = make_cuda_backend(me % devices);
  TestDevice dev{be->device_memory(), [&](size_t n) { return be->alloc_bytes(n); },
                 [&](void* p) { be->free_bytes(p); }};
  test_layouts(world, me, &dev, "cuda", "device buffers by NCCL", /*pieces=*/true);
  return 0;
#else
  if (me == 0) printf("collectives on CUDA: skipped (built without CUDA)\n");
  (void)world;
  return 77;
#endif
}

// Host memory, fake device memory (staged, then moved by a fake library), then the shared-memory
// collectives beside MPI's.
static void test_host_and_fake(int world, int me, int provided) {
  FakeDevice device;
  TestDevice fake{&device, [&](size_t n) { return device.alloc(n); }, [&](void* p) { device.free(p); }};
  // Host memory; fake device memory, twice (the pool is reused); then a device library moves it.
  test_layouts(world, me, nullptr, "host", "host memory only", false);
  const std::string staged = "device buffers staged through pinned host buffers";
  test_layouts(world, me, &fake, "device", staged, false);
  const size_t pinned_after_first_pass = device.pinned_allocs;
  test_layouts(world, me, &fake, "device", staged, false);
  const size_t pinned_after_staging = device.pinned_allocs;
  device.with_library = true;
  test_layouts(world, me, &fake, "library", "device buffers by a fake library", /*pieces=*/true);
  // Groups are made anew per layout, so each allocates its pool again; the second device pass
  // must allocate exactly what the first did (one pool per group, reused by every operation).
  check(pinned_after_staging == 2 * pinned_after_first_pass && pinned_after_first_pass > 0,
        "pinned staging buffers: " + std::to_string(pinned_after_staging) + " after two passes, " +
            std::to_string(pinned_after_first_pass) + " after one",
        me);
  check(device.bytes_to_host > 0 && device.bytes_to_device > 0, "device buffers were staged", me);
  // With the library, device buffers go to it, never through the staging buffers, and every
  // wait polls until it says done.
  check(device.pinned_allocs == pinned_after_staging && device.library_ops > 0 &&
            device.library_polls_pending == device.library_ops,
        "device library: " + std::to_string(device.library_ops) + " operations, " +
            std::to_string(device.library_polls_pending) + " polled while pending, " +
            std::to_string(device.pinned_allocs - pinned_after_staging) + " staging buffers",
        me);

  // Shared-memory collectives for every size, with a small chunk (many rounds), beside MPI's;
  // then with the world cut into pretend nodes of k ranks (groups that span them compose
  // shared memory inside each node with MPI across).
  CommContext& ctx = comm_context();
  for (int k : {0, 2, 4}) {
    if (k && (world < 2 * k || world % k || provided < MPI_THREAD_MULTIPLE)) continue;
    ranks_per_node = ctx.ranks_per_node = k;
    for (int tp = 1; tp <= world; tp *= 2)
      for (int pp = 1; tp * pp <= world; pp *= 2) {
        if (world % (tp * pp)) continue;
        ctx.collectives = CollectiveImpl::mpi;
        ProcessGroups gm = ProcessGroups::create(tp, pp);
        ctx.collectives = CollectiveImpl::shm, ctx.shm_chunk_bytes = 4096;
        ctx.shm_gather_in_place_bytes = ctx.shm_all_reduce_in_place_bytes = 0;
        ProcessGroups gs = ProcessGroups::create(tp, pp);
        const std::string layout = (k ? "nodes of " + std::to_string(k) + " " : std::string()) + "shm tp" +
                                   std::to_string(tp) + "pp" + std::to_string(pp) + " ";
        test_group(*gs.dp, gs.topo.dp_group(me), me, layout + "dp");  // the integer tests too
        test_group(*gs.tp, gs.topo.tp_group(me), me, layout + "tp");
        test_shm_against_mpi(*gs.dp, *gm.dp, gs.topo.dp_group(me), me, layout + "dp");
        test_shm_against_mpi(*gs.tp, *gm.tp, gs.topo.tp_group(me), me, layout + "tp");
        test_shm_against_mpi(*gs.pp, *gm.pp, gs.topo.pp_group(me), me, layout + "pp");
        std::vector<int> everyone(world);
        for (int r = 0; r < world; ++r) everyone[r] = r;
        test_shm_against_mpi(*gs.world, *gm.world, everyone, me, layout + "world");
        for (bool shared : {false, true}) {
          test_pieces<float>(*gs.dp, gs.topo.dp_group(me), me, layout + "dp", shared);
          test_pieces<uint16_t>(*gs.world, everyone, me, layout + "world", shared);
        }
        test_single_copy(*gs.dp, *gm.dp, gs.topo.dp_group(me), me, layout + "dp");
        test_single_copy(*gs.world, *gm.world, everyone, me, layout + "world");
      }
  }
  ctx = CommContext{};
}

int main(int argc, char** argv) {
  int provided = 0;  // the hierarchical collectives call MPI from their helper thread
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int skipped = 0;
  {
    int world = 1, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (argc > 1 && std::string(argv[1]) == "--cuda") {
      skipped = test_cuda(world, me);
    } else {
      test_host_and_fake(world, me, provided);
    }
    int local[2] = {checks, failures}, total[2] = {0, 0};
    MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0 && !skipped)
      printf("collectives on %d ranks%s: %d passed, %d failed\n", world, argc > 1 ? " (CUDA)" : "",
             total[0] - total[1], total[1]);
    failures = total[1];
  }
  MPI_Finalize();
  return failures ? 1 : skipped;
}
