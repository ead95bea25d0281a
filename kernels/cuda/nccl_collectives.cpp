// kernels/cuda/nccl_collectives.cpp: the data collectives of a group on device memory, by NCCL.
//
// A group gets one communicator for its collectives and, with more than one rank and
// point_to_point (the pp group), two for its sends and receives: "up" carries every message from a
// lower to a higher group rank, "down" the others. Each communicator has its own stream. NCCL runs
// a send until the peer's receive takes it, and one communicator's operations run one after
// another, so a pipeline's activations (up) and gradients (down) on one communicator would wait on
// each other: stage s sending an activation to s+1 while s+1 sends a gradient to s, each waiting
// for the other to receive, is the textbook deadlock. Split by direction, neighbour-to-neighbour
// traffic (the pipeline's, a ring's) flows one way along the ranks on each communicator, and no
// chain of waits can close a circle (traffic that skips ranks could still make one). Sends and
// receives match in issue order per peer and direction.
//
// NCCL connects a pair of ranks at its first send or receive between them, and the calling thread
// waits there for the peer's first call on that communicator: a ring whose ranks each first
// receive from their left would never get past it. So the constructor connects every rank to its
// neighbours (and 0 to p-1) on both lanes at once, in one group call all ranks make.
//
// Ordering: an operation is enqueued on its stream behind an event recorded on the compute stream
// when it is issued, so it reads what the kernels before it wrote. Its completion is an event after
// it, which done() polls: the host sees the result only when the GPU has finished, so a kernel
// the caller enqueues after the wait runs after the operation too.
//
// Errors: done() asks NCCL for the communicator's asynchronous error while an operation is
// pending (a peer that died, a network failure) and fails the job with it; the watchdog, when a
// wait passes comm_timeout_s, calls abort() before it aborts the job: ncclCommRevoke stops every
// lane's kernels, then ncclCommAbort frees the communicators, under a lock that keeps operations
// from asking a freed communicator anything (they report "not done" until MPI_Abort ends us).
//
// Operations are issued from one thread at a time (the training thread): NCCL communicators and
// the lanes' `ready` events are not shared between threads.
#include "kernels/cuda/nccl_collectives.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/check.cuh"
#include "core/device_collectives.h"
#include "core/library_file.h"

#if defined(ZERO3D_HAVE_NCCL)
#include <nccl.h>

#define NCCL_CHECK(stmt) Z3D_CHECK_GEN("NCCL", stmt, status == ncclSuccess, ncclGetErrorString(status))

namespace zero3d {
namespace {

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::f32: return ncclFloat32;
    case CommType::bf16: return ncclBfloat16;
    case CommType::fp16: return ncclFloat16;
  }
  return ncclFloat32;
}

// One communicator and the stream its operations run on.
struct Lane {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the compute stream, waited for by `stream`
};

// Whether the watchdog has aborted a group's communicators, and the lock that orders it with the
// group's operations asking them anything.
struct AbortState {
  std::mutex mu;
  bool aborted = false;
};

// An operation in flight: the event recorded after it on its lane's stream.
class NcclOp final : public DeviceCollectives::Op {
 public:
  NcclOp(cudaEvent_t done, ncclComm_t comm, const char* what, const std::string& group,
         std::shared_ptr<AbortState> abort)
      : done_(done), comm_(comm), what_(what), group_(group), abort_(std::move(abort)) {}
  ~NcclOp() override { cudaEventDestroy(done_); }  // released by CUDA once the event has passed
  NcclOp(const NcclOp&) = delete;
  NcclOp& operator=(const NcclOp&) = delete;

  bool done() override {
    std::lock_guard<std::mutex> lock(abort_->mu);
    if (abort_->aborted) return false;  // the job is being aborted: the communicator is gone
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      fatal("NCCL",
            strprintf("%s on the %s group failed: %s (%s)", what_, group_.c_str(), ncclGetErrorString(async),
                      ncclGetLastError(comm_)),
            "ncclCommGetAsyncError", __FILE__, __LINE__);
    return false;
  }

 private:
  cudaEvent_t done_;
  ncclComm_t comm_;
  const char* what_;
  std::string group_;
  std::shared_ptr<AbortState> abort_;
};

