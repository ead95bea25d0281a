#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {

// What a stat mode is, for "exists and is not a regular file".
const char* kind_of(mode_t m) {
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a directory";
  return "not a regular file";
}

}  // namespace

std::string output_file_path(const std::string& path, const std::string& what) {
  std::string target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {  // replace the file it names, keep the link
    std::error_code ec;
    const fs::path to = fs::read_symlink(path, ec);
    if (!ec) target = (to.is_absolute() ? to : fs::path(path).parent_path() / to).string();
  }
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw UserError(strprintf("the output %s '%s' exists and is %s: zero3d replaces only regular files; give another "
                              "path", what.c_str(), path.c_str(), kind_of(st.st_mode)));
  return target;
}

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(output_file_path(path, what)), tmp_(path_ + ".tmp"), what_(std::move(what)) {
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
  const fs::path parent = fs::path(path_).parent_path();
  sync_path(parent.empty() ? std::string(".") : parent.string());
}

AtomicDir::AtomicDir(std::string path, std::string what, std::vector<std::string> names)
    : path_(std::move(path)), what_(std::move(what)), names_(std::move(names)) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  tmp_ = path_ + ".tmp";
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw UserError(strprintf("the output %s '%s' exists and is %s, not a directory: give another path",
                                what_.c_str(), path_.c_str(), kind_of(st.st_mode)));
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(path_, ec))
      if (std::find(names_.begin(), names_.end(), e.path().filename().string()) == names_.end())
        throw UserError(strprintf("the output %s '%s' holds '%s', which zero3d does not write there: it replaces only "
                                  "a directory of its own files; give a new or empty directory",
                                  what_.c_str(), path_.c_str(), e.path().filename().c_str()));
    if (ec) throw UserError(strprintf("cannot list the output %s '%s': %s", what_.c_str(), path_.c_str(), ec.message().c_str()));
  }
  std::error_code ec;
  fs::remove_all(tmp_, ec);  // a crashed earlier export's
  if (!fs::create_directory(tmp_, ec))
    throw UserError(strprintf("cannot create '%s' for the %s: %s", tmp_.c_str(), what_.c_str(),
                              ec ? ec.message().c_str() : "it exists"));
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

std::string AtomicDir::file(const std::string& name) const {
  Z3D_ASSERT(std::find(names_.begin(), names_.end(), name) != names_.end(), "AtomicDir: a file it was not given");
  return tmp_ + "/" + name;
}

void AtomicDir::commit() {
  // One rename publishes the new directory: an exchange with the old one where there is one (the
  // old then sits at DIR.tmp and is removed), a plain rename where there is none. A file system
  // without RENAME_EXCHANGE gets two renames: the old aside, the new in place.
  std::error_code ec;
  const bool existed = fs::exists(path_, ec);
  int rc = existed ? ::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE)
                   : std::rename(tmp_.c_str(), path_.c_str());
  std::string aside = tmp_;
  if (rc != 0 && existed && (errno == EINVAL || errno == ENOSYS)) {
    aside = path_ + ".old";
    fs::remove_all(aside, ec);
    rc = std::rename(path_.c_str(), aside.c_str());
    if (rc == 0 && (rc = std::rename(tmp_.c_str(), path_.c_str())) != 0) {
      const int err = errno;
      std::rename(aside.c_str(), path_.c_str());  // put the old one back
      errno = err;
    }
  }
  if (rc != 0)
    throw UserError(strprintf("cannot move the %s '%s' into place: %s", what_.c_str(), tmp_.c_str(), std::strerror(errno)));
  committed_ = true;
  if (existed) fs::remove_all(aside, ec);
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
