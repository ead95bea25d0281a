// zero/engine_faults.h: fault injection into a ZeRO engine (ZERO3D_FAULT, train/fault.h), kept
// out of the engine's interface: the safety tests use it to prove that an overflow skips the step
// and that a corrupted replica is caught by the consistency check.
#pragma once
#include "zero/engine.h"

namespace zero3d {

struct EngineFaults {
  // Flip the lowest bit of the first replicated parameter on this rank (a no-op when nothing is
  // replicated: stage 3 without persistent buckets).
  static void perturb_replica(ZeroEngine& e) { e.params_->flip_first_replicated_bit(e.be_); }
  // Put an inf into the gradient of the next unit backward hands over (or straight into the gradient).
  static void inject_inf_gradient(ZeroEngine& e) { e.sync_->inject_inf(); }
};

}  // namespace zero3d
