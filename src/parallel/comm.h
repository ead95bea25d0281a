// parallel/comm.h: the collectives seam. A ProcessGroup is one group of ranks (world, tp, dp,
// pp, embedding) with blocking and non-blocking collectives on it. It is an interface: the data
// collectives are implemented once per transport (MpiGroup here; shared memory and NCCL beside
// it), chosen when the group is made; control traffic (scalars, agree, barrier) is MPI on host
// memory in every implementation. Model and trainer code never call MPI directly.
//
// Buffers carry their memory kind (core/mem.h). MpiGroup hands device buffers to MPI only when
// the library reports CUDA-awareness (OpenMPI's MPIX_Query_cuda_support); otherwise it stages
// them through page-locked host buffers it allocates once and reuses (device_path() says which).
//
// Two safety properties live here, so every caller gets them:
//  - Watchdog: every wait polls with a deadline (CommContext::timeout_s). A collective that has
//    not completed by then prints the rank, group, operation and training step, and aborts the
//    job instead of hanging until the wall-time limit.
//  - Accounting: bytes_sent() counts what this rank sends under the ring algorithms
//    (all-reduce 2(p-1)/p of the buffer, reduce-scatter and all-gather (p-1)/p, broadcast and
//    send the whole buffer), the volume the ZeRO paper's analysis uses.
//  - Comms log (DeepSpeed's comms_logger): per group and collective, calls, message bytes, bytes
//    sent (the accounting above), and latency from issue to observed completion, counted while the
//    log is active (the trainer's steps). Scalar control reductions are counted in neither.
//
// 16-bit collectives (bf16, fp16 as raw uint16_t bits) serve mixed-precision ZeRO. MPI has no
// 16-bit float type, so sums run through a user-defined MPI_Op that converts each pair to float,
// adds, and rounds back to nearest even: every pairwise addition rounds to 16 bits, so a result
// depends on the reduction order MPI picks (tree, ring, recursive halving) and may differ between
// group sizes or MPI versions, unlike a float-accumulated sum (whether all ranks of one call get
// the same bits is, as for float sums, up to the MPI library; the standard only recommends it).
// An fp16 sum beyond 65504 becomes inf (and stays inf), so an overflow is caught by a later inf check.
#pragma once
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/device_collectives.h"
#include "core/mem.h"
#include "parallel/comm_context.h"

namespace zero3d {

// Time the calling thread's data collectives took (wall_clock_breakdown):
//  - busy_s: while at least one was running, overlapping ones counted once. A helper thread's
//    operation runs from the moment every rank has joined it to its end; MPI's, which only
//    advance inside MPI calls and cannot tell, from issue to observed completion.
//  - exposed_s: the part of wait() calls during which the operation waited for was running;
//    busy - exposed is what hid behind other work.
//  - skew_s: the part of wait() calls before every rank had joined (a helper thread's operations
//    only; in MPI's this wait counts as exposed): the group's slowest rank, not communication.
struct CommTime {
  double busy_s = 0, exposed_s = 0, skew_s = 0;
};
CommTime take_comm_time();  // since the last call, on this thread

// Between two polls of an MPI request: spin for the first 1000, then yield the core until 2 ms
// have passed, then sleep 50 us. MPI advances only inside MPI calls, so sleeping stalls an
// operation between its steps (50 us sleeps made 1 MiB reductions 2x slower); a wait past 2 ms is
// mostly for a rank still computing, and on an oversubscribed node the sleep gives it the core.
void poll_backoff(long& polls, double waited_s);

// The completion of an operation that a helper thread runs (shared-memory collectives, sends on
// a send thread): the helper calls begin() (when the operation's time starts) and finish(); the
// owner polls done() or sleeps in wait_for().
class AsyncCompletion {
 public:
  void begin() { began_ = Clock::now(); }  // every rank has joined: from here on it runs
  void finish();
  bool done() const { return done_.load(std::memory_order_acquire); }
  void wait_for(std::chrono::microseconds d);
  Clock::time_point began() const { return began_; }  // once done()
  Clock::time_point ended() const { return at_; }     // once done()

