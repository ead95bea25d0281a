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
//                 pause_load:R:0 the same before the checkpoint load at start;
//                 pause_tokenizer_copy:R:S the same before rank R (0: it copies) copies the run's
//                 tokenizer file beside step S's checkpoint
//   truncate_swap:R:S  before step S, rank R truncates its swap files (offload to nvme) to nothing (a
//                 swap file that fails under the run: the job must stop with exit 8 naming the file)
// Unset in normal runs. The trainer reads it once and calls the hooks below at their points: the
// one seam through which faults enter a run (none of them costs anything when unset).
#pragma once
#include <string>
#include <vector>

#include "ckpt/writer.h"
#include "zero/engine.h"

namespace zero3d {

class FaultInjector {
 public:
  explicit FaultInjector(int world_rank);  // reads ZERO3D_FAULT
  bool at(const char* kind, int step) const;  // this rank has the fault at this step

  void before_load() const;                                        // pause_load
  void before_tokenizer_copy(int step) const;                      // pause_tokenizer_copy
  SaveFaults before_save(int step, const std::string& ckpt_dir) const;  // fill_disk, free_disk; the writer's
  void before_step(int step, ZeroEngine& engine, const SwapFiles& swap) const;  // inf, truncate_swap
  void before_reduction(int step) const;                           // hang
  void after_step(int step, ZeroEngine& engine) const;             // perturb

 private:
  struct One {
    std::string kind;
    int rank = -1, step = -1;
  };
  std::vector<One> faults_;
  int rank_;
};

}  // namespace zero3d
