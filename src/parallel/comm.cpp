#include "parallel/comm.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "kernels/math/dtype.h"

namespace zero3d {

CommContext& comm_context() {
  static CommContext ctx;
  return ctx;
}

CommLog& comm_log() {
  static CommLog log;
  return log;
}

namespace {
int count_of(size_t n) {
  Z3D_ASSERT(n <= static_cast<size_t>(INT_MAX), "message larger than 2^31 elements: lower the bucket size");
  return static_cast<int>(n);
}

// What one rank sends when `passes` ring passes (reduce-scatter and all-gather: 1, all-reduce: 2)
// run over a buffer of `buffer_bytes` shared by p ranks: each pass sends p-1 of the p blocks.
uint64_t ring_bytes_sent(int p, uint64_t buffer_bytes, int passes) {
  if (p <= 1) return 0;
  return static_cast<uint64_t>(passes) * (p - 1) * buffer_bytes / p;
}

// inout[i] = in[i] + inout[i], through float, rounded back to 16 bits: commutative, not associative.
// Each addition equals the correctly rounded 16-bit sum: rounding twice (to float, then to 16 bits)
// is innocuous when the intermediate has >= 2p+2 significand bits (Figueroa 1995), and float's 24
// cover p = 8 (bf16) and p = 11 (fp16).
template <float (*to_float)(uint16_t), uint16_t (*from_float)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = from_float(to_float(a[i]) + to_float(b[i]));
}

// The MPI handles for 16-bit sums, created on first use. Lifetime: MPI_Finalize itself frees
// them. A static destructor would run after main returns, i.e. after MPI_Finalize, when MPI calls
// are erroneous; freeing them from main would tie the seam to main.cpp. Instead an attribute on
// MPI_COMM_SELF carries a delete callback: MPI_Finalize first frees MPI_COMM_SELF, running that
// callback while MPI is still fully usable (MPI >= 2.0, section "Allowing User Functions at
// Process Termination"), whatever main does. A 16-bit op is never pending at finalize: every
// PendingOp waits in its destructor.
struct Mpi16 {
  MPI_Datatype type = MPI_DATATYPE_NULL;  // 2 contiguous bytes: no predefined op applies to it
  MPI_Op sum_bf16 = MPI_OP_NULL, sum_fp16 = MPI_OP_NULL;
};

int free_mpi16(MPI_Comm, int, void* attr, void*) {
  auto* h = static_cast<Mpi16*>(attr);
  MPI_Op_free(&h->sum_bf16);
  MPI_Op_free(&h->sum_fp16);
  MPI_Type_free(&h->type);
  return MPI_SUCCESS;
}

const Mpi16& mpi16() {
  static Mpi16 h;
  static const bool created = [] {
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &h.type));
    MPI_CHECK(MPI_Type_set_name(h.type, const_cast<char*>("zero3d_float16")));
    MPI_CHECK(MPI_Type_commit(&h.type));
    MPI_CHECK(MPI_Op_create(&sum16<math::float_from_bf16, math::bf16_from_float>, /*commute=*/1, &h.sum_bf16));
    MPI_CHECK(MPI_Op_create(&sum16<math::float_from_fp16, math::fp16_from_float>, /*commute=*/1, &h.sum_fp16));
    int key = MPI_KEYVAL_INVALID;
    MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_mpi16, &key, nullptr));
    MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, &h));
    MPI_CHECK(MPI_Comm_free_keyval(&key));  // the key itself lives on until the attribute is deleted
    return true;
  }();
  (void)created;
  return h;
}

MPI_Op sum_op(Dtype16 t) { return t == Dtype16::bf16 ? mpi16().sum_bf16 : mpi16().sum_fp16; }
}  // namespace

PendingOp::PendingOp(MPI_Request r, std::string what, const ProcessGroup* group, CommOpStats* logged)
    : req_(r), what_(std::move(what)), group_(group), logged_(logged), issued_(std::chrono::steady_clock::now()) {
  if (req_ == MPI_REQUEST_NULL) completed();
}
PendingOp::PendingOp(PendingOp&& o) noexcept
    : req_(o.req_), what_(std::move(o.what_)), group_(o.group_), logged_(o.logged_), issued_(o.issued_) {
  o.req_ = MPI_REQUEST_NULL;
  o.logged_ = nullptr;
}
PendingOp& PendingOp::operator=(PendingOp&& o) noexcept {
  if (this != &o) {
    wait();
    req_ = o.req_;
    what_ = std::move(o.what_);
    group_ = o.group_;
    logged_ = o.logged_;
    issued_ = o.issued_;
    o.req_ = MPI_REQUEST_NULL;
    o.logged_ = nullptr;
  }
  return *this;
}
PendingOp::~PendingOp() { wait(); }

bool PendingOp::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
  if (flag) completed();
  return flag != 0;
}

