// parallel/comm.h: the collectives seam. A ProcessGroup is one group of ranks (world, tp, dp,
// pp, embedding) with blocking and non-blocking collectives on it, over MPI on host memory (an
// NCCL implementation and device buffers come with the GPU path). Model and trainer code never
// call MPI directly.
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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace zero3d {

// Which 16-bit float format a uint16_t buffer holds.
enum class Dtype16 { bf16, fp16 };

// What the watchdog reports and how long it waits; one per process, shared by all groups.
struct CommContext {
  double timeout_s = 600;
  int64_t step = 0;  // training step, for the watchdog message
};
CommContext& comm_context();

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

// A pending non-blocking operation; wait() blocks (under the watchdog), test() polls.
class PendingOp {
 public:
  PendingOp() = default;
  PendingOp(MPI_Request r, std::string what, const class ProcessGroup* group, CommOpStats* logged = nullptr);
  PendingOp(PendingOp&& o) noexcept;
  PendingOp& operator=(PendingOp&& o) noexcept;
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;
  ~PendingOp();  // waits if still pending: a request is never leaked
  void wait();
  bool test();
  bool done() const { return req_ == MPI_REQUEST_NULL; }

 private:
  void completed();  // adds the latency to the comms log
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string what_;
  const ProcessGroup* group_ = nullptr;
  CommOpStats* logged_ = nullptr;
  std::chrono::steady_clock::time_point issued_{};
};

class ProcessGroup {
 public:
  // Collective over `parent`: ranks with the same color form one group, ordered by key.
  ProcessGroup(MPI_Comm parent, int color, int key, std::string name);
  static std::unique_ptr<ProcessGroup> world();
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::string& name() const { return name_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  void reset_bytes_sent() { bytes_sent_ = 0; }

  // In place: buf = sum (max) over the group.
  PendingOp iall_reduce_sum(float* buf, size_t n);
  void all_reduce_sum(float* buf, size_t n) { iall_reduce_sum(buf, n).wait(); }
  void all_reduce_max(float* buf, size_t n);
  // recv (count) = this rank's block of the elementwise sum of every rank's send (size()*count).
  PendingOp ireduce_scatter_sum(const float* send, float* recv, size_t count);
  void reduce_scatter_sum(const float* send, float* recv, size_t count) { ireduce_scatter_sum(send, recv, count).wait(); }
  // recv (size()*count) = every rank's send (count), in group-rank order. send may be recv + rank*count.
  PendingOp iall_gather(const float* send, float* recv, size_t count);
  void all_gather(const float* send, float* recv, size_t count) { iall_gather(send, recv, count).wait(); }
  // The same three on 16-bit floats (raw bits); sums round each pairwise addition (see the top).
  PendingOp iall_reduce_sum(uint16_t* buf, size_t n, Dtype16 t);
  void all_reduce_sum(uint16_t* buf, size_t n, Dtype16 t) { iall_reduce_sum(buf, n, t).wait(); }
  PendingOp ireduce_scatter_sum(const uint16_t* send, uint16_t* recv, size_t count, Dtype16 t);
  void reduce_scatter_sum(const uint16_t* send, uint16_t* recv, size_t count, Dtype16 t) {
    ireduce_scatter_sum(send, recv, count, t).wait();
  }
  // A copy, so any 16-bit type. send may be recv + rank*count.
  PendingOp iall_gather(const uint16_t* send, uint16_t* recv, size_t count);
  void all_gather(const uint16_t* send, uint16_t* recv, size_t count) { iall_gather(send, recv, count).wait(); }
  void broadcast(void* buf, size_t bytes, int root);
  PendingOp isend(const float* buf, size_t n, int peer, int tag);
  PendingOp irecv(float* buf, size_t n, int peer, int tag);

  // Small reductions of scalars (not counted in bytes_sent: control traffic).
  double all_reduce_sum(double v);
  double all_reduce_max(double v);
  int64_t all_reduce_max(int64_t v);
  // In place, elementwise sum modulo 2^64 (checksums).
  void all_reduce_sum(uint64_t* buf, size_t n);
  // all = every rank's `mine` (all the same length), in group-rank order.
  void all_gather_u64(const std::vector<uint64_t>& mine, std::vector<uint64_t>& all);

  // Control helpers, each once here for every caller:
  void barrier();  // under the watchdog
  std::string broadcast_string(const std::string& s, int root);  // root's s on every rank, any length
  // Runs f on every rank; when it throws UserError on any rank, every rank throws the error of the
  // lowest such rank, so no rank goes on into a collective that the others will never join.
  void agree(const std::function<void()>& f);

  MPI_Comm comm() const { return comm_; }

 private:
  ProcessGroup(MPI_Comm comm, std::string name);
  // One implementation per collective for every element type; elem_bytes is the size of `type`.
  PendingOp all_reduce_impl(void* buf, size_t n, MPI_Datatype type, MPI_Op op, size_t elem_bytes);
  PendingOp reduce_scatter_impl(const void* send, void* recv, size_t count, MPI_Datatype type, MPI_Op op,
                                size_t elem_bytes);
  PendingOp all_gather_impl(const void* send, void* recv, size_t count, MPI_Datatype type, size_t elem_bytes);
  // Counts a collective in bytes_sent and, when active, in the comms log (its entry, or null).
  CommOpStats* account(const char* op, uint64_t msg_bytes, uint64_t sent_bytes);
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int size_ = 1, rank_ = 0;
  std::string name_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace zero3d
