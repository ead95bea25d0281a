// parallel/groups.h: the process groups of one run, built once from the topology with one
// MPI_Comm_split per kind, and passed explicitly (no global communicators).
#pragma once
#include <memory>

#include "parallel/comm.h"
#include "parallel/topology.h"

namespace zero3d {

struct ProcessGroups {
  Topology topo;
  int world_rank = 0;
  GridCoord coord;
  std::unique_ptr<ProcessGroup> world, tp, dp, pp;
  // First and last pipeline stage of this rank's pp group (the tied embedding's gradient);
  // null on middle stages. With pp = 1 it is the rank alone.
  std::unique_ptr<ProcessGroup> embedding;

  // Collective over MPI_COMM_WORLD. Throws UserError (on every rank alike) for a bad layout.
  static ProcessGroups create(int tp_size, int pp_size);
  // The backend's device memory (null: host memory only), for every group (comm.h). Device sends
  // and receives go to the device's library on the pp group (the pipeline's), on every group with
  // `p2p_everywhere` (tests); elsewhere through MPI. Null detaches, before the backend goes.
  void use_device_memory(DeviceMemory* dev, bool p2p_everywhere = false);
};

}  // namespace zero3d
