#include "parallel/comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "parallel/watchdog.h"

namespace zero3d {

CommLog& comm_log() {
  static CommLog log;
  return log;
}

// ---- comm time (wall_clock_breakdown) ----

namespace {
// The calling thread's completed operations' running intervals and waits, until taken.
struct CommTimer {
  std::vector<std::pair<Clock::time_point, Clock::time_point>> running;
  double exposed_s = 0, skew_s = 0;
};
thread_local CommTimer comm_timer;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return a < b ? std::chrono::duration<double>(b - a).count() : 0.0;
}
}  // namespace

CommTime take_comm_time() {
  CommTimer& t = comm_timer;
  CommTime out;
  std::sort(t.running.begin(), t.running.end());
  Clock::time_point reached{};  // the end of the union so far
  for (const auto& [from, to] : t.running) {
    out.busy_s += seconds_between(std::max(from, reached), to);
    reached = std::max(reached, to);
  }
  out.exposed_s = t.exposed_s, out.skew_s = t.skew_s;
  t = CommTimer{};
  return out;
}

void AsyncCompletion::finish() {
  {
    std::lock_guard<std::mutex> lock(m_);
    at_ = Clock::now();
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void AsyncCompletion::wait_for(std::chrono::microseconds d) {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait_for(lock, d, [&] { return done(); });
}

int count_of(size_t n) {
  Z3D_ASSERT(n <= static_cast<size_t>(INT_MAX), "message larger than 2^31 elements: lower the bucket size");
  return static_cast<int>(n);
}

namespace {
// What one rank sends when `passes` ring passes (reduce-scatter and all-gather: 1, all-reduce: 2)
// run over a buffer of `buffer_bytes` shared by p ranks: each pass sends p-1 of the p blocks.
uint64_t ring_bytes_sent(int p, uint64_t buffer_bytes, int passes) {
  if (p <= 1) return 0;
  return static_cast<uint64_t>(passes) * (p - 1) * buffer_bytes / p;
}

}  // namespace

double bus_share(const std::string& op, int p) {
  if (op == "all_reduce") return 2.0 * (p - 1) / p;
  if (op == "reduce_scatter" || op == "all_gather") return static_cast<double>(p - 1) / p;
  return 1.0;
}

PendingOp::PendingOp(MPI_Request r, std::string what, const ProcessGroup* group, Then then)
    : req_(r), pending_(true), then_(std::move(then)), what_(std::move(what)), group_(group),
      issued_(std::chrono::steady_clock::now()) {
  if (req_ == MPI_REQUEST_NULL) completed();
}
PendingOp::PendingOp(std::shared_ptr<AsyncCompletion> a, std::string what, const ProcessGroup* group)
    : async_(std::move(a)), pending_(true), what_(std::move(what)), group_(group),
      issued_(std::chrono::steady_clock::now()) {}
PendingOp::PendingOp(DeviceCollectives::OpPtr d, std::string what, const ProcessGroup* group)
    : device_(std::move(d)), pending_(true), what_(std::move(what)), group_(group),
      issued_(std::chrono::steady_clock::now()) {}
PendingOp::PendingOp(PendingOp&& o) noexcept
    : req_(o.req_), async_(std::move(o.async_)), device_(std::move(o.device_)), pending_(o.pending_), tracked_(o.tracked_), then_(std::move(o.then_)),
      what_(std::move(o.what_)), group_(o.group_), logged_(o.logged_), seq_(o.seq_), issued_(o.issued_) {
  o.req_ = MPI_REQUEST_NULL;
  o.pending_ = false;
  o.tracked_ = false;
  o.then_ = nullptr;
  o.logged_ = nullptr;
}
PendingOp& PendingOp::operator=(PendingOp&& o) noexcept {
  if (this != &o) {
    wait();
    req_ = o.req_;
    async_ = std::move(o.async_);
    device_ = std::move(o.device_);
    pending_ = o.pending_;
    tracked_ = o.tracked_;
    then_ = std::move(o.then_);
    what_ = std::move(o.what_);
    group_ = o.group_;
    logged_ = o.logged_;
    seq_ = o.seq_;
    issued_ = o.issued_;
    o.req_ = MPI_REQUEST_NULL;
    o.pending_ = false;
    o.tracked_ = false;
    o.then_ = nullptr;
    o.logged_ = nullptr;
  }
  return *this;
}
PendingOp::~PendingOp() { wait(); }

bool PendingOp::test() {
  if (!pending_) return true;
  int flag = 1;
  if (async_) flag = async_->done();
  else if (device_) flag = device_->done();
  else if (req_ != MPI_REQUEST_NULL) MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
  if (flag) completed();
  return flag != 0;
}

void PendingOp::completed() {
  pending_ = false;
  if (then_) std::exchange(then_, nullptr)();
  record();
  if (!tracked_) return;
  tracked_ = false;
  if (async_) comm_timer.running.emplace_back(async_->began(), async_->ended());
  else comm_timer.running.emplace_back(issued_, Clock::now());
}

void PendingOp::track() { tracked_ = pending_; }

void PendingOp::log_to(CommOpStats* logged) {
  logged_ = logged;
  if (!pending_) record();
}

void PendingOp::record() {
  if (!logged_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - issued_).count();
  logged_->seconds += s;
  if (comm_log().verbose) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_rank == 0)
      std::fprintf(stderr, "comm op: %s | group %s (%d ranks) | msg size %llu B | latency %.3f ms\n", what_.c_str(),
                   group_ ? group_->name().c_str() : "?", logged_->group_size,
                   static_cast<unsigned long long>(logged_->calls ? logged_->msg_bytes / logged_->calls : 0), 1e3 * s);
  }
  logged_ = nullptr;
}

