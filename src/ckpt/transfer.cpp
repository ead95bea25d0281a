#include "ckpt/transfer.h"

#include <algorithm>

#include "core/check.h"

namespace zero3d {

namespace {
// Select the union of the blocks in a dataset's space. A 1-D tensor's blocks are columns (c0 0,
// cols 1), so HDF5, reading only the first coordinate of each, selects its rows: its elements.
void select_blocks(hid_t space, const std::vector<LogicalRect>& blocks) {
  if (blocks.empty()) HDF5_CHECK(H5Sselect_none(space));
  bool first = true;
  for (const LogicalRect& q : blocks) {
    hsize_t start[2] = {q.r0, q.c0}, count[2] = {q.rows, q.cols};
    HDF5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count, nullptr));
    first = false;
  }
}
}  // namespace

std::vector<std::pair<uint64_t, uint64_t>> element_runs(const CheckpointPiece& p, const std::vector<hsize_t>& dims) {
  const uint64_t cols = dims.size() > 1 ? dims[1] : 1;
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  auto add = [&](uint64_t first, uint64_t n) {
    if (!runs.empty() && runs.back().first + runs.back().second == first) runs.back().second += n;
    else runs.push_back({first, n});
  };
  for (const LogicalRect& b : p.blocks) {
    if (b.cols == cols) add(b.r0 * cols, b.rows * cols);
    else
      for (size_t r = b.r0; r < b.r0 + b.rows; ++r) add(r * cols + b.c0, b.cols);
  }
  return runs;
}

herr_t read_blocks(hid_t ds, const std::vector<LogicalRect>& rects, float* buf, size_t n) {
  Hid fspace(H5Dget_space(ds));
  if (!fspace.valid() || n == 0) return n == 0 ? 0 : -1;
  select_blocks(fspace.get(), rects);
  const hsize_t mdim = n;
  Hid mspace(H5Screate_simple(1, &mdim, nullptr));
  return H5Dread(ds, H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, buf);
}

}  // namespace zero3d
