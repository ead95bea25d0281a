// io/ckpt_transfer.h: how a checkpoint's data moves between a rank and the file.
// Contiguous datasets (every file zero3d writes): each rank reads or writes the byte runs of its
// pieces itself, at the dataset's offset in the file, with plain pread/pwrite (io/ckpt_writer.cpp,
// io/checkpoint.cpp). Any other layout (a file rewritten by another tool): parallel HDF5 over
// MPI-IO, every rank taking part in every dataset's transfer with its own selection (the
// rectangles of its piece) or an empty one, so no rank waits on another.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "io/hdf5.h"
#include <string>
#include <utility>

#include "model/gpt.h"  // LogicalBlock
#include "zero/shard_view.h"  // CheckpointPiece

namespace zero3d {

// File access over MPI-IO on `comm`, with collective metadata reads and writes.
Hid mpio_file_access(MPI_Comm comm);
// A dataset transfer property list asking for collective I/O.
Hid collective_transfer();

// A piece's elements as runs of consecutive elements of its row-major dataset (first element,
// count), in piece order: a block of whole rows is one run, a narrower block one run per row, and
// adjacent runs merge (a piece of a tensor that is not split by columns is one run).
std::vector<std::pair<uint64_t, uint64_t>> element_runs(const CheckpointPiece& p, const std::vector<hsize_t>& dims);

// Reads n bytes at `at` of fd (pread, retried when short); "" or what failed.
std::string read_bytes(int fd, char* dst, size_t n, uint64_t at);

// One collective transfer of `n` elements between buf and the rectangles of dataset ds (n = 0:
// this rank takes part with an empty selection). Returns the HDF5 status; counts a transfer that
// HDF5 did not do collectively in `independent`.
herr_t transfer(hid_t ds, hid_t mem_type, const std::vector<LogicalBlock>& rects, void* buf, size_t n, bool write,
                hid_t dxpl, int64_t& independent);

}  // namespace zero3d
