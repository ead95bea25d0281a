// io/ckpt_transfer.h: the collective data movement of a checkpoint, parallel HDF5 over MPI-IO.
// Every rank opens the file together and takes part in every dataset's transfer, with its own
// selection (the rectangles of its piece) or an empty one, so no rank waits on another.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/hdf5.h"
#include "model/gpt.h"  // LogicalBlock

namespace zero3d {

// File access over MPI-IO on `comm`, with collective metadata reads and writes.
Hid mpio_file_access(MPI_Comm comm);
// A dataset transfer property list asking for collective I/O.
Hid collective_transfer();

// One collective transfer of `n` elements between buf and the rectangles of dataset ds (n = 0:
// this rank takes part with an empty selection). Returns the HDF5 status; counts a transfer that
// HDF5 did not do collectively in `independent`.
herr_t transfer(hid_t ds, hid_t mem_type, const std::vector<LogicalBlock>& rects, void* buf, size_t n, bool write,
                hid_t dxpl, int64_t& independent);

}  // namespace zero3d
