// core/clock.h: the one clock every timer reads (monotonic), and elapsed seconds since a point.
#pragma once
#include <chrono>

namespace zero3d {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace zero3d
