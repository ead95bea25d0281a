#include "storage/swap_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/clock.h"
#include "core/hash.h"
#include "storage/checks.h"

namespace zero3d {

namespace {
constexpr size_t kPage = 4096;
constexpr int kTries = 4;  // attempts of a block that makes no progress before it fails

bool aligned(uint64_t x) { return x % kPage == 0; }
}  // namespace

uint64_t swap_checksum(const void* data, size_t bytes) {
  const auto* w = static_cast<const uint64_t*>(data);
  const size_t n = bytes / 8;
  constexpr uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t h[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) {
      uint64_t x;
      std::memcpy(&x, w + i + l, 8);
      h[l] = (h[l] ^ x) * k;
    }
  for (; i < n; ++i) h[0] = (h[0] ^ w[i]) * k;
  uint64_t out = bytes;
  for (uint64_t x : h) out = (out ^ (x ^ (x >> 29))) * k;
  return out;
}

std::string swap_dir(const std::string& nvme_path, const std::string& run_dir) {
  std::error_code ec;
  std::string where = std::filesystem::weakly_canonical(run_dir, ec).string();
  if (ec) where = run_dir;
  const uint64_t h = fnv1a(where.data(), where.size());
  return strprintf("%s/zero3d-%08llx", nvme_path.c_str(), static_cast<unsigned long long>(h & 0xffffffffull));
}

int remove_dead_swap_files(const std::string& nvme_path, uint64_t* bytes) {
  namespace fs = std::filesystem;
  int removed = 0;
  *bytes = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(nvme_path, ec)) {
    if (d.path().filename().string().rfind("zero3d-", 0) != 0 || !d.is_directory(ec)) continue;
    for (const auto& e : fs::directory_iterator(d.path(), ec)) {
      const int fd = ::open(e.path().c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;  // not ours to judge
      struct stat st {};
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &st) == 0 && ::unlink(e.path().c_str()) == 0) {
        ++removed;
        *bytes += static_cast<uint64_t>(st.st_size);
      }
      ::close(fd);
    }
    ::rmdir(d.path().c_str());  // only when empty
  }
  return removed;
}

SwapFile::SwapFile(std::string path, uint64_t bytes, Options options)
    : path_(std::move(path)), bytes_(bytes), opt_(options) {
  opt_.block_size = std::max<size_t>(kPage, opt_.block_size / kPage * kPage);
  opt_.threads = std::max(1, opt_.threads);
  if (opt_.sizing) return;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) throw IoError(strprintf("cannot create swap file '%s': %s", path_.c_str(), strerror(errno)));
  ::flock(fd_, LOCK_EX | LOCK_NB);  // held while this process lives (a file system without locks: never cleaned)
  if (bytes_ > 0) {
    const int err = posix_fallocate(fd_, 0, static_cast<off_t>(bytes_));
    if (err != 0) {
      ::close(fd_);
      remove_file();
      // Asked of nvme_path itself: the run directory may be gone already (the last file out removes it).
      const int64_t free = free_bytes(std::filesystem::path(path_).parent_path().parent_path().string());
      throw IoError(strprintf("cannot reserve %.1f MB for swap file '%s': %s (%.1f MB free there)", double(bytes_) / 1e6,
                              path_.c_str(), strerror(err), double(free) / 1e6));
    }
  }
  fd_direct_ = ::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);  // -1 where O_DIRECT is unsupported
  for (int i = 0; i < opt_.threads; ++i) threads_.emplace_back([this] { worker(); });
}

SwapFile::~SwapFile() {
  {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [this] { return blocks_left_ == 0; });  // finished, waited for or not
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (opt_.sizing) return;
  if (fd_direct_ >= 0) ::close(fd_direct_);
  remove_file();
  if (fd_ >= 0) ::close(fd_);
}

void SwapFile::remove_file() const {
  ::unlink(path_.c_str());
  ::rmdir(std::filesystem::path(path_).parent_path().c_str());  // the last one out removes the directory
}

