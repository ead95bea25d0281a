// core/mem.h: where a buffer lives, carried with its pointer (ggml's buffer types, is_host).
//
// A collective on device memory either hands the pointer to a library that reads device memory
// (NCCL, a CUDA-aware MPI) or stages it through page-locked host buffers; only the kind travelling
// with the pointer lets the comm seam choose. The host backend's memory is host memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

namespace zero3d {

class DeviceCollectives;  // core/device_collectives.h

enum class MemKind : uint8_t { host, device };

// A pointer and the kind of memory it points into.
template <typename T>
struct MemRef {
  T* ptr = nullptr;
  MemKind kind = MemKind::host;

  MemRef() = default;
  MemRef(T* p, MemKind k) : ptr(p), kind(k) {}
  // As T* converts to const T* and to void*.
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
  MemRef(MemRef<U> o) : ptr(o.ptr), kind(o.kind) {}  // NOLINT(google-explicit-constructor)

  MemRef operator+(size_t i) const { return {ptr + i, kind}; }
  bool on_device() const { return kind == MemKind::device; }
};

template <typename T>
MemRef<T> host_mem(T* p) {
  return {p, MemKind::host};
}

// Copies between device memory and host memory, and the page-locked host buffers such copies
// are fastest from: what a comm implementation needs to stage device buffers. The CUDA backend
// provides one; tests provide a fake whose "device" memory faults when touched directly.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Both wait for the device's queued work first, so the bytes copied are final.
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;  // before a device pointer goes to a library that reads it itself
  // Makes the device current on the calling thread (a CUDA device is per thread): a thread other
  // than the one that made the backend calls this before its first copy.
  virtual void use_on_this_thread() {}
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;
  // The device library's collectives for one group of `size` ranks, this one `rank` (NCCL), or
  // null where there is none (the group then stages device buffers, or hands them to a CUDA-aware
  // MPI); with sends and receives too where `point_to_point`. Collective over the group:
  // share(mine, all, n) gives every rank every rank's n bytes, in group-rank order (the group's MPI
  // all-gather: how rank 0's NCCL id reaches the others).
  using Share = std::function<void(const void* mine, void* all, size_t n)>;
  virtual std::unique_ptr<DeviceCollectives> make_collectives(int size, int rank, const std::string& name,
                                                              bool point_to_point, const Share& share) = 0;
};

}  // namespace zero3d
