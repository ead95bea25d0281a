#include "core/posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/check.h"

namespace zero3d {

namespace {
constexpr int kTries = 4;  // attempts of a read that fails with a transient error

bool transient(int e) { return e == EIO || e == EAGAIN || e == EINTR; }

}  // namespace

std::string pread_fully(int fd, void* dst, size_t n, uint64_t at, bool zeros_past_end) {
  char* p = static_cast<char*>(dst);
  int fails = 0;
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    if (r > 0) {
      p += r, at += static_cast<uint64_t>(r), n -= static_cast<size_t>(r), fails = 0;
      continue;
    }
    if (r == 0) {
      if (!zeros_past_end) return "the file ends early (truncated)";
      std::memset(p, 0, n);
      return "";
    }
    const int e = errno;
    if (e == EINTR) continue;
    if (!transient(e) || ++fails >= kTries) return strerror(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * fails));
  }
  return "";
}

std::string pwrite_fully(int fd, const void* src, size_t n, uint64_t at, int rest_fd) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && rest_fd >= 0) {  // a direct write the file system refuses: the rest buffered
      fd = rest_fd, rest_fd = -1;
      continue;
    }
    if (w < 0) return strerror(errno);
    if (w == 0) return "the system wrote nothing (no error given)";
    p += w, at += static_cast<uint64_t>(w), n -= static_cast<size_t>(w);
    if (n > 0 && rest_fd >= 0) fd = rest_fd, rest_fd = -1;  // a short direct write: the rest is unaligned
  }
  return "";
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string AppendFile::open(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  struct stat st {};
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) return strerror(errno);
  end_ = static_cast<uint64_t>(st.st_size);
  return "";
}

std::string AppendFile::append(const std::string& text) {
  // Where the file ends now (another hand may have cut or grown it since): O_APPEND writes there,
  // and a failed line is cut back to it.
  if (const off_t at = ::lseek(fd_, 0, SEEK_END); at >= 0) end_ = static_cast<uint64_t>(at);
  else return strerror(errno);
  std::string failed = pwrite_fully(fd_, text.data(), text.size(), end_);
  if (failed.empty()) end_ += text.size();
  else if (::ftruncate(fd_, static_cast<off_t>(end_)) != 0)
    failed += strprintf("; cutting back its partial line failed too: %s", strerror(errno));
  return failed;
}

std::string read_text_file(const std::string& path, const std::string& what) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw UserError(strprintf("cannot read %s '%s': %s", what.c_str(), path.c_str(), std::strerror(errno)));
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) throw UserError(strprintf("cannot read %s '%s': %s", what.c_str(), path.c_str(), std::strerror(err)));
  return text;
}

}  // namespace zero3d
