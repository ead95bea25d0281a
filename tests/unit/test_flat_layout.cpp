// The flat layout and the one sharding function: equal aligned slices, buckets within bounds,
// tensors never split or overlapping, padding only between tensors.
#include <gtest/gtest.h>

#include "model/flat_layout.h"
#include "model/gpt.h"

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

// Messages (reduce_bucket_size, allgather_bucket_size): runs cover the buckets once, in order, each
// at most the limit unless it is one bucket larger than the limit, and no run could take the next
// bucket without passing the limit (greedy: as few messages as the limit allows).
TEST(FlatLayout, BucketRunsTileTheBucketsWithinTheLimit) {
  ModelConfig m{256, 64, 3, 4, 128};
  FlatLayout L = make_flat_layout(gpt_param_table(m), 2, 4000);
  const int nb = static_cast<int>(L.buckets.size());
  for (size_t limit : {size_t(0), size_t(4000), size_t(9000), size_t(50000), size_t(1) << 40}) {
    const std::vector<BucketMessage> runs = bucket_messages(L, 0, nb, limit);
    int next = 0;
    for (const BucketMessage& r : runs) {
      EXPECT_EQ(r.first, next);
      EXPECT_LT(r.first, r.last);
      size_t elems = 0;
      for (int i = r.first; i < r.last; ++i) elems += L.buckets[i].size;
      if (r.last - r.first > 1) { EXPECT_LE(elems, limit); }
      if (r.last < nb) { EXPECT_GT(elems + L.buckets[r.last].size, limit); }
      const std::vector<size_t> counts = slice_counts(L, r);
      ASSERT_EQ(counts.size(), size_t(r.last - r.first));
      for (int i = r.first; i < r.last; ++i) EXPECT_EQ(counts[i - r.first], L.buckets[i].size / 2);
      next = r.last;
    }
    EXPECT_EQ(next, nb);
    if (limit == 0) { EXPECT_EQ(runs.size(), size_t(nb)); }
    if (limit == size_t(1) << 40) { EXPECT_EQ(runs.size(), 1u); }
  }
  EXPECT_TRUE(bucket_messages(L, 3, 3, 100).empty());
}
