// io/storage.h: what a run checks about its storage before it trains, and the run directory's
// lock. Plain POSIX, unit-tested without MPI.
//
// The lock is an flock on RUN_DIR/.lock, holding "host pid start-time". The kernel drops it when
// the process dies however it dies, so a lock file whose flock is free belongs to a dead run: it is
// taken over (with a warning naming the old holder). Where the file system has no flock (some
// Lustre mounts without -o flock), the run goes on with a warning: it cannot be guarded.
#pragma once
#include <cstdint>
#include <string>

namespace zero3d {

class RunDirLock {
 public:
  // Throws UserError naming the holder when another live run holds it. `warning` gets a line to
  // print when a dead run's lock was taken over or locking is unsupported ("" otherwise).
  RunDirLock(const std::string& run_dir, std::string& warning);
  ~RunDirLock();  // removes the lock file: nothing is left behind
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Writes, fsyncs and removes a small probe file in dir; "" or what failed (errno text, file).
std::string probe_writable(const std::string& dir, int rank);
// Bytes free to this user in the file system holding dir (statvfs f_bavail); -1 if unknown.
int64_t free_bytes(const std::string& dir);

// The checkpoint space a run needs beyond what its directory holds now: with keep_last > 0 the
// directory peaks at max(existing, keep_last) committed files plus one being written; with 0 every
// save stays. saves: how many this run will write. Returns bytes.
uint64_t checkpoint_space_needed(uint64_t file_bytes, int64_t saves, int keep_last, int64_t existing);

}  // namespace zero3d
