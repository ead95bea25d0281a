// zero/param_pool.h: the slots the model reads a unit's fp32 parameters from when they are not
// resident in fp32: gathered on demand (ZeRO-3), or widened from the 16-bit weights (mixed
// precision). Allocated once: the first and last unit own a slot each; the blocks share as many
// as stage3_max_live_parameters allows (ZeRO-3), never fewer than two (current and next).
//
// The pool follows the model's access trace of one micro-batch (forward: embeddings, blocks,
// final LayerNorm; backward: embeddings for the LM head, final LayerNorm, blocks in reverse).
// With gathering on, it prefetches the next unit of the trace when that unit is at most
// stage3_prefetch_bucket_size elements, and keeps a released unit while its next use is fewer
// than stage3_max_reuse_distance elements ahead. What fills a slot (the gathers, the widening) is
// the caller's Fill; the pool decides which slot, when, and waits.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "model/flat_layout.h"
#include "parallel/comm.h"
#include "zero/storage16.h"

namespace zero3d {

// A unit's full fp32 parameters for compute, with the requests that fill it. In mixed precision
// the fill names the unit's 16-bit weights (weights16: gathered into buf16, or the kept ones) and
// the pool widens them into buf once the requests are done (widen_pending). A fill may leave a
// second stage in `then_start` (swapped slices: the reads were issued, the gathers start once
// they are in), which the pool runs before it waits for ops.
struct ParamSlot {
  DeviceBuffer<float> buf;
  DeviceBuffer<uint16_t> buf16;
  int unit = -1;        // the unit held (valid once ops are done), -1 when free
  bool in_use = false;  // between acquire and release
  const uint16_t* weights16 = nullptr;  // mixed: the 16-bit weights buf is widened from
  bool widen_pending = false;
  std::function<void()> then_start;
  std::vector<PendingOp> ops;
  void finish() {  // every request of the fill done
    if (then_start) std::exchange(then_start, nullptr)();
    for (auto& op : ops) op.wait();
    ops.clear();
  }
};

class ParamPool {
 public:
  struct Policy {
    bool gathered = false;       // ZeRO-3: slots are filled by gathers; prefetch and reuse apply
    size_t max_live = 0;         // stage3_max_live_parameters (gathered)
    size_t prefetch_elems = 0;   // stage3_prefetch_bucket_size (gathered)
    size_t reuse_distance = 0;   // stage3_max_reuse_distance (gathered)
    bool slots16 = false;        // slots need a 16-bit staging buffer (gathered mixed precision)
    // Mixed: widen the gemm_only tensors too. Not where the GEMMs run in bf16 on bf16 weights:
    // they read those tensors' bf16 copies (held16), and their fp32 places stay unwritten.
    bool widen_gemm_only = true;
  };
  // Starts filling `slot` (whose unit is already set) with the unit's parameters.
  using Fill = std::function<void(ParamSlot& slot, int unit)>;
  ParamPool(Backend& be, const FlatLayout& layout, const Policy& policy, const std::optional<Storage16>& s16,
            Fill fill);
  ~ParamPool();

  const float* acquire(int unit);  // the unit's parameters, valid until release
  // The 16-bit weights an acquired unit was widened from (mixed precision), else nullptr.
  const uint16_t* held16(int unit) const;
  void release(int unit);
  void invalidate();               // forget every gathered unit (the weights changed)
  size_t bytes() const;

 private:
  ParamSlot* holding(int unit);
  ParamSlot* free_slot_for(int unit, bool may_wait);
  size_t distance_to_next_use(int unit) const;  // elements acquired before `unit` is used again
  void fill(ParamSlot& s, int unit);
  void widen(ParamSlot& s, int unit);  // weights16 -> buf, the runs of widen_runs_

  const FlatLayout& layout_;
  Policy policy_;
  const std::optional<Storage16>& s16_;
  Fill fill_;
  std::vector<std::unique_ptr<ParamSlot>> slots_;
  std::vector<std::vector<ShardInfo>> widen_runs_;  // per unit: the element ranges widened (mixed)
  std::vector<int> trace_;  // unit access order of one micro-batch (forward, backward)
  size_t trace_pos_ = 0;
};

}  // namespace zero3d
