// train/fault.h: fault injection for the safety-net tests, from ZERO3D_FAULT=KIND:RANK:STEP[,...]:
//   hang:R:S      world rank R stops before step S's gradient reduction (a rank that never
//                 joins a collective: the watchdog must abort the job)
//   perturb:R:S   world rank R changes one parameter of its replica after step S (the
//                 consistency check must name the tensor)
//   inf:R:S       world rank R's gradient gets an inf in step S's backward (an fp16 overflow:
//                 every rank must skip the step and the loss scaler must back off)
//   stall_save:R:S  world rank R stops halfway through writing step S's checkpoint (a rank killed
//                 or hung mid-save: `latest` must still name the previous checkpoint)
//   fill_disk:R:S   before step S's save, rank R fills the checkpoint file system up to its last
//                 512 KiB with a file .fill (a disk that fills during the run: the save must fail
//                 cleanly); free_disk:R:S removes that file before step S's save
//   pause_save_start:R:S, pause_save_middle:R:S  rank R's writer pauses 1 s before its first write
//                 of step S's checkpoint / halfway through its writes, saying so with its pid on
//                 stderr (a test arms a libfiu failure point in it meanwhile: tests/cli/test_faults.sh);
//                 pause_load:R:0 the same before the checkpoint load at start
//   truncate_swap:R:S  before step S, rank R truncates its swap files (offload to nvme) to nothing (a
//                 swap file that fails under the run: the job must stop with exit 8 naming the file)
// Unset in normal runs; the trainer reads it once.
#pragma once
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace zero3d {

struct Fault {
  struct One {
    std::string kind;
    int rank = -1, step = -1;
  };
  std::vector<One> faults;

  static Fault from_env() {
    Fault f;
    const char* e = std::getenv("ZERO3D_FAULT");
    if (!e) return f;
    std::stringstream list(e);
    for (std::string s; std::getline(list, s, ',');) {
      size_t a = s.find(':'), b = s.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      f.faults.push_back({s.substr(0, a), std::atoi(s.substr(a + 1, b - a - 1).c_str()), std::atoi(s.substr(b + 1).c_str())});
    }
    return f;
  }
  bool at(const char* kind, int rank, int step) const {
    for (const One& o : faults)
      if (o.kind == kind && o.rank == rank && o.step == step) return true;
    return false;
  }
};

}  // namespace zero3d
