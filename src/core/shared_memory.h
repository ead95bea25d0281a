// core/shared_memory.h: host buffers that the other processes of the node can map, so a
// collective reads a peer's buffer where it lies: one copy where a private buffer needs two
// (publish into a shared segment, then read out), as NCCL's registered buffers do.
//
// Each allocation is its own memfd, mapped shared; it has no name, so nothing is left behind
// however the process ends. A peer maps it through /proc/<pid>/fd/<fd> (same user; where that
// is forbidden the collectives detect it at start and keep their two-copy path). An allocation
// is known by (fd, serial): fd numbers are reused after a free, serials never.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

namespace zero3d {

// Where a range of shared memory lies: allocation (fd, serial) of `bytes`, at `offset` in it.
struct SharedRef {
  int fd = -1;
  uint64_t serial = 0;  // 0: not shared memory
  size_t bytes = 0, offset = 0;
};

// Zeroed, 64-byte aligned; nullptr where the system cannot make one (the caller falls back).
void* alloc_shared(size_t bytes);
// False when p is not from alloc_shared (then nothing is done).
bool free_shared(void* p);
// The allocation holding all of [p, p + bytes), or a ref with serial 0.
SharedRef find_shared(const void* p, size_t bytes);

// A zeroed byte buffer in shared memory, or in private memory where the system cannot make one
// or `try_shared` is false (shared() says which). Move-only.
class SharedBytes {
 public:
  SharedBytes() = default;
  explicit SharedBytes(size_t n, bool try_shared = true);
  ~SharedBytes();
  SharedBytes(SharedBytes&& o) noexcept;
  SharedBytes& operator=(SharedBytes&& o) noexcept;
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;
  char* data() { return p_; }
  size_t size() const { return n_; }
  bool shared() const { return find_shared(p_, n_).serial != 0; }

 private:
  char* p_ = nullptr;
  size_t n_ = 0;
};

// Another process's allocations, mapped read-only on first use and kept until the owner's fd
// number comes back with a new serial (the old one was freed) or this object dies.
class PeerMappings {
 public:
  PeerMappings() = default;
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;
  // Start of ref's range in process pid's memory; nullptr (errno set) when it cannot be mapped.
  const char* map(pid_t pid, const SharedRef& ref);

 private:
  struct Mapped {
    uint64_t serial;
    void* base;
    size_t bytes;
  };
  std::map<std::pair<pid_t, int>, Mapped> maps_;  // by (pid, fd)
};

}  // namespace zero3d
