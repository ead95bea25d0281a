#include "io/ckpt_transfer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace zero3d {

namespace {
// Select the union of the blocks in a dataset's space. A 1-D tensor's blocks are columns (c0 0,
// cols 1), so HDF5, reading only the first coordinate of each, selects its rows: its elements.
void select_blocks(hid_t space, const std::vector<LogicalBlock>& blocks) {
  if (blocks.empty()) HDF5_CHECK(H5Sselect_none(space));
  bool first = true;
  for (const LogicalBlock& q : blocks) {
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
  for (const LogicalBlock& b : p.blocks) {
    if (b.cols == cols) add(b.r0 * cols, b.rows * cols);
    else
      for (size_t r = b.r0; r < b.r0 + b.rows; ++r) add(r * cols + b.c0, b.cols);
  }
  return runs;
}

std::string read_bytes(int fd, char* dst, size_t n, uint64_t at) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return strerror(errno);
    if (r == 0) return "the file ends early (truncated)";
    dst += r, at += static_cast<uint64_t>(r), n -= static_cast<size_t>(r);
  }
  return "";
}

Hid mpio_file_access(MPI_Comm comm) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  HDF5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
  HDF5_CHECK(H5Pset_all_coll_metadata_ops(fapl.get(), true));
  HDF5_CHECK(H5Pset_coll_metadata_write(fapl.get(), true));
  return fapl;
}

Hid collective_transfer() {
  Hid dxpl(H5Pcreate(H5P_DATASET_XFER));
  HDF5_CHECK(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE));
  return dxpl;
}

herr_t transfer(hid_t ds, hid_t mem_type, const std::vector<LogicalBlock>& rects, void* buf, size_t n, bool write,
                hid_t dxpl, int64_t& independent) {
  Hid fspace(H5Dget_space(ds));
  if (!fspace.valid()) return -1;
  select_blocks(fspace.get(), rects);
  const hsize_t mdim = std::max<size_t>(n, 1);
  Hid mspace(H5Screate_simple(1, &mdim, nullptr));
  if (n == 0) HDF5_CHECK(H5Sselect_none(mspace.get()));
  const herr_t status = write ? H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), dxpl, buf)
                              : H5Dread(ds, mem_type, mspace.get(), fspace.get(), dxpl, buf);
  H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
  if (status >= 0 && H5Pget_mpio_actual_io_mode(dxpl, &mode) >= 0 && mode == H5D_MPIO_NO_COLLECTIVE) ++independent;
  return status;
}

}  // namespace zero3d