SwapFile::Ticket SwapFile::read(uint64_t offset, void* buf, size_t n) {
  return submit(false, offset, static_cast<char*>(buf), n);
}

SwapFile::Ticket SwapFile::write(uint64_t offset, const void* buf, size_t n) {
  return submit(true, offset, static_cast<char*>(const_cast<void*>(buf)), n);
}

SwapFile::Ticket SwapFile::submit(bool write, uint64_t offset, char* buf, size_t n) {
  Z3D_ASSERT(offset + n <= bytes_, strprintf("swap file '%s': transfer of %zu bytes at %llu beyond its %llu bytes",
                                             path_.c_str(), n, static_cast<unsigned long long>(offset),
                                             static_cast<unsigned long long>(bytes_)));
  std::lock_guard lk(mu_);
  const Ticket t = next_++;
  if (opt_.sizing) (write ? stats_.bytes_written : stats_.bytes_read) += n;
  if (n == 0 || opt_.sizing) return t;
  Pending& p = pending_[t];
  for (size_t at = 0; at < n; at += opt_.block_size) {
    queue_.push_back({t, write, offset + at, buf + at, std::min(opt_.block_size, n - at)});
    ++p.blocks;
    ++blocks_left_;
  }
  work_cv_.notify_all();
  return t;
}

void SwapFile::wait(Ticket t) {
  std::unique_lock lk(mu_);
  auto it = pending_.find(t);
  if (it == pending_.end()) return;  // done (or empty) already
  const auto t0 = Clock::now();
  done_cv_.wait(lk, [&] { return it->second.blocks == 0; });
  stats_.wait_s += seconds_since(t0);
  const std::string error = it->second.error;
  pending_.erase(it);
  if (!error.empty()) throw IoError(error);
}

void SwapFile::wait_all() {
  std::vector<Ticket> all;
  {
    std::lock_guard lk(mu_);
    for (auto& [t, p] : pending_) all.push_back(t);
  }
  for (Ticket t : all) wait(t);
}

SwapFile::Stats SwapFile::take_stats() {
  std::lock_guard lk(mu_);
  return std::exchange(stats_, Stats{});
}

void SwapFile::worker() {
  for (;;) {
    Block b;
    {
      std::unique_lock lk(mu_);
      work_cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      b = queue_.front();
      queue_.pop_front();
    }
    const auto t0 = Clock::now();
    const std::string error = transfer(b);
    const double s = seconds_since(t0);
    std::lock_guard lk(mu_);
    (b.write ? stats_.write_s : stats_.read_s) += s;
    (b.write ? stats_.bytes_written : stats_.bytes_read) += error.empty() ? b.n : 0;
    Pending& p = pending_[b.ticket];
    if (p.error.empty()) p.error = error;
    --blocks_left_;
    if (--p.blocks == 0 || blocks_left_ == 0) done_cv_.notify_all();
  }
}

std::string SwapFile::transfer(const Block& b) {
  const bool direct = fd_direct_ >= 0 && aligned(b.offset) && aligned(b.n) &&
                      aligned(reinterpret_cast<uintptr_t>(b.buf));
  const int fd = direct ? fd_direct_ : fd_;
  size_t done = 0;
  int fails = 0;
  while (done < b.n) {
    const off_t at = static_cast<off_t>(b.offset + done);
    const ssize_t r = b.write ? ::pwrite(fd, b.buf + done, b.n - done, at) : ::pread(fd, b.buf + done, b.n - done, at);
    if (r > 0) {  // a short transfer goes on where it stopped
      done += static_cast<size_t>(r);
      fails = 0;
      continue;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    const std::string why = r == 0 ? "end of file (was it truncated?)" : strerror(errno);
    if (++fails >= kTries)
      return strprintf("swap file '%s': %s of %zu bytes at offset %llu failed after %d tries: %s", path_.c_str(),
                       b.write ? "write" : "read", b.n - done, static_cast<unsigned long long>(at), kTries,
                       why.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * fails));
  }
  return "";
}

}  // namespace zero3d
