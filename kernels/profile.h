// kernels/profile.h: per-op timers of a backend (wall_clock_breakdown): calls, seconds, and the
// bytes and FLOPs each call must move or compute, so a report can set each op's time against its
// bound (bytes / memory bandwidth, or FLOPs / the FMA peak). Off by default: then a timer is one
// branch.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace zero3d {

struct OpStat {
  long calls = 0;
  double seconds = 0, bytes = 0, flops = 0;
};

class OpProfile {
 public:
  bool on = false;
  std::map<std::string, OpStat> ops;
  uint64_t issued = 0;  // every op's scope, profiling or not (Backend::launch_count)

  // Times a scope as one call of `op` (when profiling is on).
  class Scope {
   public:
    Scope(OpProfile* p, const char* op, double bytes, double flops)
        : p_(p && p->on ? p : nullptr), op_(op), bytes_(bytes), flops_(flops) {
      if (p) ++p->issued;
      if (p_) t0_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (!p_) return;
      OpStat& s = p_->ops[op_];
      ++s.calls;
      s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      s.bytes += bytes_;
      s.flops += flops_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfile* p_;
    const char* op_;
    double bytes_, flops_;
    std::chrono::steady_clock::time_point t0_;
  };
};

}  // namespace zero3d