 private:
  std::atomic<bool> done_{false};
  std::mutex m_;
  std::condition_variable cv_;
  Clock::time_point began_{}, at_{};
};

// One (group, collective) of the comms log.
struct CommOpStats {
  int64_t calls = 0;
  uint64_t msg_bytes = 0;   // the buffers' sizes, summed (all-gather/reduce-scatter: the whole buffer)
  uint64_t sent_bytes = 0;  // what this rank sent (bytes_sent's accounting)
  double seconds = 0;       // issue to completion, summed
  int group_size = 1;
};
struct CommLog {
  bool enabled = false;  // comms_logger.enabled
  bool active = false;   // counting now (the trainer's steps)
  bool verbose = false;  // print every op on rank 0 as it completes
  std::set<std::string> ops;  // empty: every op (prof_all); else only these ("all_reduce", ...)
  std::map<std::pair<std::string, std::string>, CommOpStats> stats;  // (group, op) -> stats
};
CommLog& comm_log();

// A pending non-blocking operation; wait() blocks (under the watchdog), test() polls. `then` runs
// once at completion, before anyone sees the result (a staged buffer copied back to the device).
// nccl-tests' bus-bandwidth share of a collective on p ranks (busbw = algbw x this): what a ring
// moves per byte of the buffer, 2(p-1)/p for "all_reduce", (p-1)/p for "reduce_scatter" and
// "all_gather", 1 for anything else.
double bus_share(const std::string& op, int p);

class PendingOp {
 public:
  using Then = std::function<void()>;
  PendingOp() = default;
  PendingOp(MPI_Request r, std::string what, const class ProcessGroup* group, Then then = {});
  PendingOp(std::shared_ptr<AsyncCompletion> a, std::string what, const class ProcessGroup* group);
  PendingOp(DeviceCollectives::OpPtr d, std::string what, const class ProcessGroup* group);
  PendingOp(PendingOp&& o) noexcept;
  PendingOp& operator=(PendingOp&& o) noexcept;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;
  ~PendingOp();  // waits if still pending: a request is never leaked
  void wait();
  bool test();
  bool done() const { return !pending_; }
  // Counts the latency from issue to completion in this comms-log entry (null: none).
  void log_to(CommOpStats* logged);

 private:
  friend class ProcessGroup;
  void completed();  // runs `then`, adds the latency to the comms log and the comm time
  void record();     // the latency, into the comms log
  void track();      // a data collective: counted in the thread's CommTime until completed
  std::string describe() const;  // "all-reduce #17 on the dp group"
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::shared_ptr<AsyncCompletion> async_;  // set: a helper thread runs it (req_ unused)
  DeviceCollectives::OpPtr device_;          // set: the device's library runs it (req_ unused)
  bool pending_ = false;
  bool tracked_ = false;
  Then then_;
  std::string what_;
  const ProcessGroup* group_ = nullptr;
  CommOpStats* logged_ = nullptr;
  uint64_t seq_ = 0;  // the how-manieth data collective of its group (0: a control operation)
  std::chrono::steady_clock::time_point issued_{};
};

class ProcessGroup {
 public:
  // MPI_COMM_WORLD, and the groups of ranks with the same color in `parent` (ordered by key;
  // color MPI_UNDEFINED: this rank is in none, size() 0). Collective over the parent.
  static std::unique_ptr<ProcessGroup> world();
  static std::unique_ptr<ProcessGroup> split(const ProcessGroup& parent, int color, int key, std::string name);
  // The ranks of this group that share this rank's node (MPI_COMM_TYPE_SHARED; in tests, nodes of
  // comm_context().ranks_per_node consecutive world ranks: split_node_comm).
  std::unique_ptr<ProcessGroup> split_node(std::string name) const;
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& name() const { return name_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }
  // How long a wait on this group may take before the watchdog acts; 0 (default): comm_timeout_s.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout_s() const;

  // Where device buffers come from (the backend's); null: this group only ever sees host memory.
  // Collective over the group. `point_to_point`: its device sends and receives go to the device's
  // library too (which connects each rank to its neighbours now), else through MPI. Null detaches
  // (before the backend goes: the staging buffers and the library are the backend's).
  virtual void use_device_memory(DeviceMemory* dev, bool point_to_point) = 0;
  // How device buffers travel, for the run record ("host memory only", "CUDA-aware MPI", ...).
  virtual std::string device_path() const = 0;
  // How host-memory collectives travel, for the run record ("shared memory", "MPI", ...).
  virtual std::string collectives_path() const = 0;