std::string PendingOp::describe() const {
  if (!group_) return what_;
  return strprintf("%s%s on the %s group", what_.c_str(),
                   seq_ ? strprintf(" #%llu", static_cast<unsigned long long>(seq_)).c_str() : "",
                   group_->name().c_str());
}

void poll_backoff(long& polls, double waited_s) {
  if (++polls <= 1000) return;
  if (waited_s < 2e-3) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void PendingOp::wait() {
  if (!pending_) return;
  using clock = std::chrono::steady_clock;
  const CommContext& ctx = comm_context();
  const double timeout = group_ ? group_->timeout_s() : ctx.timeout_s;
  // With the watchdog thread running, it owns the deadline (and asks every rank where it is).
  const bool watched = Watchdog::running();
  std::optional<Watchdog::Phase> phase;
  if (watched) phase.emplace(describe(), timeout);
  const auto start = clock::now();
  const bool exposed = tracked_;
  long polls = 0;
  while (!test()) {
    // A helper thread's operation: sleep until it is done (it needs the core more than we do).
    // MPI's: poll (poll_backoff).
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (async_) async_->wait_for(std::chrono::milliseconds(5));
    else poll_backoff(polls, waited);
    if (!watched && waited > timeout) {
      int world_rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      fprintf(stderr,
              "zero3d: watchdog: rank %d (%s) waited %.0f s (comm_timeout_s) in %s (rank %d of %d) at step %lld; "
              "another rank of that group is missing from the collective or has died. Aborting the job.\n",
              world_rank, host_name().c_str(), waited, describe().c_str(), group_ ? group_->rank() : -1, group_ ? group_->size() : 0,
              static_cast<long long>(ctx.step));
      abort_device_collectives();
      abort_mpi_job(kExitWatchdog);
    }
  }
  if (exposed) {  // the wait, split at the moment every rank had joined (helper operations)
    const auto end = clock::now();
    const auto joined = async_ ? std::clamp(async_->began(), start, end) : start;
    comm_timer.skew_s += seconds_between(start, joined);
    comm_timer.exposed_s += seconds_between(joined, async_ ? std::min(end, async_->ended()) : end);
  }
}

// ---- ProcessGroup: the front ends count, the transport moves ----

double ProcessGroup::timeout_s() const { return timeout_s_ > 0 ? timeout_s_ : comm_context().timeout_s; }

ProcessGroup::ProcessGroup(MPI_Comm comm, bool owned, std::string name)
    : comm_(comm), owned_(owned), name_(std::move(name)) {
  if (comm_ == MPI_COMM_NULL) {  // color MPI_UNDEFINED: this rank is in no group of this kind
    size_ = 0;
    rank_ = -1;
    return;
  }
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

ProcessGroup::ProcessGroup(int size, int rank, std::string name)
    : comm_(MPI_COMM_NULL), owned_(false), name_(std::move(name)) {
  size_ = size, rank_ = rank;
}

ProcessGroup::~ProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

CommOpStats* ProcessGroup::account(const char* op, uint64_t msg_bytes, uint64_t sent_bytes) {
  bytes_sent_ += sent_bytes;
  CommLog& log = comm_log();
  if (!log.enabled || !log.active || (!log.ops.empty() && !log.ops.count(op))) return nullptr;
  CommOpStats& st = log.stats[{name_, op}];
  st.calls += 1, st.msg_bytes += msg_bytes, st.sent_bytes += sent_bytes, st.group_size = size_;
  return &st;
}

template <typename Issue>
PendingOp ProcessGroup::counted(const char* op, uint64_t msg_bytes, uint64_t sent_bytes, Issue&& issue) {
  CommOpStats* logged = account(op, msg_bytes, sent_bytes);
  PendingOp out = issue();
  out.seq_ = ++ops_issued_;
  out.log_to(logged);
  out.track();
  return out;
}

PendingOp ProcessGroup::all_reduce(MemRef<void> buf, size_t n, CommType t, RedOp op) {
  const uint64_t bytes = n * elem_bytes(t);
  return counted("all_reduce", bytes, ring_bytes_sent(size_, bytes, 2), [&] { return all_reduce_impl(buf, n, t, op); });
}

PendingOp ProcessGroup::reduce_scatter(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) {
  const uint64_t whole = static_cast<uint64_t>(size_) * pc.part() * elem_bytes(t);
  return counted("reduce_scatter", whole, ring_bytes_sent(size_, whole, 1),
                 [&] { return reduce_scatter_impl(send, recv, pc, t); });
}

PendingOp ProcessGroup::all_gather(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) {
  const uint64_t whole = static_cast<uint64_t>(size_) * pc.part() * elem_bytes(t);
  return counted("all_gather", whole, ring_bytes_sent(size_, whole, 1),
                 [&] { return all_gather_impl(send, recv, pc, t); });
}

PendingOp ProcessGroup::all_gather(MemRef<const void> send, MemRef<void> recv, size_t count, CommType t) {
  const bool in_place = send.ptr == static_cast<const char*>(recv.ptr) + rank_ * count * elem_bytes(t);
  return all_gather(in_place ? MemRef<const void>{nullptr, send.kind} : send, recv, MessageSlices{{count}}, t);
}

PendingOp ProcessGroup::broadcast_bytes(MemRef<void> buf, size_t bytes, int root) {
  return counted("broadcast", bytes, rank_ == root && size_ > 1 ? bytes : 0,
                 [&] { return broadcast_impl(buf, bytes, root); });
}

PendingOp ProcessGroup::isend_bytes(MemRef<const void> buf, size_t bytes, int peer, int tag) {
  return counted("send", bytes, bytes, [&] { return send_impl(buf, bytes, peer, tag); });
}

PendingOp ProcessGroup::irecv_bytes(MemRef<void> buf, size_t bytes, int peer, int tag) {
  return counted("recv", bytes, 0, [&] { return recv_impl(buf, bytes, peer, tag); });
}

// ---- control traffic ----

// One scalar, in place, under the watchdog: the control-traffic reductions below.
template <typename T>
static T scalar_all_reduce(const ProcessGroup& g, T v, MPI_Datatype type, MPI_Op op) {
  T out = v;
  MPI_Request r = MPI_REQUEST_NULL;
  if (g.size() > 1) MPI_CHECK(MPI_Iallreduce(&v, &out, 1, type, op, g.comm(), &r));
  PendingOp(r, "all-reduce (scalar)", &g).wait();
  return out;
}

double ProcessGroup::all_reduce_sum(double v) { return scalar_all_reduce(*this, v, MPI_DOUBLE, MPI_SUM); }
double ProcessGroup::all_reduce_max(double v) { return scalar_all_reduce(*this, v, MPI_DOUBLE, MPI_MAX); }
int64_t ProcessGroup::all_reduce_max(int64_t v) { return scalar_all_reduce(*this, v, MPI_INT64_T, MPI_MAX); }

void ProcessGroup::all_reduce_sum(uint64_t* buf, size_t n) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1 && n > 0) MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count_of(n), MPI_UINT64_T, MPI_SUM, comm_, &r));
  PendingOp(r, "all-reduce (checksums)", this).wait();
}

