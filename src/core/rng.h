// core/rng.h: counter-based random numbers. Value i of stream s under seed k is a pure function
// of (k, s, i), so any rank can generate exactly its slice of a tensor and every layout starts
// from the same weights. splitmix64 (Steele, Lea, Flood 2014) as the mixing function.
#pragma once
#include <cmath>
#include <cstdint>

namespace zero3d {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// Uniform in (0, 1), never 0 (53 random bits).
inline double uniform_open(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// Standard normal for element `index` of `stream` (Box-Muller on two independent hashes).
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  double u1 = uniform_open(hash3(seed, stream, 2 * index));
  double u2 = uniform_open(hash3(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace zero3d
