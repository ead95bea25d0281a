// ckpt/transfer.h: how a checkpoint's data moves between a rank and the file.
// Contiguous datasets (every file zero3d writes): each rank reads or writes the byte runs of its
// pieces itself, at the dataset's offset in the file, with plain pread/pwrite (ckpt/writer.cpp,
// ckpt/checkpoint.cpp). Any other layout (a file rewritten by another tool, e.g. chunked and
// compressed by h5repack): each rank reads the rectangles of its piece through HDF5, on its own
// (no rank waits on another), through zero3d's POSIX driver (storage/hdf5_posix.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "storage/hdf5.h"
#include "model/gpt.h"  // LogicalRect
#include "zero/shard_view.h"  // CheckpointPiece

namespace zero3d {

// A piece's elements as runs of consecutive elements of its row-major dataset (first element,
// count), in piece order: a block of whole rows is one run, a narrower block one run per row, and
// adjacent runs merge (a piece of a tensor that is not split by columns is one run).
std::vector<std::pair<uint64_t, uint64_t>> element_runs(const CheckpointPiece& p, const std::vector<hsize_t>& dims);

// Reads the `n` float32 elements of the rectangles of dataset ds into buf through HDF5 (for
// datasets that are not contiguous float32: a file rewritten by another tool). Returns the status.
herr_t read_blocks(hid_t ds, const std::vector<LogicalRect>& rects, float* buf, size_t n);

}  // namespace zero3d
