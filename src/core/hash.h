// core/hash.h: FNV-1a over bytes. A name for a thing (a run directory), and a fingerprint to compare
// across ranks (replicated parameters); not a checksum against corruption on disk.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zero3d {

inline uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace zero3d
