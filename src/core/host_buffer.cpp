#include "core/host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace zero3d {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

HostBuffer::HostBuffer(size_t bytes) : n_(bytes) {
  if (!bytes) return;
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  p_ = static_cast<char*>(std::aligned_alloc(kHugePage, rounded));
  if (!p_) throw std::bad_alloc();
  madvise(p_, rounded, MADV_HUGEPAGE);  // advice: ignored where THP is off
  std::memset(p_, 0, rounded);
}

HostBuffer::~HostBuffer() { std::free(p_); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    std::free(p_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

}  // namespace zero3d
