#include "model/flat_layout.h"

#include <algorithm>
#include <climits>

#include "core/check.h"

namespace zero3d {

ShardInfo shard_of(size_t padded, int dp, int rank) {
  Z3D_ASSERT(padded % dp == 0, "shard_of needs a padded size divisible by dp");
  const size_t size = padded / dp;
  return ShardInfo{static_cast<size_t>(rank) * size, size};
}

FlatLayout make_flat_layout(const std::vector<ParamInfo>& logical, int dp, size_t bucket_elems, size_t persist_below) {
  FlatLayout L;
  L.dp = dp;
  L.tensors = logical;
  const size_t align = static_cast<size_t>(dp) * FlatLayout::kShardAlign;
  auto pad = [&](size_t n) { return (n + align - 1) / align * align; };
  size_t offset = 0;
  auto close_bucket = [&](Bucket& b) {
    b.size = pad(b.size);
    b.shard_offset = L.shard_size;
    L.shard_size += b.size / dp;
    if (b.persistent) {
      b.resident_offset = L.resident_size;
      L.resident_size += b.size;
    }
    offset = b.offset + b.size;
    L.buckets.push_back(b);
  };
  for (size_t i = 0; i < logical.size();) {
    const int unit = logical[i].unit;
    Unit u;
    u.offset = offset;
    u.first_bucket = static_cast<int>(L.buckets.size());
    auto persists = [&](size_t t) { return logical[t].size < persist_below; };
    Bucket b{unit, offset, 0, 0, static_cast<int>(i), 0, persists(i), 0};
    for (; i < logical.size() && logical[i].unit == unit; ++i) {
      const size_t n = logical[i].size;
      const bool alone = logical[i].own_bucket || (b.num_tensors > 0 && logical[i - 1].own_bucket);
      if (b.num_tensors > 0 && (b.size + n > bucket_elems || persists(i) != b.persistent || alone)) {
        close_bucket(b);
        b = Bucket{unit, offset, 0, 0, static_cast<int>(i), 0, persists(i), 0};
      }
      L.tensors[i].offset = b.offset + b.size;
      b.size += n;
      ++b.num_tensors;
      L.num_params += n;
    }
    close_bucket(b);
    u.num_buckets = static_cast<int>(L.buckets.size()) - u.first_bucket;
    u.size = offset - u.offset;
    L.units.push_back(u);
  }
  L.total = offset;
  return L;
}

std::vector<BucketMessage> bucket_messages(const FlatLayout& L, int first, int last, size_t limit) {
  limit = std::min<size_t>(limit, INT_MAX);  // MPI counts are int
  std::vector<BucketMessage> runs;
  size_t elems = 0;
  for (int i = first; i < last; ++i) {
    const size_t n = L.buckets[i].size;
    if (runs.empty() || elems + n > limit) {
      runs.push_back({i, i});
      elems = 0;
    }
    runs.back().last = i + 1;
    elems += n;
  }
  return runs;
}

std::vector<size_t> slice_counts(const FlatLayout& L, BucketMessage run) {
  std::vector<size_t> counts;
  for (int i = run.first; i < run.last; ++i) counts.push_back(L.buckets[i].size / L.dp);
  return counts;
}

}  // namespace zero3d
