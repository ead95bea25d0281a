// model/flat_layout.h: where every parameter lives in the flat buffers, and which part of each
// bucket a data-parallel rank owns.
//
// The words for a part of a buffer, used alike in model/, zero/, parallel/ and ckpt/:
//   tensor   one parameter (ParamInfo): a contiguous range of the flat buffer
//   unit     the tensors ZeRO-3 gathers and backward hands over together: the embeddings, each
//            block, the final LayerNorm
//   bucket   whole tensors of one unit, at most bucket_elems elements, padded to dp * 16
//   slice    a dp rank's equal part of a bucket (ShardInfo, from shard_of: the one sharding function)
//   shard    a rank's slices of all buckets, one after another (shard_offset)
//   message  consecutive buckets that travel as one collective (BucketMessage; its slice counts
//            are core/device_collectives.h's MessageSlices)
//   piece    a rank's local elements of one tensor (zero/shard_view.h: owned, saved, checkpointed)
//   run      elements whose logical indices are consecutive (LogicalRun), a piece is a list of runs
//   rect     a rectangle of a logical tensor (LogicalRect): what HDF5 selects in a checkpoint
// Names private to one file (a GradSync's unit gradient buffer, "Slab"; an optimizer state's
// "Span"; the engine's update "Segment") are defined where they are declared.
//
// Tensors are grouped into units: the granularity at which ZeRO-3 gathers and backward hands
// gradients over. Each unit is cut into buckets of whole tensors of at most `bucket_elems`
// elements (a larger tensor is a bucket alone), and every bucket is padded to a multiple of
// dp * 16 elements, so each of the dp ranks owns an equal, 64-byte-aligned slice of every bucket:
// ShardInfo from shard_of(), the one sharding function. Padding sits only between tensors and is
// always zero. The rank's shard is the concatenation of its slices of all buckets (shard_offset
// in the shard buffers).
#pragma once
#include <cstddef>
#include <vector>

#include "model/param_info.h"

namespace zero3d {

struct ShardInfo {
  size_t offset = 0;  // elements from the start of the padded range
  size_t size = 0;
};

// Rank `rank` of `dp` owns [offset, offset + size) of a range of `padded` elements (a multiple of dp).
ShardInfo shard_of(size_t padded, int dp, int rank);

struct Bucket {
  int unit = 0;
  size_t offset = 0;        // in the flat buffer
  size_t size = 0;          // padded: a multiple of dp * kShardAlign
  size_t shard_offset = 0;  // where this bucket's slice starts in the rank's shard buffers
  int first_tensor = 0, num_tensors = 0;
  // ZeRO-3: tensors below stage3_param_persistence_threshold stay whole on every rank; they are
  // grouped into buckets of their own, kept at resident_offset of the resident buffer.
  bool persistent = false;
  size_t resident_offset = 0;
};

struct Unit {
  size_t offset = 0, size = 0;  // padded range of all its buckets in the flat buffer
  int first_bucket = 0, num_buckets = 0;
};

struct FlatLayout {
  static constexpr size_t kShardAlign = 16;  // elements: 64 bytes
  std::vector<ParamInfo> tensors;  // offsets into the padded flat buffer
  std::vector<Unit> units;
  std::vector<Bucket> buckets;
  size_t total = 0;       // padded elements of the flat buffer
  size_t num_params = 0;  // logical parameters (no padding)
  size_t shard_size = 0;  // elements of one rank's shard (total / dp)
  size_t resident_size = 0;  // elements of all persistent buckets
  int dp = 1;

  ShardInfo slice(const Bucket& b, int rank) const { return shard_of(b.size, dp, rank); }
};

// Consecutive buckets [first, last) that travel as one message: contiguous in the flat buffer,
// and so are their slices in the shard (reduce_bucket_size, allgather_bucket_size).
struct BucketMessage {
  int first = 0, last = 0;
};
// Buckets [first, last) in runs of at most `limit` elements each (a larger bucket alone; 0: one
// bucket each; never more than INT_MAX, MPI's largest count), in order.
std::vector<BucketMessage> bucket_messages(const FlatLayout& L, int first, int last, size_t limit);
// The elements per rank of each bucket of a run (what one rank sends or keeps of each).
std::vector<size_t> slice_counts(const FlatLayout& L, BucketMessage run);

// persist_below: tensors with fewer elements are persistent (ZeRO-3); 0 = none.
FlatLayout make_flat_layout(const std::vector<ParamInfo>& logical, int dp, size_t bucket_elems,
                            size_t persist_below = 0);

}  // namespace zero3d
