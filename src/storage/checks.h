// storage/checks.h: what a run checks about its storage before it trains, and the locks that give the
// run directory and the checkpoint directory one writer each. Plain POSIX, unit-tested without MPI.
//
// A lock is an flock on DIR/.lock, holding "host pid start-time". The kernel drops it when the
// process dies however it dies, so a lock file whose flock is free belongs to a dead run: it is
// taken over (with a warning naming the old holder). Where the file system has no flock (some
// Lustre mounts without -o flock), the run goes on with a warning: it cannot be guarded.
#pragma once
#include <cstdint>
#include <string>

namespace zero3d {

class DirLock {
 public:
  // what: the directory in the user's words ("run directory", "checkpoint directory
  // (checkpoint.dir)"); instead: what to do about a holder ("another --run-dir"). Throws
  // UserError naming the holder when another live run holds it. `warning` gets a line to print
  // when a dead run's lock was taken over or locking is unsupported ("" otherwise).
  DirLock(const std::string& dir, const std::string& what, const std::string& instead, std::string& warning);
  ~DirLock();  // removes the lock file: nothing is left behind
  // The lock file is still this lock's, at its path (false once the directory was removed).
  bool still_held() const;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

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
