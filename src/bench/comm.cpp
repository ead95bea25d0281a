// zero3d bench comm: the collectives ZeRO lives on, in the mould of nccl-tests: per collective,
// type and size, the time per call, algbw (bytes / time) and busbw (algbw times the share a ring
// moves: 2(p-1)/p for all-reduce, (p-1)/p for reduce-scatter and all-gather), every result
// checked against the exact expected values with the wrong elements summed over the ranks; MPI's
// collectives and the shared-memory ones side by side, and the memcpy rate of the same run. The
// shared-memory collectives run twice: on private buffers (two copies: into the segment and out)
// and on comm buffers (core/shared_memory.h) that the other ranks read in place, as the engine's.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench/comm.h"
#include "bench/rates.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/shared_memory.h"
#include "kernels/math/dtype.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

enum class Op { all_reduce, reduce_scatter, all_gather };
const char* op_name(Op op) {
  return op == Op::all_reduce ? "all_reduce" : op == Op::reduce_scatter ? "reduce_scatter" : "all_gather";
}
const char* type_name(CommType t) { return t == CommType::f32 ? "float" : t == CommType::bf16 ? "bf16" : "half"; }

// Small integers: exact in every type, and so are their sums over up to 8 ranks.
float seed(int rank, size_t i) { return static_cast<float>(static_cast<int>((rank * 5 + i * 3) % 9) - 4); }