class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(cudaStream_t compute, int size, int rank, std::string name, bool point_to_point,
                  const DeviceMemory::Share& share)
      : compute_(compute), p_(size), r_(rank), p2p_(point_to_point && size > 1), name_(std::move(name)) {
    CUDA_CHECK(cudaGetDevice(&device_));
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    describe_ = "NCCL " + dotted_version(version);
    // Rank 0's unique ids reach every rank through the group's MPI; one communicator per lane.
    const int lanes = p2p_ ? 3 : 1;
    std::vector<ncclUniqueId> mine(lanes), all(static_cast<size_t>(lanes) * size);
    if (rank == 0)
      for (ncclUniqueId& id : mine) NCCL_CHECK(ncclGetUniqueId(&id));
    share(mine.data(), all.data(), lanes * sizeof(ncclUniqueId));
    Lane* made[3] = {&coll_, &up_, &down_};
    int lowest = 0, highest = 0;  // stream priorities: communication first, as compute waits on it
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    for (int l = 0; l < lanes; ++l) {
      Lane& lane = *made[l];
      NCCL_CHECK(ncclCommInitRank(&lane.comm, size, all[l], rank));
      CUDA_CHECK(cudaStreamCreateWithPriority(&lane.stream, cudaStreamNonBlocking, highest));
      CUDA_CHECK(cudaEventCreateWithFlags(&lane.ready, cudaEventDisableTiming));
    }
    if (p2p_) connect_neighbours();
  }
  ~NcclCollectives() override {
    const bool aborted = abort_->aborted;  // then the communicators are freed already
    for (Lane* lane : {&coll_, &up_, &down_}) {
      if (lane->stream && !aborted) cudaStreamSynchronize(lane->stream);
      if (lane->comm && !aborted) ncclCommDestroy(lane->comm);
      if (lane->ready) cudaEventDestroy(lane->ready);
      if (lane->stream) cudaStreamDestroy(lane->stream);
    }
  }
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  std::string describe() const override { return describe_; }
  bool point_to_point() const override { return p2p_; }

  OpPtr all_reduce(void* buf, size_t n, CommType t, RedOp op) override {
    return run(coll_, "all-reduce", [&](ncclComm_t c, cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(t), op == RedOp::max ? ncclMax : ncclSum, c, s));
    });
  }

  // Several pieces: one NCCL call each, fused into one operation by a group call.
  OpPtr reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t) override {
    const size_t eb = elem_bytes(t);
    return run(coll_, "reduce-scatter", [&](ncclComm_t c, cudaStream_t s) {
      const char* from = static_cast<const char*>(send);
      char* to = static_cast<char*>(recv);
      NCCL_CHECK(ncclGroupStart());
      for (size_t count : pc.counts) {
        if (count) NCCL_CHECK(ncclReduceScatter(from, to, count, nccl_type(t), ncclSum, c, s));
        from += p_ * count * eb, to += count * eb;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  // In place (send null): each piece's own block already lies at its place in recv, which is
  // NCCL's in-place all-gather (sendbuff == recvbuff + rank * count).
  OpPtr all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t) override {
    const size_t eb = elem_bytes(t);
    return run(coll_, "all-gather", [&](ncclComm_t c, cudaStream_t s) {
      const char* from = static_cast<const char*>(send);
      char* to = static_cast<char*>(recv);
      NCCL_CHECK(ncclGroupStart());
      for (size_t count : pc.counts) {
        const void* mine = from ? static_cast<const void*>(from) : to + r_ * count * eb;
        if (count) NCCL_CHECK(ncclAllGather(mine, to, count, nccl_type(t), c, s));
        if (from) from += count * eb;
        to += p_ * count * eb;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  OpPtr broadcast(void* buf, size_t bytes, int root) override {
    return run(coll_, "broadcast", [&](ncclComm_t c, cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, s));
    });
  }

  OpPtr send(const void* buf, size_t bytes, int peer) override {
    Z3D_ASSERT(p2p_, "a device send on a group made without point_to_point");
    Z3D_ASSERT(peer != r_ && peer >= 0 && peer < p_, "send to a peer outside the group, or to itself");
    return run(peer > r_ ? up_ : down_, "send", [&](ncclComm_t c, cudaStream_t s) {
      NCCL_CHECK(ncclSend(buf, bytes, ncclUint8, peer, c, s));
    });
  }

  OpPtr recv(void* buf, size_t bytes, int peer) override {
    Z3D_ASSERT(p2p_, "a device receive on a group made without point_to_point");
    Z3D_ASSERT(peer != r_ && peer >= 0 && peer < p_, "receive from a peer outside the group, or from itself");
    return run(peer < r_ ? up_ : down_, "receive", [&](ncclComm_t c, cudaStream_t s) {
      NCCL_CHECK(ncclRecv(buf, bytes, ncclUint8, peer, c, s));
    });
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(abort_->mu);
    if (abort_->aborted) return;
    abort_->aborted = true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    for (Lane* lane : {&coll_, &up_, &down_})  // every lane's kernels stop before any is freed
      if (lane->comm) ncclCommRevoke(lane->comm, NCCL_REVOKE_DEFAULT);
#endif
    for (Lane* lane : {&coll_, &up_, &down_})
      if (lane->comm) ncclCommAbort(lane->comm);
  }

 private:
  // Enqueues `issue` on the lane's stream behind the compute stream's work, and an event after it.
  // The device is made current first: events are created on the current one.
  template <typename Issue>
  OpPtr run(Lane& lane, const char* what, Issue&& issue) {
    while (aborting())  // the watchdog is ending the job: issue nothing on freed communicators
      std::this_thread::sleep_for(std::chrono::seconds(1));
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaEventRecord(lane.ready, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(lane.stream, lane.ready, 0));
    issue(lane.comm, lane.stream);
    cudaEvent_t done = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(done, lane.stream));
    return std::make_unique<NcclOp>(done, lane.comm, what, name_, abort_);
  }

  bool aborting() const {
    std::lock_guard<std::mutex> lock(abort_->mu);
    return abort_->aborted;
  }

  // One byte each way between every pair of neighbours (and 0 and p-1), on both lanes, in one
  // group call: up carries the lower rank's send, down the higher rank's (see the top).
  void connect_neighbours() {
    std::vector<int> peers;
    for (int q : {r_ - 1, r_ + 1, r_ == 0 ? p_ - 1 : -1, r_ == p_ - 1 ? 0 : -1})
      if (q >= 0 && q < p_ && q != r_ && std::find(peers.begin(), peers.end(), q) == peers.end()) peers.push_back(q);
    char* bytes = nullptr;  // byte 0 is sent; each receive gets its own
    CUDA_CHECK(cudaMalloc(&bytes, 2 * peers.size() + 1));
    NCCL_CHECK(ncclGroupStart());
    int k = 1;
    for (int q : peers) {
      Lane& to = q > r_ ? up_ : down_;    // where this rank's messages to q travel
      Lane& from = q < r_ ? up_ : down_;  // where q's messages to this rank travel
      NCCL_CHECK(ncclSend(bytes, 1, ncclUint8, q, to.comm, to.stream));
      NCCL_CHECK(ncclRecv(bytes + k++, 1, ncclUint8, q, from.comm, from.stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(up_.stream));
    CUDA_CHECK(cudaStreamSynchronize(down_.stream));
    CUDA_CHECK(cudaFree(bytes));
  }

  cudaStream_t compute_;
  int device_ = 0;
  int p_, r_;
  bool p2p_;
  std::string name_, describe_;
  Lane coll_, up_, down_;
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
};

}  // namespace

std::unique_ptr<DeviceCollectives> make_nccl_collectives(cudaStream_t compute, int size, int rank,
                                                         const std::string& name, bool point_to_point,
                                                         const DeviceMemory::Share& share) {
  return std::make_unique<NcclCollectives>(compute, size, rank, name, point_to_point, share);
}

}  // namespace zero3d

#else  // a build without NCCL: device buffers are staged through host memory (parallel/mpi_group.cpp)

namespace zero3d {
std::unique_ptr<DeviceCollectives> make_nccl_collectives(cudaStream_t, int, int, const std::string&, bool,
                                                         const DeviceMemory::Share&) {
  return nullptr;
}
}  // namespace zero3d

#endif