  // In place: buf = sum (max) over the group.
  PendingOp iall_reduce_sum(MemRef<float> buf, size_t n) { return all_reduce(buf, n, CommType::f32, RedOp::sum); }
  void all_reduce_sum(MemRef<float> buf, size_t n) { iall_reduce_sum(buf, n).wait(); }
  void all_reduce_max(MemRef<float> buf, size_t n) { all_reduce(buf, n, CommType::f32, RedOp::max).wait(); }
  // recv (count) = this rank's block of the elementwise sum of every rank's send (size()*count).
  PendingOp ireduce_scatter_sum(MemRef<const float> send, MemRef<float> recv, size_t count) {
    return reduce_scatter(send, recv, count, CommType::f32);
  }
  void reduce_scatter_sum(MemRef<const float> send, MemRef<float> recv, size_t count) {
    ireduce_scatter_sum(send, recv, count).wait();
  }
  // Several in one operation (MessageSlices): recv gets this rank's blocks of the pieces of send.
  PendingOp ireduce_scatter_sum(MemRef<const float> send, MemRef<float> recv, const MessageSlices& pieces) {
    return reduce_scatter(send, recv, pieces, CommType::f32);
  }
  // recv (size()*count) = every rank's send (count), in group-rank order. send may be recv + rank*count.
  PendingOp iall_gather(MemRef<const float> send, MemRef<float> recv, size_t count) {
    return all_gather(send, recv, count, CommType::f32);
  }
  // Several in place (MessageSlices): buf holds every rank's data, this rank's blocks filled; afterwards
  // every rank's are.
  PendingOp iall_gather_in_place(MemRef<float> buf, const MessageSlices& pieces) {
    return all_gather(MemRef<const void>{nullptr, buf.kind}, buf, pieces, CommType::f32);
  }
  void all_gather(MemRef<const float> send, MemRef<float> recv, size_t count) { iall_gather(send, recv, count).wait(); }
  // The same three on 16-bit floats (raw bits); sums round each pairwise addition (see the top).
  PendingOp iall_reduce_sum(MemRef<uint16_t> buf, size_t n, Dtype16 t) {
    return all_reduce(buf, n, comm_type(t), RedOp::sum);
  }
  void all_reduce_sum(MemRef<uint16_t> buf, size_t n, Dtype16 t) { iall_reduce_sum(buf, n, t).wait(); }
  PendingOp ireduce_scatter_sum(MemRef<const uint16_t> send, MemRef<uint16_t> recv, size_t count, Dtype16 t) {
    return reduce_scatter(send, recv, count, comm_type(t));
  }
  void reduce_scatter_sum(MemRef<const uint16_t> send, MemRef<uint16_t> recv, size_t count, Dtype16 t) {
    ireduce_scatter_sum(send, recv, count, t).wait();
  }
  PendingOp ireduce_scatter_sum(MemRef<const uint16_t> send, MemRef<uint16_t> recv, const MessageSlices& pieces, Dtype16 t) {
    return reduce_scatter(send, recv, pieces, comm_type(t));
  }
  // A copy, so any 16-bit type. send may be recv + rank*count.
  PendingOp iall_gather(MemRef<const uint16_t> send, MemRef<uint16_t> recv, size_t count) {
    return all_gather(send, recv, count, CommType::bf16);
  }
  void all_gather(MemRef<const uint16_t> send, MemRef<uint16_t> recv, size_t count) {
    iall_gather(send, recv, count).wait();
  }
  PendingOp iall_gather_in_place(MemRef<uint16_t> buf, const MessageSlices& pieces) {
    return all_gather(MemRef<const void>{nullptr, buf.kind}, buf, pieces, CommType::bf16);
  }
  void broadcast(MemRef<void> buf, size_t bytes, int root) { broadcast_bytes(buf, bytes, root).wait(); }
  PendingOp isend(MemRef<const float> buf, size_t n, int peer, int tag) { return isend_bytes(buf, n * sizeof(float), peer, tag); }
  PendingOp irecv(MemRef<float> buf, size_t n, int peer, int tag) { return irecv_bytes(buf, n * sizeof(float), peer, tag); }
  // Any element type, as bytes: the pipeline's activations, fp32 or bf16.
  PendingOp isend_bytes(MemRef<const void> buf, size_t bytes, int peer, int tag);
  PendingOp irecv_bytes(MemRef<void> buf, size_t bytes, int peer, int tag);

