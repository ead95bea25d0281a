// parallel/shm_collectives.h: all-reduce, reduce-scatter and all-gather among the ranks of one
// node through one shared memory segment, at memory speed (OpenMPI's two-copy shared-memory
// transport does the same copies but runs its reduction trees over point-to-point messages).
//
// The segment holds, per rank, K slots of C bytes to publish into and K slots of C bytes for
// reduced results, and three counters (posted, reduced, freed), each on its own cache line.
// A collective is a sequence of rounds; round G uses slot G % K on every rank:
//   1. wait until every rank has freed round G - K (its slot may be overwritten);
//   2. copy this round's chunks of the input into the own slot, then posted = G + 1;
//   3. wait until every rank posted G + 1; reduce (or copy out) from every rank's slot;
//   4. all-reduce only: the reduced chunk goes to the own result slot too, reduced = G + 1,
//      then, once every rank reduced G + 1, the others' reduced chunks are copied out;
//   5. freed = G + 1.
// With K = 2 a rank fills its next slot while the others still read the previous one.
//
// Determinism: every element is summed in group-rank order (rank 0's value, plus rank 1's, ...)
// in fp32, and a 16-bit result is rounded once at the end; all-reduce is that reduce-scatter
// followed by copies, so every rank gets the same bits, for every run and chunk size. For 2 ranks
// this is the one addition MPI makes too; for more it is a fixed order where MPI's depends on its
// algorithm (and 16-bit sums are more accurate: MPI rounds after every pairwise addition).
//
// Progress: collectives run in issue order on one helper thread per group, which never calls MPI;
// the caller's PendingOp completes when the helper is done, so a reduction advances while the
// caller computes (OpenMPI has no progress thread). Waits spin briefly, then yield, then sleep:
// on an oversubscribed node the ranks that are computing keep their cores.
//
// Single copy: where every rank's input is a comm buffer (core/shared_memory.h; the engine
// allocates its gradient and parameter buffers so), each rank maps the others' buffers and reads
// them where they lie: a reduce-scatter reads every input once and writes its block once, with no
// publishing copy. Every rank publishes where its input lies in one extra round and all take the
// same path; the sums are the same bits as the two-copy path's. Such an operation completes when
// every rank is done reading, so no input is written while another rank reads it.
//
// The segment is a POSIX shared memory object that rank 0 creates and unlinks as soon as every
// rank has mapped it, so nothing is left behind whatever way the job ends.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace zero3d {

// The ranks of comm on this rank's node (MPI_COMM_TYPE_SHARED, ordered as in comm), or, when
// comm_context().ranks_per_node is k > 0 (tests), those whose world ranks share world rank / k:
// one node made to look like several. Collective over comm; the caller frees the result.
MPI_Comm split_node_comm(MPI_Comm comm);

// Operations of this process that read the others' buffers in place (tests).
uint64_t shm_single_copy_ops();

// All-reduce, reduce-scatter and all-gather on host memory beside MPI's own: the node's shared
// memory (ShmCollectives), or that composed with MPI across nodes (mpi_group.cpp). The same
// contracts as ProcessGroup's (comm.h); the operations return at once and run on a helper thread.
class HostCollectives {
 public:
  virtual ~HostCollectives() = default;
  virtual PendingOp all_reduce(void* buf, size_t n, CommType t, RedOp op, const ProcessGroup* g) = 0;
  // all_gather: send null is in place.
  virtual PendingOp reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t,
                                   const ProcessGroup* g) = 0;
  virtual PendingOp all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t, const ProcessGroup* g) = 0;
  virtual std::string describe() const = 0;  // for the run record: "shared memory", ...
};

class ShmCollectives final : public HostCollectives {
 public:
  // Collective over comm, whose ranks share one node (the caller knows: split_node_comm). Null
  // (MPI then moves everything) when comm has one rank or the segment cannot be made (logged).
  static std::unique_ptr<ShmCollectives> create(MPI_Comm comm, size_t chunk_bytes);
  ~ShmCollectives() override;
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // RedOp::max only on f32.
  PendingOp all_reduce(void* buf, size_t n, CommType t, RedOp op, const ProcessGroup* g) override;
  PendingOp reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t, const ProcessGroup* g) override;
  PendingOp all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t, const ProcessGroup* g) override;
  std::string describe() const override { return "shared memory"; }

  // Runs work on the helper thread, in issue order with the operations above (a composition of
  // them with MPI calls: the hierarchical collectives of groups that span nodes).
  PendingOp run(const char* what, const ProcessGroup* g, std::function<void()> work);
  // The operations themselves, blocking; only inside run()'s work.
  void all_reduce_here(void* buf, size_t n, CommType t, RedOp op);
  void reduce_scatter_here(const void* send, void* recv, size_t count, CommType t);
  void all_gather_here(const void* send, void* recv, size_t count, CommType t);

  struct Impl;

 private:
  explicit ShmCollectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero3d
