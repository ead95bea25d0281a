// core/posix_io.h: reads and writes of whole byte ranges, as POSIX leaves them to the caller:
// short counts completed (a signal, a pipe, a network or FUSE file system, libfiu's "reduce"
// points in the fault tests), EINTR retried, and a read that fails with a transient error
// (EIO, EAGAIN) retried a few times with a short back-off before it is reported. Every file
// zero3d reads or writes outside HDF5 and the swap files goes through these.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zero3d {

// Each returns "" or what failed (strerror, or why the count fell short).
// n bytes at `at` of fd: short reads completed, EINTR and transient errors (EIO, EAGAIN) retried
// with a short back-off; the end of the file is "truncated", or zeros with zeros_past_end.
std::string pread_fully(int fd, void* dst, size_t n, uint64_t at, bool zeros_past_end = false);
// n bytes to `at` of fd, short writes completed. rest_fd >= 0: after a short write the rest goes
// there (a short write on an O_DIRECT descriptor leaves the rest unaligned for it), and so does a
// write fd refuses with EINVAL (a direct write of a size or offset the file system will not take).
std::string pwrite_fully(int fd, const void* src, size_t n, uint64_t at, int rest_fd = -1);

// A text file that lines are appended to (metrics.jsonl, csv_monitor's files; O_APPEND, at its end
// as it is at each append): each append lands whole or not at all, so a failed one (disk full, an
// I/O error) leaves no partial line that a resumed run would refuse to read back.
class AppendFile {
 public:
  AppendFile() = default;
  ~AppendFile();
  AppendFile(AppendFile&& o) noexcept : fd_(o.fd_), end_(o.end_) { o.fd_ = -1; }
  AppendFile& operator=(AppendFile&&) = delete;
  AppendFile(const AppendFile&) = delete;
  // "" or what failed (strerror): `path` opened for appending, created where it is not.
  std::string open(const std::string& path);
  uint64_t size() const { return end_; }  // after the last append (or at open)
  // "" or what failed; on failure the file is cut back to where it ended before.
  std::string append(const std::string& text);

 private:
  int fd_ = -1;
  uint64_t end_ = 0;
};

// The whole of a (small) file, read as a stream (a FIFO too); a UserError "cannot read WHAT 'PATH':
// <strerror>" when it cannot be opened or read (a directory: "Is a directory").
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace zero3d
