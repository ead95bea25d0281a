// zero/grad_sync.h: how gradients get from backward to the optimizer over the data-parallel
// group, one strategy per ZeRO stage family, chosen once (make_grad_sync):
//
//   boundary (stages 0-1): every rank accumulates the full gradient over the micro-batches, in
//     place (fp32) or rounded into a full 16-bit gradient through a unit buffer (mixed). The
//     buckets are all-reduced (stage 0, and stage 1 with reduce_scatter=false), or
//     reduce-scattered into the rank's shard of the gradient (stage 1): with overlap_comm each
//     unit's buckets as soon as the last micro-batch's backward has completed the unit (DeepSpeed's
//     overlap_comm), the rest at the accumulation boundary; without, all at the boundary, where a
//     message may span units.
//   per unit (stages 2-3): backward hands each unit over as soon as it is complete (done); its
//     buckets are reduce-scattered (or all-reduced, keeping the slice) straight away from one of
//     three unit buffers (the embeddings' and two rotating ones) into the rank's shard of the
//     gradient. With overlap_comm the reductions are non-blocking and complete while backward goes
//     on (each is waited for when its buffer is needed again, or at the boundary); without, each
//     is waited for at once.
//
// The precision is chosen once too: each family has an fp32 variant (backward's gradient is
// reduced as it is) and a mixed one (rounded to 16 bits, reduced, widened for the optimizer).
//
// Messages: runs of consecutive buckets of at most reduce_bucket_size elements (bucket_messages; a
// bucket larger than that alone), one collective each (several reduce-scatters in one: MessageSlices).
// A message spans units only at stages 0-1 without overlap_comm (elsewhere a unit is what
// backward hands over). Sums are elementwise, so the grouping never changes what a rank gets
// (nor its bits where the transport sums in a fixed order: shared memory, or MPI on 2 ranks).
//
// After finish(), owned(b) is the fp32 gradient of bucket b's owned range (what Adam reads; in
// mixed precision the widening of the 16-bit result), element view.owned_offset(b) of the flat
// layout first: at stage 0 the whole bucket, of which the norm counts this rank's dp slice. Invariant: every strategy issues its collectives in the same order
// on every rank of the group (the order of done() calls and buckets). The buffers collectives read
// are comm buffers (BufferUse::comm), which the shared-memory collectives read in place.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>

#include "config/config.h"
#include "parallel/comm.h"
#include "zero/shard_view.h"
#include "zero/storage16.h"

namespace zero3d {

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Zero the accumulators; backward hands every unit over micro_batches times this step.
  virtual void begin_step(int micro_batches) = 0;
  virtual float* acquire(int unit) = 0;  // where backward accumulates (+=) the unit's gradient
  virtual void done(int unit) = 0;       // backward finished the unit for this micro-batch
  virtual void finish() = 0;             // the accumulation boundary: reduce what is left
  virtual float* owned(const Bucket& b) = 0;
  // Fault injection: an inf in the next unit handed over (or straight into the gradient).
  virtual void inject_inf() = 0;
  size_t grad_bytes() const { return grad_bytes_; }      // the gradient accumulators (ZeRO's 2 or 4 Psi)
  size_t buffer_bytes() const { return buffer_bytes_; }  // unit buffers, receive and widening buffers

 protected:
  size_t grad_bytes_ = 0, buffer_bytes_ = 0;
};

// s16: the 16-bit storage in mixed precision, none in fp32.
std::unique_ptr<GradSync> make_grad_sync(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                         const ShardView& view, const ZeroConfig& cfg,
                                         const std::optional<Storage16>& s16);

}  // namespace zero3d
