// The flat layout and the one sharding function: equal aligned slices, buckets within bounds,
// tensors never split or overlapping, padding only between tensors.
#include <gtest/gtest.h>

#include "model/flat_layout.h"

using namespace zero3d;

TEST(FlatLayout, ShardOfSplitsEvenly) {
  EXPECT_EQ(shard_of(96, 3, 0).offset, 0u);
  EXPECT_EQ(shard_of(96, 3, 2).offset, 64u);
  EXPECT_EQ(shard_of(96, 3, 2).size, 32u);
}

TEST(FlatLayout, BucketsArePaddedAlignedAndBounded) {
  ModelConfig m{256, 64, 3, 4, 128};
  auto logical = gpt_param_table(m);
  for (int dp : {1, 2, 3, 8}) {
    for (size_t bucket : {size_t(1000), size_t(20000), size_t(1) << 30}) {
      FlatLayout L = make_flat_layout(logical, dp, bucket);
      EXPECT_EQ(L.units.size(), size_t(m.n_layer + 2));
      size_t shard = 0, end = 0;
      for (const Bucket& b : L.buckets) {
        EXPECT_EQ(b.offset, end);
        EXPECT_EQ(b.size % (dp * FlatLayout::kShardAlign), 0u);
        EXPECT_EQ(b.shard_offset, shard);
        shard += b.size / dp;
        end = b.offset + b.size;
        size_t used = 0;
        for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t) {
          EXPECT_EQ(L.tensors[t].offset, b.offset + used) << L.tensors[t].name;
          EXPECT_EQ(L.tensors[t].unit, b.unit);
          used += L.tensors[t].size;
        }
        EXPECT_LT(b.size - used, dp * FlatLayout::kShardAlign);  // padding only at the end
        if (b.num_tensors > 1) {
          EXPECT_LE(used, bucket);  // only a lone tensor may exceed
        }
      }
      EXPECT_EQ(end, L.total);
      EXPECT_EQ(shard, L.shard_size);
      EXPECT_EQ(L.shard_size * dp, L.total);
      size_t n = 0;
      for (const auto& t : logical) n += t.size;
      EXPECT_EQ(L.num_params, n);
    }
  }
}
