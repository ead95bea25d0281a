// train/fault.h: fault injection for the safety-net tests, from ZERO3D_FAULT=KIND:RANK:STEP:
//   hang:R:S      world rank R stops before step S's gradient reduction (a rank that never
//                 joins a collective: the watchdog must abort the job)
//   perturb:R:S   world rank R changes one parameter of its replica after step S (the
//                 consistency check must name the tensor)
//   inf:R:S       world rank R's gradient gets an inf in step S's backward (an fp16 overflow:
//                 every rank must skip the step and the loss scaler must back off)
//   stall_save:R:S  world rank R stops halfway through writing step S's checkpoint (a rank killed
//                 mid-save: `latest` must still name the previous checkpoint)
// Unset in normal runs; the trainer reads it once.
#pragma once
#include <cstdlib>
#include <string>

namespace zero3d {

struct Fault {
  std::string kind;
  int rank = -1;
  int step = -1;

  static Fault from_env() {
    Fault f;
    const char* e = std::getenv("ZERO3D_FAULT");
    if (!e) return f;
    std::string s(e);
    size_t a = s.find(':'), b = s.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) return f;
    f.kind = s.substr(0, a);
    f.rank = std::atoi(s.substr(a + 1, b - a - 1).c_str());
    f.step = std::atoi(s.substr(b + 1).c_str());
    return f;
  }
  bool at(const char* kind_, int rank_, int step_) const { return kind == kind_ && rank == rank_ && step == step_; }
};

}  // namespace zero3d