void PendingOp::completed() {
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

CommOpStats* ProcessGroup::account(const char* op, uint64_t msg_bytes, uint64_t sent_bytes) {
  bytes_sent_ += sent_bytes;
  CommLog& log = comm_log();
  if (!log.enabled || !log.active || (!log.ops.empty() && !log.ops.count(op))) return nullptr;
  CommOpStats& st = log.stats[{name_, op}];
  st.calls += 1, st.msg_bytes += msg_bytes, st.sent_bytes += sent_bytes, st.group_size = size_;
  return &st;
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
      MPI_Abort(MPI_COMM_WORLD, kExitWatchdog);
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

PendingOp ProcessGroup::all_reduce_impl(void* buf, size_t n, MPI_Datatype type, MPI_Op op, size_t elem_bytes) {
  MPI_Request r = MPI_REQUEST_NULL;
  CommOpStats* logged = account("all_reduce", n * elem_bytes, ring_bytes_sent(size_, n * elem_bytes, 2));
  if (size_ > 1) MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count_of(n), type, op, comm_, &r));
  return PendingOp(r, "all-reduce", this, logged);
}

PendingOp ProcessGroup::reduce_scatter_impl(const void* send, void* recv, size_t count, MPI_Datatype type, MPI_Op op,
                                            size_t elem_bytes) {
  MPI_Request r = MPI_REQUEST_NULL;
  const uint64_t whole = static_cast<uint64_t>(size_) * count * elem_bytes;
  CommOpStats* logged = account("reduce_scatter", whole, ring_bytes_sent(size_, whole, 1));
  if (size_ > 1)
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count_of(count), type, op, comm_, &r));
  else if (send != recv)
    memmove(recv, send, count * elem_bytes);
  return PendingOp(r, "reduce-scatter", this, logged);
}

PendingOp ProcessGroup::all_gather_impl(const void* send, void* recv, size_t count, MPI_Datatype type,
                                        size_t elem_bytes) {
  MPI_Request r = MPI_REQUEST_NULL;
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * count * elem_bytes;
  const uint64_t whole = static_cast<uint64_t>(size_) * count * elem_bytes;
  CommOpStats* logged = account("all_gather", whole, ring_bytes_sent(size_, whole, 1));
  if (size_ > 1)
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count_of(count), type, recv, count_of(count), type,
                             comm_, &r));
  else if (!in_place)
    memmove(recv, send, count * elem_bytes);
  return PendingOp(r, "all-gather", this, logged);
}

PendingOp ProcessGroup::iall_reduce_sum(float* buf, size_t n) {
  return all_reduce_impl(buf, n, MPI_FLOAT, MPI_SUM, sizeof(float));
}

void ProcessGroup::all_reduce_max(float* buf, size_t n) { all_reduce_impl(buf, n, MPI_FLOAT, MPI_MAX, sizeof(float)).wait(); }
PendingOp ProcessGroup::ireduce_scatter_sum(const float* send, float* recv, size_t count) {
  return reduce_scatter_impl(send, recv, count, MPI_FLOAT, MPI_SUM, sizeof(float));
}
PendingOp ProcessGroup::iall_gather(const float* send, float* recv, size_t count) {
  return all_gather_impl(send, recv, count, MPI_FLOAT, sizeof(float));
}

PendingOp ProcessGroup::iall_reduce_sum(uint16_t* buf, size_t n, Dtype16 t) {
  return all_reduce_impl(buf, n, mpi16().type, sum_op(t), sizeof(uint16_t));
}
PendingOp ProcessGroup::ireduce_scatter_sum(const uint16_t* send, uint16_t* recv, size_t count, Dtype16 t) {
  return reduce_scatter_impl(send, recv, count, mpi16().type, sum_op(t), sizeof(uint16_t));
}
PendingOp ProcessGroup::iall_gather(const uint16_t* send, uint16_t* recv, size_t count) {
  return all_gather_impl(send, recv, count, mpi16().type, sizeof(uint16_t));
}

void ProcessGroup::broadcast(void* buf, size_t bytes, int root) {
  MPI_Request r = MPI_REQUEST_NULL;
  CommOpStats* logged = account("broadcast", bytes, rank_ == root && size_ > 1 ? bytes : 0);
  if (size_ > 1) MPI_CHECK(MPI_Ibcast(buf, count_of(bytes), MPI_BYTE, root, comm_, &r));
  PendingOp(r, "broadcast", this, logged).wait();
}

PendingOp ProcessGroup::isend(const float* buf, size_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  CommOpStats* logged = account("send", n * sizeof(float), n * sizeof(float));
  MPI_CHECK(MPI_Isend(buf, count_of(n), MPI_FLOAT, peer, tag, comm_, &r));
  return PendingOp(r, "send", this, logged);
}

PendingOp ProcessGroup::irecv(float* buf, size_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  CommOpStats* logged = account("recv", n * sizeof(float), 0);
  MPI_CHECK(MPI_Irecv(buf, count_of(n), MPI_FLOAT, peer, tag, comm_, &r));
  return PendingOp(r, "receive", this, logged);
}

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
  broadcast(&n, sizeof n, root);
  std::string out = rank_ == root ? s : std::string(n, '\0');
  if (n) broadcast(out.data(), n, root);
  return out;
}

void ProcessGroup::agree(const std::function<void()>& f) {
  std::string error;
  bool failed = false;
  try {
    f();
  } catch (const UserError& e) {
    error = e.what(), failed = true;
  }
  constexpr int64_t kNone = INT64_MAX;
  const int64_t first = -all_reduce_max(-(failed ? static_cast<int64_t>(rank_) : kNone));
  if (first == kNone) return;
  throw UserError(broadcast_string(error, static_cast<int>(first)));
}

}  // namespace zero3d
