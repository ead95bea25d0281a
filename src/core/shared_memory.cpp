#include "core/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <mutex>

namespace zero3d {

namespace {

struct Allocation {
  size_t bytes;
  int fd;
  uint64_t serial;
};

// Every live allocation, by start address.
std::mutex registry_mu;
std::map<uintptr_t, Allocation>& registry() {
  static std::map<uintptr_t, Allocation> r;
  return r;
}
std::atomic<uint64_t> next_serial{1};

}  // namespace

void* alloc_shared(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const int fd = memfd_create("zero3d-comm", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  // Reserve the pages now: a full memory cgroup fails here, not later with SIGBUS.
  if (posix_fallocate(fd, 0, static_cast<off_t>(rounded)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  registry()[reinterpret_cast<uintptr_t>(p)] = {rounded, fd, next_serial++};
  return p;  // a fresh memfd reads as zeros
}

bool free_shared(void* p) {
  Allocation a{};
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry().find(reinterpret_cast<uintptr_t>(p));
    if (it == registry().end()) return false;
    a = it->second;
    registry().erase(it);
  }
  munmap(p, a.bytes);
  close(a.fd);
  return true;
}

SharedRef find_shared(const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry().upper_bound(at);
  if (it == registry().begin()) return {};
  --it;
  const Allocation& a = it->second;
  const size_t offset = at - it->first;
  if (offset > a.bytes || bytes > a.bytes - offset) return {};
  return {a.fd, a.serial, a.bytes, offset};
}

SharedBytes::SharedBytes(size_t n, bool try_shared) : n_(n) {
  if (try_shared) p_ = static_cast<char*>(alloc_shared(n));
  if (!p_) p_ = static_cast<char*>(std::calloc(std::max<size_t>(n, 1), 1));
  if (!p_) throw std::bad_alloc();
}
SharedBytes::~SharedBytes() {
  if (!free_shared(p_)) std::free(p_);
}
SharedBytes::SharedBytes(SharedBytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
SharedBytes& SharedBytes::operator=(SharedBytes&& o) noexcept {
  if (this != &o) {
    if (!free_shared(p_)) std::free(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

PeerMappings::~PeerMappings() {
  for (auto& [key, m] : maps_) munmap(m.base, m.bytes);
}

const char* PeerMappings::map(pid_t pid, const SharedRef& ref) {
  auto [it, fresh] = maps_.try_emplace({pid, ref.fd}, Mapped{0, nullptr, 0});
  Mapped& m = it->second;
  if (!fresh && m.serial != ref.serial) {  // the fd was freed and reused: a new allocation
    munmap(m.base, m.bytes);
    m = {0, nullptr, 0};
  }
  if (!m.base) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", static_cast<int>(pid), ref.fd);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      maps_.erase(it);
      return nullptr;
    }
    void* base = mmap(nullptr, ref.bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (base == MAP_FAILED) {
      maps_.erase(it);
      errno = err;
      return nullptr;
    }
    m = {ref.serial, base, ref.bytes};
  }
  return static_cast<const char*>(m.base) + ref.offset;
}

}  // namespace zero3d
