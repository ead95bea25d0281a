// parallel/comm_context.h: the process's communication settings, one CommContext that every
// group reads as it is made (how collectives move) and the watchdog reads at every wait (how long,
// and the step to name). The trainer fills it from the config before it makes the groups.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zero3d {

// Which implementation moves a group's host-memory data collectives: MPI's own, the node's
// shared memory (parallel/shm_collectives.h) for every size, or shared memory from
// shm_min_bytes up where the group's ranks share a node (auto).
enum class CollectiveImpl : uint8_t { automatic, mpi, shm };

// What the watchdog reports and how long it waits, and how collectives are moved; one per
// process, shared by all groups (a group reads the collectives settings when it is made).
struct CommContext {
  double timeout_s = 600;
  int64_t step = 0;  // training step, for the watchdog message
  CollectiveImpl collectives = CollectiveImpl::automatic;
  size_t shm_min_bytes = 64 << 10;    // auto: smaller messages go to MPI (its latency is lower)
  size_t shm_chunk_bytes = 256 << 10;  // bytes a rank publishes per round (the pipelining grain)
  int ranks_per_node = 0;  // tests: > 0 makes world ranks [k i, k i + k) look like one node each
  bool send_thread = true;  // host-memory sends polled by a thread of the group's (needs MPI_THREAD_MULTIPLE)
  bool device_library = true;  // device memory moved by the device's library (NCCL) where the backend has one
  // Shared memory reads the others' comm buffers in place (one copy) for every reduce-scatter, and
  // for all-gathers and all-reduces of at least these whole-buffer sizes (below them its two-copy
  // rounds stay in cache and win; measured with bench comm on 2 ranks). Tests lower them.
  size_t shm_gather_in_place_bytes = 1 << 20;
  size_t shm_all_reduce_in_place_bytes = 64 << 20;
};
CommContext& comm_context();  // ZERO3D_RANKS_PER_NODE (tests) read once, at the first call

}  // namespace zero3d
