// Topology: pure arithmetic, checked against hand-written group lists (no MPI needed).
#include <gtest/gtest.h>

#include <set>

#include "core/check.h"
#include "parallel/topology.h"

using namespace zero3d;
using V = std::vector<int>;

TEST(Topology, WorkedExampleFromTheHeader) {
  Topology t = Topology::make(8, 2, 2);
  EXPECT_EQ(t.dp, 2);
  EXPECT_EQ(t.coord(5), (GridCoord{1, 0, 1}));
  EXPECT_EQ(t.coord(6), (GridCoord{0, 1, 1}));
  EXPECT_EQ(t.tp_group(3), (V{2, 3}));
  EXPECT_EQ(t.dp_group(5), (V{5, 7}));
  EXPECT_EQ(t.pp_group(2), (V{2, 6}));
  EXPECT_EQ(t.embedding_group(6), (V{2, 6}));
}

TEST(Topology, PipelineOfFourWithTensorTwo) {
  // world 8, tp 2, pp 4 -> dp 1: rank = tp_rank + 2 * pp_rank
  Topology t = Topology::make(8, 2, 4);
  EXPECT_EQ(t.dp, 1);
  EXPECT_EQ(t.pp_group(1), (V{1, 3, 5, 7}));
  EXPECT_EQ(t.tp_group(4), (V{4, 5}));
  EXPECT_EQ(t.dp_group(4), (V{4}));
  EXPECT_EQ(t.embedding_group(3), (V{1, 7}));
  EXPECT_TRUE(t.is_first_stage(1));
  EXPECT_TRUE(t.is_last_stage(7));
  EXPECT_FALSE(t.is_last_stage(5));
}

TEST(Topology, DataParallelOnly) {
  Topology t = Topology::make(4, 1, 1);
  EXPECT_EQ(t.dp, 4);
  EXPECT_EQ(t.dp_group(2), (V{0, 1, 2, 3}));
  EXPECT_EQ(t.tp_group(2), (V{2}));
  EXPECT_EQ(t.embedding_group(2), (V{2}));
}

TEST(Topology, TwelveRanksTensorThreePipelineTwo) {
  // world 12, tp 3, pp 2 -> dp 2; rank = tp + 3*(dp + 2*pp)
  Topology t = Topology::make(12, 3, 2);
  EXPECT_EQ(t.dp, 2);
  EXPECT_EQ(t.coord(10), (GridCoord{1, 1, 1}));
  EXPECT_EQ(t.tp_group(10), (V{9, 10, 11}));
  EXPECT_EQ(t.dp_group(10), (V{7, 10}));
  EXPECT_EQ(t.pp_group(10), (V{4, 10}));
}

TEST(Topology, RankAndCoordAreInverseAndGroupsPartitionTheWorld) {
  for (auto [w, tp, pp] : {std::tuple{8, 1, 1}, {8, 2, 2}, {8, 4, 2}, {8, 1, 8}, {6, 3, 1}, {16, 2, 4}}) {
    Topology t = Topology::make(w, tp, pp);
    std::set<int> tp_ids, dp_ids, pp_ids;
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(t.rank(t.coord(r)), r);
      for (int m : t.tp_group(r)) EXPECT_EQ(t.tp_group_id(m), t.tp_group_id(r));
      for (int m : t.dp_group(r)) EXPECT_EQ(t.dp_group_id(m), t.dp_group_id(r));
      for (int m : t.pp_group(r)) EXPECT_EQ(t.pp_group_id(m), t.pp_group_id(r));
      tp_ids.insert(t.tp_group_id(r));
      dp_ids.insert(t.dp_group_id(r));
      pp_ids.insert(t.pp_group_id(r));
    }
    EXPECT_EQ(static_cast<int>(tp_ids.size()), w / tp);
    EXPECT_EQ(static_cast<int>(dp_ids.size()), w / t.dp);
    EXPECT_EQ(static_cast<int>(pp_ids.size()), w / pp);
  }
}

TEST(Topology, WorldNotAMultipleIsAUserError) {
  try {
    Topology::make(6, 2, 2);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not a multiple"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Topology::make(4, 0, 1), UserError);
}

// Nodes of consecutive ranks: a group that straddles a node boundary is across nodes even when its
// size divides nothing (tp 3 on nodes of 8), and its share of the network is its fewest members on one.
TEST(Topology, GroupsAcrossNodes) {
  const Topology t = Topology::make(24, 3, 1);  // dp 8
  EXPECT_EQ(t.fewest_on_a_node(&Topology::tp_group, 8), 1);   // {6, 7, 8}: 2 on node 0, 1 on node 1
  EXPECT_EQ(t.fewest_on_a_node(&Topology::tp_group, 24), 0);  // one node
  EXPECT_EQ(t.fewest_on_a_node(&Topology::dp_group, 8), 2);   // {0, 3, .., 21}: 3, 3 and 2 a node
  const Topology w = Topology::make(16, 8, 1);                // dp 2
  EXPECT_EQ(w.fewest_on_a_node(&Topology::tp_group, 8), 0);   // a node each
  EXPECT_EQ(w.fewest_on_a_node(&Topology::dp_group, 8), 1);   // {r, r + 8}
  const Topology p = Topology::make(16, 2, 4);                // dp 2: stages of 4 ranks
  EXPECT_FALSE(p.stage_boundary_across_nodes(0, 8));          // ranks 0-3 -> 4-7
  EXPECT_TRUE(p.stage_boundary_across_nodes(1, 8));           // 4-7 -> 8-11
  EXPECT_FALSE(p.stage_boundary_across_nodes(2, 8));
}
