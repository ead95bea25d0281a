#include "parallel/shm_collectives.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "core/shared_memory.h"
#include "kernels/math/dtype.h"
#include "parallel/worker.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define Z3D_CPU_RELAX() _mm_pause()
#else
#define Z3D_CPU_RELAX() ((void)0)
#endif

namespace zero3d {

namespace {

constexpr int kSlots = 2;          // K in the header comment
constexpr size_t kHeaderBytes = 4096;

// One rank's counters, each on its own cache line (a writer never invalidates another's line).
struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};
};
// Where a rank's operation input lies, for the single-copy path (serial 0: private memory).
struct Published {
  int32_t fd;
  uint64_t serial, bytes, offset;
};
struct RankHeader {
  Counter posted, reduced, freed;
  alignas(64) Published input[kSlots];  // by round % K, written before posted
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters need lock-free 64-bit atomics");
static_assert(sizeof(RankHeader) <= kHeaderBytes);

// Waits until `c` reaches v: spin (the other rank is usually about to write), then yield, then
// sleep, so a rank waiting for a slower one gives its core to the ranks that compute.
void await(const std::atomic<uint64_t>& c, uint64_t v) {
  for (int i = 0; c.load(std::memory_order_acquire) < v; ++i) {
    if (i < 512) Z3D_CPU_RELAX();
    else if (i < 4096) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

float load_bf16(const void* p, size_t i) { return math::float_from_bf16(static_cast<const uint16_t*>(p)[i]); }
void store_bf16(void* p, size_t i, float x) { static_cast<uint16_t*>(p)[i] = math::bf16_from_float(x); }
float load_fp16(const void* p, size_t i) { return math::float_from_fp16(static_cast<const uint16_t*>(p)[i]); }
void store_fp16(void* p, size_t i, float x) { static_cast<uint16_t*>(p)[i] = math::fp16_from_float(x); }

// The reductions: out[i] = src[0][i] (+ or max) src[1][i] ... src[p-1][i], in that order, in
// fp32; 16-bit values are widened and the result rounded once. out may be one of the sources.
// One clone per vector width, picked at load time by what the CPU reports.
#if defined(__x86_64__) && defined(__GNUC__)
#define Z3D_VECTOR_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#else
#define Z3D_VECTOR_CLONES
#endif

// fp32: one pass in registers (through a tile in L1 it ran at half the memory's speed).
// `stream`: the results bypass the cache (non-temporal stores), for outputs too large to be read
// from it again; a store then costs no read of the destination line, a third of a 2-source sum's
// memory traffic.
Z3D_VECTOR_CLONES void reduce_f32(float* out, const float* const* in, int p, size_t n, RedOp op, bool stream) {
  size_t i = 0;
#if defined(__x86_64__)
  const bool nt = stream && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (; i + 4 <= n; i += 4) {
    __m128 x = _mm_loadu_ps(in[0] + i);
    for (int q = 1; q < p; ++q)  // max: x < y ? y : x, as below
      x = op == RedOp::sum ? _mm_add_ps(x, _mm_loadu_ps(in[q] + i)) : _mm_max_ps(_mm_loadu_ps(in[q] + i), x);
    if (nt) _mm_stream_ps(out + i, x);
    else _mm_storeu_ps(out + i, x);
  }
  if (nt) _mm_sfence();  // the streamed stores visible before the counter that publishes them
#endif
  for (; i < n; ++i) {
    float x = in[0][i];
    for (int q = 1; q < p; ++q) x = op == RedOp::sum ? x + in[q][i] : (x < in[q][i] ? in[q][i] : x);
    out[i] = x;
  }
}

// 16-bit sums, through an fp32 tile in L1 (bound by the conversions).
template <float (*load)(const void*, size_t), void (*store)(void*, size_t, float)>
[[gnu::always_inline]] inline void sum16(void* out, const void* const* src, int p, size_t n) {
  constexpr size_t kTile = 1024;
  alignas(64) float acc[kTile];
  for (size_t at = 0; at < n; at += kTile) {
    const size_t len = std::min(kTile, n - at);
    for (size_t i = 0; i < len; ++i) acc[i] = load(src[0], at + i);
    for (int q = 1; q < p; ++q)
      for (size_t i = 0; i < len; ++i) acc[i] += load(src[q], at + i);
    for (size_t i = 0; i < len; ++i) store(out, at + i, acc[i]);
  }
}
Z3D_VECTOR_CLONES void sum_bf16(void* out, const void* const* src, int p, size_t n) {
  sum16<load_bf16, store_bf16>(out, src, p, n);
}
Z3D_VECTOR_CLONES void sum_fp16(void* out, const void* const* src, int p, size_t n) {
  sum16<load_fp16, store_fp16>(out, src, p, n);
}

// fp32 results of at least this many bytes are streamed past the cache (never on the two-copy
// path: its results are read again at once).
constexpr size_t kStreamBytes = size_t(1) << 20;

void reduce(void* out, const void* const* src, int p, size_t n, CommType t, RedOp op, bool stream = false) {
  Z3D_ASSERT(t == CommType::f32 || op == RedOp::sum, "16-bit collectives only sum");
  switch (t) {
    case CommType::f32:
      return reduce_f32(static_cast<float*>(out), reinterpret_cast<const float* const*>(src), p, n, op,
                        stream && n * 4 >= kStreamBytes);
    case CommType::bf16: return sum_bf16(out, src, p, n);
    case CommType::fp16: return sum_fp16(out, src, p, n);
  }
}

std::atomic<uint64_t> shm_single_copy_count{0};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

struct ShmCollectives::Impl {
  int p = 0, me = 0;
  size_t chunk = 0;   // C: bytes per slot
  size_t region = 0;  // one rank's part of the segment
  char* base = nullptr;
  size_t bytes = 0;
  std::vector<RankHeader*> hdr;
  std::vector<char*> pub, res;  // rank i's slots: pub[i] + s * chunk
  uint64_t rounds = 0;          // rounds done: the same on every rank (the helper's alone)
  bool single_copy = false;     // every rank can map every other's shared allocations
  size_t gather_in_place = 0, all_reduce_in_place = 0;  // CommContext's thresholds at creation
  std::vector<pid_t> pids;      // by group rank
  PeerMappings peers;           // the helper's alone
  AsyncCompletion* running = nullptr;  // the operation on the helper, until every rank has joined it

  std::unique_ptr<OrderedWorker> helper = std::make_unique<OrderedWorker>();

  ~Impl() {
    helper.reset();  // every posted operation done before the segment goes
    if (base) munmap(base, bytes);
  }

  PendingOp submit(const char* what, const ProcessGroup* g, std::function<void()> work) {
    auto done = std::make_shared<AsyncCompletion>();
    helper->post([this, work = std::move(work), done] {
      running = done.get();
      work();
      if (running) done->begin();  // no rounds: nothing to wait for
      running = nullptr;
      done->finish();
    });
    return PendingOp(std::move(done), what, g);
  }

  void await_all(Counter RankHeader::*c, uint64_t v) {
    for (int i = 0; i < p; ++i)
      if (i != me) await((hdr[i]->*c).v, v);
    // The operation's time starts when every rank has posted its first round: the wait for a
    // rank still computing is the caller's skew, not communication.
    if (running && c == &RankHeader::posted) std::exchange(running, nullptr)->begin();
  }
  // Starts a round: its number G, once every rank has freed the slot's previous round.
  uint64_t begin_round() {
    const uint64_t g = rounds++;
    if (g >= kSlots) await_all(&RankHeader::freed, g + 1 - kSlots);
    return g;
  }
  void mark(Counter RankHeader::*c, uint64_t g) { (hdr[me]->*c).v.store(g + 1, std::memory_order_release); }
  char* slot(const std::vector<char*>& area, int rank, uint64_t g) const { return area[rank] + (g % kSlots) * chunk; }
  // Where writer w puts block j (j != w) in its publish slot: the p-1 other blocks, packed.
  static int pos(int w, int j) { return j < w ? j : j - 1; }

  // The single-copy path. Every rank publishes where its input lies (one round of its own); when
  // every input is shared memory, each rank reads the others' inputs in place and the result is
  // the same bits as the two-copy path's (the same order of additions). Returns the inputs by
  // rank, or empty (then the two-copy path runs) when one is private.
  // `wanted`: whether the operation is large enough (the same on every rank; CommContext).
  std::vector<const char*> inputs_in_place(const void* in, size_t in_bytes, bool wanted, uint64_t& g) {
    if (!single_copy || !wanted) return {};
    g = begin_round();
    const SharedRef ref = find_shared(in, in_bytes);
    hdr[me]->input[g % kSlots] = {ref.fd, ref.serial, ref.bytes, ref.offset};
    mark(&RankHeader::posted, g);
    await_all(&RankHeader::posted, g + 1);
    std::vector<const char*> at(p);
    for (int i = 0; i < p; ++i) {
      const Published& in_i = hdr[i]->input[g % kSlots];
      if (!in_i.serial) {
        mark(&RankHeader::freed, g);
        return {};
      }
      if (i == me) at[i] = static_cast<const char*>(in);
      else {
        at[i] = peers.map(pids[i], {in_i.fd, in_i.serial, in_i.bytes, in_i.offset});
        if (!at[i])  // it worked at the start (create), so this is a broken machine, not a choice
          abort_job(strprintf("shared-memory collectives: cannot map rank %d's buffer /proc/%d/fd/%d: %s", i,
                              static_cast<int>(pids[i]), in_i.fd, std::strerror(errno)),
                    1);
      }
    }
    return at;
  }
  // The end of a single-copy operation: every rank is done reading this one's input.
  void release_inputs(uint64_t g) {
    shm_single_copy_count.fetch_add(1, std::memory_order_relaxed);
    mark(&RankHeader::freed, g);
    await_all(&RankHeader::freed, g + 1);
  }

  // Single copy: every rank reads the others' pieces where they lie, one pass per piece.
  void reduce_scatter(const char* send, char* recv, const MessageSlices& pc, CommType t) {
    const size_t e = elem_bytes(t);
    uint64_t g0 = 0;
    if (auto in = inputs_in_place(send, p * pc.part() * e, true, g0); !in.empty()) {
      std::vector<const char*> src(p);
      size_t whole = 0, part = 0;  // where the piece starts in the input and in the output
      for (size_t c : pc.counts) {
        for (int i = 0; i < p; ++i) src[i] = in[i] + (whole + me * c) * e;
        reduce(recv + part * e, reinterpret_cast<const void* const*>(src.data()), p, c, t, RedOp::sum, true);
        whole += p * c, part += c;
      }
      return release_inputs(g0);
    }
    size_t whole = 0, part = 0;
    for (size_t c : pc.counts) {
      reduce_scatter_rounds(send + whole * e, recv + part * e, c, t);
      whole += p * c, part += c;
    }
  }
  void reduce_scatter_rounds(const char* send, char* recv, size_t count, CommType t) {
    const size_t e = elem_bytes(t), m = chunk / ((p - 1) * e);
    std::vector<const void*> src(p);
    for (size_t lo = 0; lo < count; lo += m) {
      const size_t len = std::min(m, count - lo);
      const uint64_t g = begin_round();
      char* mine = slot(pub, me, g);
      for (int j = 0; j < p; ++j)
        if (j != me) std::memcpy(mine + pos(me, j) * m * e, send + (j * count + lo) * e, len * e);
      mark(&RankHeader::posted, g);
      await_all(&RankHeader::posted, g + 1);
      for (int i = 0; i < p; ++i)
        src[i] = i == me ? send + (me * count + lo) * e : slot(pub, i, g) + pos(i, me) * m * e;
      reduce(recv + lo * e, src.data(), p, len, t, RedOp::sum);
      mark(&RankHeader::freed, g);
    }
  }

  // send null: in place (this rank's blocks already in recv, which the others then read).
  void all_gather(const char* send, char* recv, const MessageSlices& pc, CommType t) {
    const size_t e = elem_bytes(t), part = pc.part();
    const char* input = send ? send : recv;
    uint64_t g0 = 0;
    if (auto in = inputs_in_place(input, (send ? 1 : p) * part * e, p * part * e >= gather_in_place, g0);
        !in.empty()) {
      size_t whole = 0, at = 0;  // where the piece starts in recv and in send
      for (size_t c : pc.counts) {
        for (int i = 0; i < p; ++i)
          if (i != me) std::memcpy(recv + (whole + i * c) * e, in[i] + (send ? at : whole + i * c) * e, c * e);
        if (send) std::memmove(recv + (whole + me * c) * e, send + at * e, c * e);
        whole += p * c, at += c;
      }
      return release_inputs(g0);
    }
    size_t whole = 0, at = 0;
    for (size_t c : pc.counts) {
      all_gather_rounds(send ? send + at * e : recv + (whole + me * c) * e, recv + whole * e, c, t);
      whole += p * c, at += c;
    }
  }
  void all_gather_rounds(const char* send, char* recv, size_t count, CommType t) {
    const size_t e = elem_bytes(t), m = chunk / e;
    char* own = recv + me * count * e;
    for (size_t lo = 0; lo < count; lo += m) {
      const size_t len = std::min(m, count - lo);
      const uint64_t g = begin_round();
      std::memcpy(slot(pub, me, g), send + lo * e, len * e);
      if (send != own) std::memmove(own + lo * e, send + lo * e, len * e);
      mark(&RankHeader::posted, g);
      await_all(&RankHeader::posted, g + 1);
      for (int i = 0; i < p; ++i)
        if (i != me) std::memcpy(recv + (i * count + lo) * e, slot(pub, i, g), len * e);
      mark(&RankHeader::freed, g);
    }
  }

  // Block j of the buffer: [lo(j), lo(j+1)), sizes differing by at most one element.
  size_t block_lo(size_t n, int j) const { return n * j / p; }

  void all_reduce(char* buf, size_t n, CommType t, RedOp op) {
    const size_t e = elem_bytes(t), m = chunk / ((p - 1) * e), longest = (n + p - 1) / p;
    // Round k's part of block j: [at, at + len).
    auto part = [&](int j, size_t k, size_t& at) {
      const size_t lo = block_lo(n, j) + k, hi = block_lo(n, j + 1);
      at = lo;
      return lo < hi ? std::min(m, hi - lo) : size_t{0};
    };
    uint64_t g0 = 0;
    if (auto in = inputs_in_place(buf, n * e, n * e >= all_reduce_in_place, g0); !in.empty()) {
      // My block reduced in place (the others read only their own blocks of my buffer now), then,
      // once every block is, the others' blocks copied from their buffers.
      const size_t lo = block_lo(n, me), hi = block_lo(n, me + 1);
      std::vector<const char*> src(p);
      for (int i = 0; i < p; ++i) src[i] = in[i] + lo * e;
      reduce(buf + lo * e, reinterpret_cast<const void* const*>(src.data()), p, hi - lo, t, op);  // read again next
      mark(&RankHeader::reduced, g0);
      await_all(&RankHeader::reduced, g0 + 1);
      for (int i = 0; i < p; ++i)
        if (i != me) {
          const size_t a = block_lo(n, i), b = block_lo(n, i + 1);
          std::memcpy(buf + a * e, in[i] + a * e, (b - a) * e);
        }
      return release_inputs(g0);
    }
    std::vector<const void*> src(p);
    for (size_t k = 0; k < longest; k += m) {
      const uint64_t g = begin_round();
      char* mine = slot(pub, me, g);
      size_t at = 0;
      for (int j = 0; j < p; ++j)
        if (j != me) {
          const size_t len = part(j, k, at);
          std::memcpy(mine + pos(me, j) * m * e, buf + at * e, len * e);
        }
      mark(&RankHeader::posted, g);
      await_all(&RankHeader::posted, g + 1);
      const size_t len = part(me, k, at);
      for (int i = 0; i < p; ++i) src[i] = i == me ? buf + at * e : slot(pub, i, g) + pos(i, me) * m * e;
      char* result = slot(res, me, g);
      reduce(result, src.data(), p, len, t, op);
      std::memcpy(buf + at * e, result, len * e);
      mark(&RankHeader::reduced, g);
      await_all(&RankHeader::reduced, g + 1);
      for (int i = 0; i < p; ++i)
        if (i != me) {
          const size_t li = part(i, k, at);
          std::memcpy(buf + at * e, slot(res, i, g), li * e);
        }
      mark(&RankHeader::freed, g);
    }
  }
};

uint64_t shm_single_copy_ops() { return shm_single_copy_count.load(); }

MPI_Comm split_node_comm(MPI_Comm comm) {
  int me = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &me));
  MPI_Comm node = MPI_COMM_NULL;
  if (const int k = comm_context().ranks_per_node; k > 0) {
    int world_rank = 0;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_CHECK(MPI_Comm_split(comm, world_rank / k, me, &node));
  } else {
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
  }
  return node;
}

ShmCollectives::ShmCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmCollectives::~ShmCollectives() = default;

std::unique_ptr<ShmCollectives> ShmCollectives::create(MPI_Comm comm, size_t chunk_bytes) {
  int p = 1, me = 0;
  MPI_CHECK(MPI_Comm_size(comm, &p));
  MPI_CHECK(MPI_Comm_rank(comm, &me));
  if (p < 2) return nullptr;

  auto impl = std::make_unique<Impl>();
  impl->p = p, impl->me = me;
  impl->chunk = std::max<size_t>(round_up(chunk_bytes, 64), 4096);
  impl->region = round_up(kHeaderBytes + 2 * kSlots * impl->chunk, 4096);
  impl->bytes = impl->region * p;

  // Rank 0 makes the object (its pages reserved, so a full /dev/shm fails here, not later with
  // SIGBUS), every rank maps it, then rank 0 removes its name.
  struct {
    char name[64];
    int ok;
  } made{};
  static int serial = 0;
  std::snprintf(made.name, sizeof made.name, "/zero3d-%d-%d", static_cast<int>(getpid()), serial++);
  int fd = -1, err = 0;
  if (me == 0) {
    fd = shm_open(made.name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) err = posix_fallocate(fd, 0, static_cast<off_t>(impl->bytes));
    made.ok = fd >= 0 && err == 0;
    if (!made.ok) err = fd < 0 ? errno : err;
  }
  MPI_CHECK(MPI_Bcast(&made, sizeof made, MPI_BYTE, 0, comm));
  if (me != 0 && made.ok) fd = shm_open(made.name, O_RDWR, 0600);
  void* at = MAP_FAILED;
  if (fd >= 0) {
    at = mmap(nullptr, impl->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  int mapped = made.ok && at != MAP_FAILED;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &mapped, 1, MPI_INT, MPI_MIN, comm));
  if (me == 0 && fd >= 0) shm_unlink(made.name);
  if (!mapped) {
    if (at != MAP_FAILED) munmap(at, impl->bytes);
    if (me == 0)
      log_warn("shared-memory collectives: cannot make a %zu-byte segment in /dev/shm (%s); MPI moves everything",
               impl->bytes, std::strerror(err ? err : EINVAL));
    return nullptr;
  }
  impl->base = static_cast<char*>(at);
  for (int i = 0; i < p; ++i) {
    char* r = impl->base + i * impl->region;
    if (i == me) new (r) RankHeader();
    impl->hdr.push_back(reinterpret_cast<RankHeader*>(r));
    impl->pub.push_back(r + kHeaderBytes);
    impl->res.push_back(r + kHeaderBytes + kSlots * impl->chunk);
  }
  MPI_CHECK(MPI_Barrier(comm));  // every header constructed before anyone reads one

  // The single-copy path, if every rank can map a probe allocation of every other.
  impl->pids.resize(p);
  const pid_t pid = getpid();
  MPI_CHECK(MPI_Allgather(&pid, sizeof pid, MPI_BYTE, impl->pids.data(), sizeof pid, MPI_BYTE, comm));
  void* probe = alloc_shared(sizeof(int));
  if (probe) *static_cast<int*>(probe) = me + 1;
  const SharedRef mine = probe ? find_shared(probe, sizeof(int)) : SharedRef{};
  std::vector<SharedRef> refs(p);
  MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, refs.data(), sizeof mine, MPI_BYTE, comm));
  int ok = 1, map_err = 0;
  for (int i = 0; i < p; ++i)
    if (i != me) {
      const char* peer = refs[i].serial ? impl->peers.map(impl->pids[i], refs[i]) : nullptr;
      if (!peer) map_err = errno;
      ok &= peer && *reinterpret_cast<const int*>(peer) == i + 1;
    }
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));  // every probe read before it goes
  if (probe) free_shared(probe);
  impl->single_copy = ok;
  impl->gather_in_place = comm_context().shm_gather_in_place_bytes;
  impl->all_reduce_in_place = comm_context().shm_all_reduce_in_place_bytes;
  if (!ok && me == 0)
    log_info("shared-memory collectives: the ranks cannot map each other's buffers (%s); every operation copies "
             "through the segment", map_err ? std::strerror(map_err) : "no memfd");
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(std::move(impl)));
}

