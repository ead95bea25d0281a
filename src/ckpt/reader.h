// ckpt/reader.h: a checkpoint load, the mirror of ckpt/writer.h's save, in three phases:
//   open     every rank reads the file's metadata itself (through zero3d's POSIX driver) and
//            checks it against this run's model: the header, every dataset's shape, type and
//            checksum attribute, and where its data lies; the ranks agree before any reads data;
//   read     every rank reads its load pieces (zero/shard_view.h) of every dataset, by offset when
//            the data is contiguous little-endian float32 (every file zero3d writes), else through
//            HDF5's selections, and hands them to the engine;
//   verify   the per-dataset checksums summed over the world against the stored ones.
// A failure is named with the file and the dataset, and classed as the file's (UserError: corrupt,
// truncated, another model) or the storage's (io_failed(): an I/O error after retries).
#pragma once
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "storage/hdf5.h"

namespace zero3d {

class CheckpointReader {
 public:
  // Collective over the world; timeout_s 0: 3x the file's bytes at 100 MB/s, at least comm_timeout_s.
  CheckpointReader(const CheckpointRun& run, std::string path, double timeout_s);
  // The three phases under the watchdog; the engine holds the state when it returns.
  LoadedCheckpoint load();
  bool io_failed() const { return io_failed_; }

 private:
  void open();
  void read_metadata();
  void read();
  void verify();

  const CheckpointRun run_;
  const std::string path_;
  double timeout_s_;
  bool io_failed_ = false;  // this rank's failure is the storage's, not the file's
  LoadedCheckpoint out_;
  std::vector<DatasetSpec> specs_;
  std::vector<Hid> datasets_;
  std::vector<uint64_t> stored_, sums_;  // checksums: the file's, and what this rank's data adds
  std::vector<uint64_t> offsets_;        // where a dataset's contiguous data starts (kNoOffset: read by HDF5)
  Hid file_;
};

// Collective over the world. mode: none (nothing), latest (checkpoint.load "auto": DIR/latest if
// there is any checkpoint in DIR; when it fails verification, warns and falls back to the newest
// older one that loads), or path (a checkpoint file, or a directory meaning its latest; no fallback). Throws
// UserError naming the file and the dataset (corrupt, truncated, checksum mismatch, missing tensor,
// other model shape) on every rank alike; RunError(kExitReadFailed) when a read failed (an I/O
// error after retries: not a verdict on the file, so no older one is tried). A load still running after timeout_s (0: 3x the file's
// bytes at 100 MB/s, at least comm_timeout_s) is the watchdog's (exit 3).
std::optional<LoadedCheckpoint> load_checkpoint(const CheckpointRun& run, LoadMode mode, const std::string& path,
                                                const std::string& dir, double timeout_s = 0);

}  // namespace zero3d
