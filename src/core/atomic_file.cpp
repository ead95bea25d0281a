#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace zero3d {

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), what_(std::move(what)) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail("create");
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::fail(const char* action) const {
  throw UserError(strprintf("cannot %s %s '%s': %s", action, what_.c_str(), tmp_.c_str(), std::strerror(errno)));
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, f_) != bytes) fail("write");
}

void AtomicFile::seek(long offset) {
  if (std::fseek(f_, offset, SEEK_SET) != 0) fail("write");
}

void AtomicFile::commit(bool durable) {
  if (std::fflush(f_) != 0 || (durable && ::fsync(fileno(f_)) != 0)) fail("write");
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) fail("write");
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw UserError(strprintf("cannot rename '%s' to '%s': %s", tmp_.c_str(), path_.c_str(), std::strerror(errno)));
  committed_ = true;
  if (!durable) return;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  sync_path(parent.empty() ? std::string(".") : parent.string());
}

void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!synced) throw UserError(strprintf("cannot sync '%s': %s", path.c_str(), std::strerror(err)));
}

void write_file_atomic(const std::string& path, const std::string& text, bool durable, const std::string& what) {
  AtomicFile f(path, what);
  f.write(text);
  f.commit(durable);
}

}  // namespace zero3d