PendingOp ShmCollectives::run(const char* what, const ProcessGroup* g, std::function<void()> work) {
  return impl_->submit(what, g, std::move(work));
}
void ShmCollectives::all_reduce_here(void* buf, size_t n, CommType t, RedOp op) {
  impl_->all_reduce(static_cast<char*>(buf), n, t, op);
}
void ShmCollectives::reduce_scatter_here(const void* send, void* recv, size_t count, CommType t) {
  impl_->reduce_scatter(static_cast<const char*>(send), static_cast<char*>(recv), MessageSlices{{count}}, t);
}
void ShmCollectives::all_gather_here(const void* send, void* recv, size_t count, CommType t) {
  impl_->all_gather(static_cast<const char*>(send), static_cast<char*>(recv), MessageSlices{{count}}, t);
}

PendingOp ShmCollectives::all_reduce(void* buf, size_t n, CommType t, RedOp op, const ProcessGroup* g) {
  return impl_->submit("all-reduce", g,
                       [this, b = static_cast<char*>(buf), n, t, op] { impl_->all_reduce(b, n, t, op); });
}

PendingOp ShmCollectives::reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t,
                                         const ProcessGroup* g) {
  return impl_->submit("reduce-scatter", g, [this, s = static_cast<const char*>(send), r = static_cast<char*>(recv),
                                             pc, t] { impl_->reduce_scatter(s, r, pc, t); });
}

PendingOp ShmCollectives::all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t,
                                     const ProcessGroup* g) {
  return impl_->submit("all-gather", g, [this, s = static_cast<const char*>(send), r = static_cast<char*>(recv), pc,
                                         t] { impl_->all_gather(s, r, pc, t); });
}

}  // namespace zero3d
