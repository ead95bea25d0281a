#include "storage/checks.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "core/check.h"
#include "core/posix_io.h"

namespace zero3d {

namespace {
std::string read_all(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  off_t at = 0;
  while ((n = pread(fd, buf, sizeof buf, at)) > 0) out.append(buf, static_cast<size_t>(n)), at += n;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& what, const std::string& instead, std::string& warning)
    : path_(dir + "/.lock") {
  warning.clear();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw UserError(strprintf("cannot create the lock '%s' of the %s: %s", path_.c_str(), what.c_str(), strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = read_all(fd_);
      ::close(fd_);
      fd_ = -1;
      throw UserError(strprintf("%s '%s' is in use by another zero3d run (%s; lock file %s): wait for it to end, or "
                                "give this run %s",
                                what.c_str(), dir.c_str(), holder.empty() ? "holder unknown" : holder.c_str(),
                                path_.c_str(), instead.c_str()));
    }
    warning = strprintf("the file system of '%s' does not support locks (%s): a second run on this %s cannot be "
                        "detected",
                        dir.c_str(), strerror(err), what.c_str());
  }
  const std::string old = read_all(fd_);
  if (!old.empty() && warning.empty())
    warning = strprintf("%s '%s' was locked by a run that is gone (%s); taking it over", what.c_str(), dir.c_str(),
                        old.c_str());
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  const std::string me = strprintf("host %s pid %d since %s\n", host_name().c_str(), static_cast<int>(getpid()), when);
  std::string e = ::ftruncate(fd_, 0) != 0 ? strerror(errno) : pwrite_fully(fd_, me.data(), me.size(), 0);
  if (!e.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw UserError(strprintf("cannot write the lock '%s' of the %s: %s", path_.c_str(), what.c_str(), e.c_str()));
  }
}

bool DirLock::still_held() const {
  if (fd_ < 0) return true;  // nothing was locked (a file system without flock)
  struct stat mine {}, there {};
  return ::fstat(fd_, &mine) == 0 && mine.st_nlink > 0 && ::stat(path_.c_str(), &there) == 0 &&
         there.st_ino == mine.st_ino && there.st_dev == mine.st_dev;
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the unlock: no other run can see a lock file of ours unlocked
  ::close(fd_);
}

std::string probe_writable(const std::string& dir, int rank) {
  const std::string path = strprintf("%s/.probe.%s.%d.%d", dir.c_str(), host_name().c_str(), rank,
                                     static_cast<int>(getpid()));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return strprintf("cannot create a file in '%s': %s", dir.c_str(), strerror(errno));
  char block[4096];
  std::memset(block, 'z', sizeof block);
  std::string error;
  if (const std::string e = pwrite_fully(fd, block, sizeof block, 0); !e.empty())
    error = strprintf("cannot write to '%s': %s", path.c_str(), e.c_str());
  else if (::fsync(fd) != 0)
    error = strprintf("cannot fsync '%s': %s", path.c_str(), strerror(errno));
  ::close(fd);
  if (::unlink(path.c_str()) != 0 && error.empty())
    error = strprintf("cannot remove '%s': %s", path.c_str(), strerror(errno));
  return error;
}

int64_t free_bytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

uint64_t checkpoint_space_needed(uint64_t file_bytes, int64_t saves, int keep_last, int64_t existing) {
  if (saves <= 0) return 0;
  int64_t files = saves;  // keep_last 0: every save stays
  if (keep_last > 0) files = std::min<int64_t>(saves, std::max<int64_t>(existing, keep_last) + 1 - existing);
  return static_cast<uint64_t>(std::max<int64_t>(files, 1)) * file_bytes;
}

}  // namespace zero3d
