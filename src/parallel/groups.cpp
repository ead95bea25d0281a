#include "parallel/groups.h"

namespace zero3d {

ProcessGroups ProcessGroups::create(int tp_size, int pp_size) {
  ProcessGroups g;
  g.world = ProcessGroup::world();
  g.world_rank = g.world->rank();
  g.topo = Topology::make(g.world->size(), tp_size, pp_size);
  g.coord = g.topo.coord(g.world_rank);
  const int r = g.world_rank;
  MPI_Comm w = g.world->comm();
  g.tp = std::make_unique<ProcessGroup>(w, g.topo.tp_group_id(r), g.coord.tp, "tp");
  g.dp = std::make_unique<ProcessGroup>(w, g.topo.dp_group_id(r), g.coord.dp, "dp");
  g.pp = std::make_unique<ProcessGroup>(w, g.topo.pp_group_id(r), g.coord.pp, "pp");
  const bool in_embedding = g.topo.is_first_stage(r) || g.topo.is_last_stage(r);
  auto emb = std::make_unique<ProcessGroup>(w, in_embedding ? g.topo.pp_group_id(r) : MPI_UNDEFINED, g.coord.pp,
                                            "embedding");
  if (in_embedding) g.embedding = std::move(emb);
  return g;
}

}  // namespace zero3d