  // ---- control traffic: host memory, MPI, not counted in bytes_sent ----
  double all_reduce_sum(double v);
  double all_reduce_max(double v);
  int64_t all_reduce_max(int64_t v);
  // In place, elementwise sum modulo 2^64 (checksums).
  void all_reduce_sum(uint64_t* buf, size_t n);
  // all = every rank's `mine` (all the same length), in group-rank order.
  void all_gather_u64(const std::vector<uint64_t>& mine, std::vector<uint64_t>& all);
  void barrier();  // under the watchdog
  std::string broadcast_string(const std::string& s, int root);  // root's s on every rank, any length
  // Runs f on every rank; when it throws UserError or RunError on any rank, every rank throws the
  // error (and exit code) of the lowest such rank, so no rank goes on into a collective that the
  // others will never join.
  void agree(const std::function<void()>& f);

  // The MPI communicator under the group: control traffic, MPI-IO, splits.
  MPI_Comm comm() const { return comm_; }

 protected:
  // Takes `comm` (freed at destruction when `owned`).
  ProcessGroup(MPI_Comm comm, bool owned, std::string name);
  // A group of `size` ranks, this one `rank`, with no communicator: zero3d plan's stand-ins, which
  // size a layout's engine without communicating (src/plan).
  ProcessGroup(int size, int rank, std::string name);
  // The data collectives, one implementation per transport; the front ends above count them
  // (bytes_sent, comms log) before calling these, so every transport is counted alike.
  virtual PendingOp all_reduce_impl(MemRef<void> buf, size_t n, CommType t, RedOp op) = 0;
  // all_gather_impl: send.ptr null is in place (this rank's blocks already in recv).
  virtual PendingOp reduce_scatter_impl(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) = 0;
  virtual PendingOp all_gather_impl(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) = 0;
  virtual PendingOp broadcast_impl(MemRef<void> buf, size_t bytes, int root) = 0;
  virtual PendingOp send_impl(MemRef<const void> buf, size_t bytes, int peer, int tag) = 0;
  virtual PendingOp recv_impl(MemRef<void> buf, size_t bytes, int peer, int tag) = 0;

 public:
  // The element type as a value, for callers that choose it once (zero/grad_sync.cpp).
  PendingOp all_reduce(MemRef<void> buf, size_t n, CommType t, RedOp op);
  PendingOp reduce_scatter(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t);

 private:
  PendingOp all_gather(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t);
  PendingOp reduce_scatter(MemRef<const void> send, MemRef<void> recv, size_t count, CommType t) {
    return reduce_scatter(send, recv, MessageSlices{{count}}, t);
  }
  PendingOp all_gather(MemRef<const void> send, MemRef<void> recv, size_t count, CommType t);
  PendingOp broadcast_bytes(MemRef<void> buf, size_t bytes, int root);
  // Counts a collective in bytes_sent and, when active, in the comms log (its entry, or null).
  CommOpStats* account(const char* op, uint64_t msg_bytes, uint64_t sent_bytes);
  // account(), then issue() (the transport's operation), logged from issue to completion.
  template <typename Issue>
  PendingOp counted(const char* op, uint64_t msg_bytes, uint64_t sent_bytes, Issue&& issue);

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int size_ = 1, rank_ = 0;
  std::string name_;
  uint64_t bytes_sent_ = 0;
  uint64_t ops_issued_ = 0;  // data collectives issued: the same count on every rank of the group
  double timeout_s_ = 0;
};

// n elements as the count MPI takes (an int); larger is a bug of the bucket sizes (asserted).
int count_of(size_t n);

}  // namespace zero3d
