// parallel/topology.h: the 3-D process grid as pure arithmetic (no MPI), Megatron order:
// tensor-parallel innermost, then data-parallel, then pipeline-parallel:
//     rank = tp_rank + tp * (dp_rank + dp * pp_rank),   dp = world / (tp * pp).
// Worked example, world 8, tp 2, pp 2 (so dp 2):
//     rank      0 1 2 3 4 5 6 7
//     tp_rank   0 1 0 1 0 1 0 1
//     dp_rank   0 0 1 1 0 0 1 1
//     pp_rank   0 0 0 0 1 1 1 1
//     tp groups {0,1} {2,3} {4,5} {6,7}     (same dp_rank and pp_rank)
//     dp groups {0,2} {1,3} {4,6} {5,7}     (same tp_rank and pp_rank)
//     pp groups {0,4} {1,5} {2,6} {3,7}     (same tp_rank and dp_rank)
//     embedding groups = first + last stage of each pp group: {0,4} {1,5} {2,6} {3,7}
// With pp = 1 the embedding group is the rank alone (first and last stage coincide).
#pragma once
#include <vector>

namespace zero3d {

struct GridCoord {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const GridCoord&) const = default;
};

struct Topology {
  int world = 1, tp = 1, pp = 1, dp = 1;

  // Throws UserError unless world is a positive multiple of tp * pp.
  static Topology make(int world, int tp, int pp);

  GridCoord coord(int rank) const;
  int rank(GridCoord c) const { return c.tp + tp * (c.dp + dp * c.pp); }

  // Members of each group that `rank` belongs to, in group-rank order (ascending world rank).
  std::vector<int> tp_group(int rank) const;
  std::vector<int> dp_group(int rank) const;
  std::vector<int> pp_group(int rank) const;
  std::vector<int> embedding_group(int rank) const;

  // A number that is the same for every member of one group and different across groups of the
  // same kind: the MPI_Comm_split color.
  int tp_group_id(int rank) const;
  int dp_group_id(int rank) const;
  int pp_group_id(int rank) const;
  bool is_first_stage(int rank) const { return coord(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coord(rank).pp == pp - 1; }

  // On nodes of `per_node` consecutive ranks: over every group of a kind (&Topology::tp_group,
  // &Topology::dp_group), the fewest members one node holds of a group that spans nodes (its
  // share of the network), or 0 when no group spans nodes. E.g. world 24, tp 3, nodes of 8: the tp
  // group {6, 7, 8} spans two nodes with 2 and 1 of its ranks: 1.
  int fewest_on_a_node(std::vector<int> (Topology::*group)(int) const, int per_node) const;
  // Whether some rank of pipeline stage `stage` has its neighbour in stage `stage + 1` on another node.
  bool stage_boundary_across_nodes(int stage, int per_node) const;
};

}  // namespace zero3d
