#include "parallel/comm.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>

#include "core/check.h"

namespace zero3d {

CommContext& comm_context() {
  static CommContext ctx;
  return ctx;
}

namespace {
int count_of(size_t n) {
  Z3D_ASSERT(n <= static_cast<size_t>(INT_MAX), "message larger than 2^31 elements: lower the bucket size");
  return static_cast<int>(n);
}
}  // namespace

PendingOp::PendingOp(MPI_Request r, std::string what, const ProcessGroup* group)
    : req_(r), what_(std::move(what)), group_(group) {}
PendingOp::PendingOp(PendingOp&& o) noexcept : req_(o.req_), what_(std::move(o.what_)), group_(o.group_) {
  o.req_ = MPI_REQUEST_NULL;
}
PendingOp& PendingOp::operator=(PendingOp&& o) noexcept {
  if (this != &o) {
    wait();
    req_ = o.req_;
    what_ = std::move(o.what_);
    group_ = o.group_;
    o.req_ = MPI_REQUEST_NULL;
  }
  return *this;
}
PendingOp::~PendingOp() { wait(); }

bool PendingOp::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

void PendingOp::wait() {
  if (req_ == MPI_REQUEST_NULL) return;
  using clock = std::chrono::steady_clock;
  const CommContext& ctx = comm_context();
  const auto start = clock::now();
  long polls = 0;
  while (!test()) {
    // Spin briefly (latency), then yield the core to other ranks on an oversubscribed node.
    if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > ctx.timeout_s) {
      int world_rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      char host[256] = "?";
      gethostname(host, sizeof host - 1);
      fprintf(stderr,
              "zero3d: watchdog: rank %d (%s) waited %.0f s (comm_timeout_s) in %s on the %s group (rank %d of %d) "
              "at step %lld; another rank of that group is missing from the collective or has died. Aborting the job.\n",
              world_rank, host, waited, what_.c_str(), group_ ? group_->name().c_str() : "?",
              group_ ? group_->rank() : -1, group_ ? group_->size() : -1, static_cast<long long>(ctx.step));
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
}

ProcessGroup::ProcessGroup(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

ProcessGroup::ProcessGroup(MPI_Comm parent, int color, int key, std::string name) : name_(std::move(name)) {
  MPI_CHECK(MPI_Comm_split(parent, color, key, &comm_));
  owned_ = true;
  if (comm_ == MPI_COMM_NULL) {  // color MPI_UNDEFINED: this rank is in no group of this kind
    size_ = 0;
    rank_ = -1;
    return;
  }
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

std::unique_ptr<ProcessGroup> ProcessGroup::world() {
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(MPI_COMM_WORLD, "world"));
}

ProcessGroup::~ProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

PendingOp ProcessGroup::iall_reduce_sum(float* buf, size_t n) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count_of(n), MPI_FLOAT, MPI_SUM, comm_, &r));
  bytes_sent_ += 2 * (size_ - 1) * n * sizeof(float) / size_;
  return PendingOp(r, "all-reduce", this);
}

PendingOp ProcessGroup::ireduce_scatter_sum(const float* send, float* recv, size_t count) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1)
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count_of(count), MPI_FLOAT, MPI_SUM, comm_, &r));
  else if (send != recv)
    std::copy(send, send + count, recv);
  bytes_sent_ += (size_ - 1) * count * sizeof(float);
  return PendingOp(r, "reduce-scatter", this);
}

PendingOp ProcessGroup::iall_gather(const float* send, float* recv, size_t count) {
  MPI_Request r = MPI_REQUEST_NULL;
  const bool in_place = send == recv + static_cast<size_t>(rank_) * count;
  if (size_ > 1)
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count_of(count), MPI_FLOAT, recv, count_of(count),
                             MPI_FLOAT, comm_, &r));
  else if (!in_place)
    std::copy(send, send + count, recv);
  bytes_sent_ += (size_ - 1) * count * sizeof(float);
  return PendingOp(r, "all-gather", this);
}

void ProcessGroup::broadcast(void* buf, size_t bytes, int root) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Ibcast(buf, count_of(bytes), MPI_BYTE, root, comm_, &r));
  if (rank_ == root) bytes_sent_ += bytes * (size_ > 1 ? 1 : 0);
  PendingOp(r, "broadcast", this).wait();
}

PendingOp ProcessGroup::isend(const float* buf, size_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Isend(buf, count_of(n), MPI_FLOAT, peer, tag, comm_, &r));
  bytes_sent_ += n * sizeof(float);
  return PendingOp(r, "send", this);
}

PendingOp ProcessGroup::irecv(float* buf, size_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Irecv(buf, count_of(n), MPI_FLOAT, peer, tag, comm_, &r));
  return PendingOp(r, "receive", this);
}

double ProcessGroup::all_reduce_sum(double v) {
  double out = v;
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_SUM, comm_, &r));
  PendingOp(r, "all-reduce (scalar)", this).wait();
  return out;
}

double ProcessGroup::all_reduce_max(double v) {
  double out = v;
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, comm_, &r));
  PendingOp(r, "all-reduce (scalar)", this).wait();
  return out;
}

int64_t ProcessGroup::all_reduce_max(int64_t v) {
  int64_t out = v;
  MPI_Request r = MPI_REQUEST_NULL;
  if (size_ > 1) MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, comm_, &r));
  PendingOp(r, "all-reduce (scalar)", this).wait();
  return out;
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

}  // namespace zero3d