// Buffers as bytes, written and read through the element type.
void put(char* b, size_t i, CommType t, float x) {
  if (t == CommType::f32) std::memcpy(b + 4 * i, &x, 4);
  else {
    const uint16_t h = t == CommType::bf16 ? math::bf16_from_float(x) : math::fp16_from_float(x);
    std::memcpy(b + 2 * i, &h, 2);
  }
}
float get(const char* b, size_t i, CommType t) {
  if (t == CommType::f32) {
    float x;
    std::memcpy(&x, b + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == CommType::bf16 ? math::float_from_bf16(h) : math::float_from_fp16(h);
}

struct Buffers {
  SharedBytes a, b;  // all-reduce: a in place; reduce-scatter: a -> b; all-gather: b -> a
  Buffers(size_t n, bool shared) : a(n, shared), b(n, shared) {
    if (shared && !(a.shared() && b.shared()))
      throw UserError("bench comm: cannot allocate shared memory (memfd) for the comm buffers");
  }
};

// One call of op on group g over `count` elements (all-reduce: the buffer; the others: one
// rank's block).
void issue(ProcessGroup& g, Op op, CommType t, Buffers& bufs, size_t count) {
  void* a = bufs.a.data();
  void* b = bufs.b.data();
  const Dtype16 d = t == CommType::fp16 ? Dtype16::fp16 : Dtype16::bf16;
  switch (op) {
    case Op::all_reduce:
      if (t == CommType::f32) g.all_reduce_sum(host_mem(static_cast<float*>(a)), count);
      else g.all_reduce_sum(host_mem(static_cast<uint16_t*>(a)), count, d);
      break;
    case Op::reduce_scatter:
      if (t == CommType::f32)
        g.reduce_scatter_sum(host_mem(static_cast<const float*>(a)), host_mem(static_cast<float*>(b)), count);
      else
        g.reduce_scatter_sum(host_mem(static_cast<const uint16_t*>(a)), host_mem(static_cast<uint16_t*>(b)), count, d);
      break;
    case Op::all_gather:
      if (t == CommType::f32)
        g.all_gather(host_mem(static_cast<const float*>(b)), host_mem(static_cast<float*>(a)), count);
      else
        g.all_gather(host_mem(static_cast<const uint16_t*>(b)), host_mem(static_cast<uint16_t*>(a)), count);
      break;
  }
}

// Seeded inputs, one call, and the number of elements that differ from the expected result.
int64_t check_once(ProcessGroup& g, Op op, CommType t, Buffers& bufs, size_t count) {
  const int p = g.size(), r = g.rank();
  const size_t in = op == Op::all_gather ? count : op == Op::all_reduce ? count : count * p;
  char* src = op == Op::all_gather ? bufs.b.data() : bufs.a.data();
  for (size_t i = 0; i < in; ++i) put(src, i, t, seed(r, i));
  issue(g, op, t, bufs, count);
  int64_t wrong = 0;
  auto sum = [&](size_t i) {
    float s = 0;
    for (int q = 0; q < p; ++q) s += seed(q, i);
    return s;
  };
  if (op == Op::all_reduce)
    for (size_t i = 0; i < count; ++i) wrong += get(bufs.a.data(), i, t) != sum(i);
  else if (op == Op::reduce_scatter)
    for (size_t i = 0; i < count; ++i) wrong += get(bufs.b.data(), i, t) != sum(r * count + i);
  else
    for (int q = 0; q < p; ++q)
      for (size_t i = 0; i < count; ++i) wrong += get(bufs.a.data(), q * count + i, t) != seed(q, i);
  return wrong;
}

struct Result {
  double seconds = 0;  // per call, the slowest rank
  int64_t wrong = 0;   // summed over the ranks
};

Result measure(ProcessGroup& g, Op op, CommType t, Buffers& bufs, size_t count, int iters) {
  Result res;
  res.wrong = static_cast<int64_t>(g.all_reduce_sum(static_cast<double>(check_once(g, op, t, bufs, count))));
  std::memset(bufs.a.data(), 0, bufs.a.size());  // zeros while timing: in-place sums stay finite
  std::memset(bufs.b.data(), 0, bufs.b.size());
  issue(g, op, t, bufs, count);  // warm-up
  g.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) issue(g, op, t, bufs, count);
  res.seconds = g.all_reduce_max(seconds_since(t0) / iters);
  return res;
}

// Bytes copied per second by memcpy of `bytes`, while every rank of g copies at once.
double memcpy_rate(ProcessGroup& g, size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  g.barrier();
  const auto t0 = Clock::now();
  const int reps = 5;
  for (int i = 0; i < reps; ++i) std::memcpy(dst.data(), src.data(), bytes);
  return g.all_reduce_sum(bytes * reps / seconds_since(t0)) / g.size();
}

// The values of `names` in `known`; an unknown name is the user's error, naming the known ones.
template <typename E>
std::vector<E> by_name(const std::vector<std::string>& names, const std::vector<std::pair<std::string, E>>& known,
                       const char* what) {
  std::vector<E> out;
  for (const std::string& name : names) {
    auto it = std::find_if(known.begin(), known.end(), [&](const auto& k) { return k.first == name; });
    if (it == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k.first;
      throw UserError(strprintf("bench comm: unknown %s '%s' (%s)", what, name.c_str(), list.c_str()));
    }
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

double time_collective(ProcessGroup& g, const std::string& name, size_t bytes, double seconds) {
  const Op op = by_name<Op>({name}, {{"all_reduce", Op::all_reduce}, {"reduce_scatter", Op::reduce_scatter},
                                     {"all_gather", Op::all_gather}}, "collective")[0];
  const int p = g.size();
  const size_t whole = std::max<size_t>(bytes / (sizeof(float) * p), 1) * p;
  Buffers shared(whole * sizeof(float), true);
  const size_t count = op == Op::all_reduce ? whole : whole / p;
  // Three calls say what one costs (every rank the slowest's, so all agree on the count); the
  // budget's calls, at most 2 GB moved and 1000 calls, make the measurement.
  const double first = measure(g, op, CommType::f32, shared, count, 3).seconds;
  const double most = std::clamp<double>(2e9 / static_cast<double>(whole * sizeof(float)), 3, 1000);
  const int iters = static_cast<int>(std::clamp<double>(seconds / std::max(first, 1e-9), 3, most));
  return iters <= 3 ? first : measure(g, op, CommType::f32, shared, count, iters).seconds;
}

int64_t bench_comm(const CommBenchOptions& o) {
  const auto ops = by_name<Op>(o.ops, {{"all_reduce", Op::all_reduce}, {"reduce_scatter", Op::reduce_scatter},
                                       {"all_gather", Op::all_gather}}, "collective");
  const auto types = by_name<CommType>(o.types, {{"float", CommType::f32}, {"bf16", CommType::bf16},
                                                 {"half", CommType::fp16}}, "type");
  CommContext& ctx = comm_context();
  const CommContext saved = ctx;
  ctx.collectives = CollectiveImpl::mpi;
  auto world_mpi = ProcessGroup::world();
  const int p = world_mpi->size();
  const int group = o.group_size > 0 ? std::min(o.group_size, p) : p;
  if (p % group) throw UserError(strprintf("--group %d does not divide the %d ranks", group, p));
  auto mpi = ProcessGroup::split(*world_mpi, world_mpi->rank() / group, world_mpi->rank(), "bench");
  ctx.collectives = CollectiveImpl::shm, ctx.shm_min_bytes = 0;
  if (o.chunk_bytes) ctx.shm_chunk_bytes = o.chunk_bytes;
  auto shm = ProcessGroup::split(*world_mpi, world_mpi->rank() / group, world_mpi->rank(), "bench");
  ctx = saved;

  auto node = world_mpi->split_node("node");
  const int nodes = static_cast<int>(world_mpi->all_reduce_sum(node->rank() == 0 ? 1.0 : 0.0));
  const size_t max_bytes = std::max<size_t>(o.max_bytes, 64);
  const double copy_all = memcpy_rate(*world_mpi, std::min<size_t>(max_bytes, 256 << 20));
  log_info("# zero3d bench comm: %d ranks on %d node(s), groups of %d; shared memory: %s, chunks of %zu bytes", p,
           nodes, group, shm->collectives_path().c_str(), o.chunk_bytes ? o.chunk_bytes : saved.shm_chunk_bytes);
  log_info("# memcpy %.2f GB/s per rank while every rank copies (%.0f MiB)", copy_all / 1e9,
           std::min<size_t>(max_bytes, 256 << 20) / 1048576.0);
  log_info("# size: the whole buffer (all-reduce's, reduce-scatter's input, all-gather's output); count: its elements");
  log_info("# shm: private buffers (two copies); shm-1: comm buffers the other ranks read in place (one copy)");
  log_info("# %12s %11s %6s %15s | %9s %7s %7s %6s | %9s %7s %7s %6s | %9s %7s %7s %6s | %6s %6s", "size(B)", "count",
           "type", "op", "mpi us", "algbw", "busbw", "#wrong", "shm us", "algbw", "busbw", "#wrong", "shm-1 us", "algbw",
           "busbw", "#wrong", "x mpi", "x mpi");

  Buffers priv(max_bytes, false), shared(max_bytes, true);
  int64_t wrong_total = 0;
  for (Op op : ops)
    for (CommType t : types) {
      const size_t e = elem_bytes(t);
      size_t crossover = 0;  // the smallest size from which shared memory (comm buffers) stays faster
      for (size_t size = std::max<size_t>(o.min_bytes, e * group); size <= max_bytes;
           size = std::max(size + 1, static_cast<size_t>(static_cast<double>(size) * o.factor))) {
        const size_t whole = size / (e * group) * group;  // elements of the whole buffer, a multiple of p
        const size_t count = op == Op::all_reduce ? whole : whole / group;
        const int iters = o.iters > 0 ? o.iters
                                      : static_cast<int>(std::clamp<double>(o.bytes_per_point / static_cast<double>(size), 3, 1000));
        const Result m = measure(*mpi, op, t, priv, count, iters);
        const Result s = measure(*shm, op, t, priv, count, iters);
        const Result s1 = measure(*shm, op, t, shared, count, iters);
        const double bytes = static_cast<double>(whole * e), bf = bus_share(op_name(op), group);
        auto cols = [&](const Result& r) {
          return strprintf("%9.1f %7.2f %7.2f %6lld", r.seconds * 1e6, bytes / r.seconds / 1e9,
                           bytes / r.seconds / 1e9 * bf, static_cast<long long>(r.wrong));
        };
        log_info("  %12.0f %11zu %6s %15s | %s | %s | %s | %6.2f %6.2f", bytes, whole, type_name(t), op_name(op),
                 cols(m).c_str(), cols(s).c_str(), cols(s1).c_str(), m.seconds / s.seconds, m.seconds / s1.seconds);
        wrong_total += m.wrong + s.wrong + s1.wrong;
        if (s1.seconds > m.seconds) crossover = 0;
        else if (!crossover) crossover = static_cast<size_t>(bytes);
      }
      if (crossover)
        log_info("# %s %s: shared memory (comm buffers) is faster from %zu bytes on", op_name(op), type_name(t),
                 crossover);
      else
        log_info("# %s %s: MPI is faster at the largest size measured", op_name(op), type_name(t));
    }
  log_info("# comm.shm_min_bytes (auto) is %zu; wrong elements in all: %lld", saved.shm_min_bytes,
           static_cast<long long>(wrong_total));
  return wrong_total;
}

}  // namespace zero3d
