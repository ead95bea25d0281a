#include "zero/shard_view.h"

#include <algorithm>

#include "core/check.h"

namespace zero3d {

namespace {
// The part of tensor t inside the flat range [lo, hi), as a piece (size 0 when none).
Piece piece_within(const FlatLayout& L, int t, size_t lo, size_t hi) {
  const ParamInfo& info = L.tensors[t];
  const size_t s = std::max(lo, info.offset), e = std::min(hi, info.offset + info.size);
  return s < e ? Piece{t, s - info.offset, e - s} : Piece{t, 0, 0};
}

// The logical runs of local elements [begin, begin + n) of p, at offsets from `base` (a piece's begin).
void add_runs(const ParamInfo& p, size_t base, size_t begin, size_t n, std::vector<LogicalRun>& out) {
  for (size_t i = 0; i < n;) {
    const size_t run = std::min(logical_run(p, begin + i), n - i);
    out.push_back({begin + i - base, logical_index(p, begin + i), run});
    i += run;
  }
}

CheckpointPiece checkpoint_piece(const ParamInfo& info, const Piece& p) {
  return {info.id, p, logical_rects(info, p.begin, p.size), {}};
}
}  // namespace

ShardView::ShardView(const FlatLayout& layout, int stage, int dp_rank)
    : layout_(layout), stage_(stage), rank_(dp_rank), bucket_of_tensor_(layout.tensors.size()) {
  for (size_t i = 0; i < layout_.buckets.size(); ++i) {
    const Bucket& b = layout_.buckets[i];
    const ShardInfo sl = layout_.slice(b, rank_);
    for (int t = b.first_tensor; t < b.first_tensor + b.num_tensors; ++t) {
      bucket_of_tensor_[t] = static_cast<int>(i);
      if (Piece p = piece_within(layout_, t, owned_offset(b), owned_offset(b) + owned_size(b)); p.size)
        owned_.push_back(p);
      const ParamInfo& info = layout_.tensors[t];
      if (info.tied_copy || (info.split == TpSplit::none && info.tp_rank != 0)) continue;
      if (Piece p = piece_within(layout_, t, b.offset + sl.offset, b.offset + sl.offset + sl.size); p.size)
        saved_.push_back(p);
    }
  }
  for (const Piece& p : saved_) {
    const ParamInfo& info = layout_.tensors[p.tensor];
    save_.push_back(checkpoint_piece(info, p));
    add_runs(info, p.begin, p.begin, p.size, save_.back().counted);
  }
  for (const Piece& p : owned_) {
    const ParamInfo& info = layout_.tensors[p.tensor];
    load_.push_back(checkpoint_piece(info, p));
    for (const Piece& s : saved_)
      if (s.tensor == p.tensor) add_runs(info, p.begin, s.begin, s.size, load_.back().counted);
  }
}

size_t ShardView::owned_offset(const Bucket& b) const {
  return stage_ == 0 ? b.offset : b.offset + layout_.slice(b, rank_).offset;
}

size_t ShardView::offset_in_owned(const Piece& p) const {
  const Bucket& b = bucket_of(p.tensor);
  const size_t flat = layout_.tensors[p.tensor].offset + p.begin;
  Z3D_ASSERT(flat >= owned_offset(b) && flat + p.size <= owned_offset(b) + owned_size(b),
             "checkpoint piece outside this rank's owned range");
  return flat - owned_offset(b);
}

}  // namespace zero3d
