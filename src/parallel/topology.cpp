#include "parallel/topology.h"

#include <algorithm>
#include <map>

#include "core/check.h"

namespace zero3d {

Topology Topology::make(int world, int tp, int pp) {
  if (tp < 1 || pp < 1) throw UserError(strprintf("tensor_parallel.tp_size (%d) and pipeline_parallel.pp_size (%d) must be >= 1", tp, pp));
  if (world < 1 || world % (tp * pp) != 0)
    throw UserError(strprintf("world size %d is not a multiple of tensor_parallel.tp_size %d x pipeline_parallel.pp_size %d "
                              "= %d; launch a multiple of %d ranks",
                              world, tp, pp, tp * pp, tp * pp));
  return Topology{world, tp, pp, world / (tp * pp)};
}

GridCoord Topology::coord(int rank) const {
  Z3D_ASSERT(rank >= 0 && rank < world, "rank outside the grid");
  return GridCoord{rank % tp, (rank / tp) % dp, rank / (tp * dp)};
}

std::vector<int> Topology::tp_group(int r) const {
  GridCoord c = coord(r);
  std::vector<int> g;
  for (int i = 0; i < tp; ++i) g.push_back(rank({i, c.dp, c.pp}));
  return g;
}

std::vector<int> Topology::dp_group(int r) const {
  GridCoord c = coord(r);
  std::vector<int> g;
  for (int i = 0; i < dp; ++i) g.push_back(rank({c.tp, i, c.pp}));
  return g;
}

std::vector<int> Topology::pp_group(int r) const {
  GridCoord c = coord(r);
  std::vector<int> g;
  for (int i = 0; i < pp; ++i) g.push_back(rank({c.tp, c.dp, i}));
  return g;
}

std::vector<int> Topology::embedding_group(int r) const {
  GridCoord c = coord(r);
  if (pp == 1) return {r};
  return {rank({c.tp, c.dp, 0}), rank({c.tp, c.dp, pp - 1})};
}

int Topology::tp_group_id(int r) const {
  GridCoord c = coord(r);
  return c.dp + dp * c.pp;
}
int Topology::dp_group_id(int r) const {
  GridCoord c = coord(r);
  return c.tp + tp * c.pp;
}
int Topology::pp_group_id(int r) const {
  GridCoord c = coord(r);
  return c.tp + tp * c.dp;
}

int Topology::fewest_on_a_node(std::vector<int> (Topology::*group)(int) const, int per_node) const {
  int fewest = 0;
  for (int r = 0; r < world; ++r) {
    std::map<int, int> on_node;  // node -> members of r's group there
    for (int m : (this->*group)(r)) ++on_node[m / per_node];
    if (on_node.size() < 2) continue;
    for (const auto& [node, n] : on_node) fewest = fewest == 0 ? n : std::min(fewest, n);
  }
  return fewest;
}

bool Topology::stage_boundary_across_nodes(int stage, int per_node) const {
  for (int t = 0; t < tp; ++t)
    for (int d = 0; d < dp; ++d)
      if (rank({t, d, stage}) / per_node != rank({t, d, stage + 1}) / per_node) return true;
  return false;
}

}  // namespace zero3d
