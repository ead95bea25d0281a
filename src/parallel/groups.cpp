#include "parallel/groups.h"

namespace zero3d {

ProcessGroups ProcessGroups::create(int tp_size, int pp_size) {
  ProcessGroups g;
  g.world = ProcessGroup::world();
  g.world_rank = g.world->rank();
  g.topo = Topology::make(g.world->size(), tp_size, pp_size);
  g.coord = g.topo.coord(g.world_rank);
  const int r = g.world_rank;
  const ProcessGroup& w = *g.world;
  g.tp = ProcessGroup::split(w, g.topo.tp_group_id(r), g.coord.tp, "tp");
  g.dp = ProcessGroup::split(w, g.topo.dp_group_id(r), g.coord.dp, "dp");
  g.pp = ProcessGroup::split(w, g.topo.pp_group_id(r), g.coord.pp, "pp");
  const bool in_embedding = g.topo.is_first_stage(r) || g.topo.is_last_stage(r);
  auto emb = ProcessGroup::split(w, in_embedding ? g.topo.pp_group_id(r) : MPI_UNDEFINED, g.coord.pp, "embedding");
  if (in_embedding) g.embedding = std::move(emb);
  return g;
}

void ProcessGroups::use_device_memory(DeviceMemory* dev, bool p2p_everywhere) {
  for (ProcessGroup* g : {world.get(), tp.get(), dp.get(), pp.get(), embedding.get()})
    if (g) g->use_device_memory(dev, p2p_everywhere || g == pp.get());
}

}  // namespace zero3d
