// storage/hdf5_posix.h: HDF5's file I/O through zero3d's own POSIX calls (a virtual file driver), so
// every storage failure is named by the system's own words and never leaves HDF5 half-closed.
//
// HDF5's sec2 and MPI-IO drivers turn a failed pwrite/pread into "HDF5 error" (or an MPI error
// class), and a failed metadata write inside H5Fclose leaves the file open in HDF5: the library
// then loops at exit and crashes in MPI_Finalize. This driver:
//   - completes short reads and writes (POSIX allows them), retries EINTR, and retries a read
//     that fails with EIO/EAGAIN a few times before giving up (a transient error is not corruption);
//   - on a write, truncate or close failure records the first error ("writing 'F': No space left
//     on device") and reports success to HDF5, skipping the writes after it: HDF5 always closes
//     cleanly, and the caller asks io_error() after H5Fclose whether the file is good;
//   - on a read failure records it too and fails the read (reads change no state in HDF5), so a
//     caller can tell "the disk failed" (io_error() not empty) from "the bytes are wrong".
// Invariant: the error register is per thread (each thread opens, uses and closes its own files);
// clear it before opening a file, read it after closing.
#pragma once
#include <string>

#include "storage/hdf5.h"

namespace zero3d {

// A file access property list that selects this driver.
Hid posix_file_access();
// The first I/O error on this thread since clear_io_error() ("" = none): the call, the file and
// strerror, e.g. "writing '/ck/step_00000010.h5.tmp': No space left on device".
std::string io_error();
void clear_io_error();

}  // namespace zero3d