void ProcessGroup::all_gather_u64(const std::vector<uint64_t>& mine, std::vector<uint64_t>& all) {
  all.assign(mine.size() * size_, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<size_t>(rank_) * mine.size());
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1)
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), count_of(mine.size()), MPI_UINT64_T,
                             comm_, &r));
  PendingOp(r, "all-gather (scalar)", this).wait();
}

void ProcessGroup::barrier() {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Ibarrier(comm_, &r));
  PendingOp(r, "barrier", this).wait();
}

std::string ProcessGroup::broadcast_string(const std::string& s, int root) {
  uint64_t n = s.size();
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Ibcast(&n, 1, MPI_UINT64_T, root, comm_, &r));
  PendingOp(r, "broadcast (control)", this).wait();
  std::string out = rank_ == root ? s : std::string(n, '\0');
  r = MPI_REQUEST_NULL;  // the first is done, and freed: an empty string waits on nothing
  if (size_ > 1 && n) MPI_CHECK(MPI_Ibcast(out.data(), count_of(n), MPI_CHAR, root, comm_, &r));
  PendingOp(r, "broadcast (control)", this).wait();
  return out;
}

void ProcessGroup::agree(const std::function<void()>& f) {
  std::string error;
  bool failed = false;
  int64_t code = kExitUserError;
  try {
    f();
  } catch (const UserError& e) {
    error = e.what(), failed = true;
  } catch (const RunError& e) {  // an I/O error's own code (a read that failed: kExitReadFailed)
    error = e.what(), failed = true, code = e.code;
  }
  constexpr int64_t kNone = INT64_MAX;
  const int64_t first = -all_reduce_max(-(failed ? static_cast<int64_t>(rank_) : kNone));
  if (first == kNone) return;
  code = all_reduce_max(rank_ == first ? code : int64_t{0});
  error = broadcast_string(error, static_cast<int>(first));
  if (code == kExitUserError) throw UserError(error);
  throw RunError(error, static_cast<int>(code));
}

}  // namespace zero3d
