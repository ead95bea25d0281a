// core/rng.h: counter-based random numbers. Value i of stream s under seed k is a pure function
// of (k, s, i), so any rank can generate exactly its slice of a tensor and every layout starts
// from the same weights. splitmix64 (Steele, Lea, Flood 2014) as the mixing function, the one copy
// of it: the data order (SplitMix64 below), the initial weights, checksums.
#pragma once
#include <cmath>
#include <cstdint>

namespace zero3d {

constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;  // the counter's step: 2^64 / the golden ratio

// splitmix64's finalizer: a bijective mix of 64 bits.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The splitmix64 output of counter x: x stepped once, then mixed.
inline uint64_t splitmix64(uint64_t x) { return splitmix64_mix(x + kSplitMixGamma); }

// A 64-bit counter through the mixer, as a sequence. Tiny, portable and the same on every
// standard library, unlike std::shuffle/std::uniform_int_distribution.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return splitmix64_mix(state += kSplitMixGamma); }
  // Uniform in [0, n), n >= 1, without modulo bias: reject the lowest 2^64 mod n raw values, so
  // the accepted range is a whole number of copies of [0, n) (OpenBSD arc4random_uniform).
  uint64_t below(uint64_t n) {
    const uint64_t reject_under = (0 - n) % n;  // == 2^64 mod n
    for (;;) {
      const uint64_t r = next();
      if (r >= reject_under) return r % n;
    }
  }
};

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
