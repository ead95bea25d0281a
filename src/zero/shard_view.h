// zero/shard_view.h: what one data-parallel rank owns and saves of a flat layout, per ZeRO stage.
// Pure arithmetic on a FlatLayout (no buffers, no MPI), so it is unit-tested alone.
//
// Owned: the part of every bucket whose optimizer state (fp32 master, Adam m and v) this rank
// keeps and updates: the whole bucket at stage 0, its dp slice (FlatLayout::slice) from stage 1.
// Saved: the part a checkpoint writes: the dp slice of every bucket (whatever the stage), without
// the tensor-parallel replicas off tp rank 0 and without the last stage's copy of the tied
// embedding, so the ranks of the grid write every logical element exactly once. The gradient norm
// counts the same elements.
//
// Checkpoint pieces: the same pieces as a checkpoint moves them (ckpt/ iterates them and asks
// nothing else about the layout): each with its place in the logical tensor and the runs this
// rank counts in the dataset's checksum.
//
// Invariant: every saved piece lies inside an owned piece, and the owned pieces of the dp group
// tile each tensor once per rank at stage 0 and exactly once over the group from stage 1 on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/flat_layout.h"
#include "model/gpt.h"  // LogicalRect

namespace zero3d {

// Local elements [begin, begin + size) of layout.tensors[tensor].
struct Piece {
  int tensor = 0;
  size_t begin = 0, size = 0;
};

// n elements at `offset` in a piece whose logical indices are first, first + 1, ...
struct LogicalRun {
  size_t offset = 0;
  uint64_t first = 0;
  size_t n = 0;
};

// One logical tensor's part on this rank, as a checkpoint moves it.
struct CheckpointPiece {
  int tensor = 0;                    // logical id: the index in the whole model's table (ParamInfo::id)
  Piece piece;                       // the local elements
  std::vector<LogicalRect> blocks;  // their place in the logical tensor (the file selection)
  std::vector<LogicalRun> counted;   // what this rank adds to the dataset's checksum
};

class ShardView {
 public:
  ShardView(const FlatLayout& layout, int stage, int dp_rank);

  // Bucket b's owned range: its flat offset and size, and where it starts in the rank's
  // optimizer state (the flat offset at stage 0, the shard offset from stage 1).
  size_t owned_offset(const Bucket& b) const;
  size_t owned_size(const Bucket& b) const { return stage_ == 0 ? b.size : b.size / layout_.dp; }
  size_t state_base(const Bucket& b) const { return stage_ == 0 ? b.offset : b.shard_offset; }

  const std::vector<Piece>& owned_pieces() const { return owned_; }
  const std::vector<Piece>& saved_pieces() const { return saved_; }
  // What a save writes: the saved pieces, counted whole. What a load reads: the owned pieces,
  // counted over their saved part, so the grid counts every element once whatever the layout.
  // At most one per logical tensor, in flat order.
  const std::vector<CheckpointPiece>& save_pieces() const { return save_; }
  const std::vector<CheckpointPiece>& load_pieces() const { return load_; }

  // The bucket holding tensor t.
  const Bucket& bucket_of(int t) const { return layout_.buckets[bucket_of_tensor_[t]]; }
  // A piece's offset from the start of its bucket's owned range; asserts the piece lies inside it.
  size_t offset_in_owned(const Piece& p) const;

 private:
  const FlatLayout& layout_;
  int stage_, rank_;
  std::vector<int> bucket_of_tensor_;
  std::vector<Piece> owned_, saved_;
  std::vector<CheckpointPiece> save_, load_;
};

}  // namespace zero3d
