// zero/param_storage.h: what a rank keeps of the parameters between steps, one policy per ZeRO
// stage family, chosen once (make_param_storage):
//
//   full (stages 0-2): every rank keeps every parameter in the flat layout; the optimizer updates
//     its owned range, and from stage 1 the buckets are all-gathered back in place after the step,
//     in messages of up to allgather_bucket_size elements (runs of buckets, spanning units).
//   sharded (stage 3): a rank keeps only its slice of every bucket (updated in place, nothing
//     gathered after the step), plus the persistent buckets whole (all-gathered after each step).
//
// The kept weights' precision is chosen once as well (the policies' template argument: fp32, whose
// rounding steps are the identity, or 16-bit). In mixed precision the kept weights are 16-bit and the optimizer's owned range has an fp32
// master beside them, in the optimizer state (zero/optimizer_state.h), rounded into the 16-bit
// weights as each part of the state is updated (take_updated); the model reads fp32 from the slot
// pool (widened, or gathered then widened). In fp32 stages 0-2 the model reads the kept buffer
// directly. With offload_param on nvme (stage 3) the rank's slices live in a swap file and are read
// straight into the slot at gather time; the master is then in the optimizer state even in fp32.
// With the optimizer offloaded from a device backend the master is in host memory (even in fp32):
// take_updated rounds it on the CPU and the weights go up through the host link (zero/host_link.h).
// Invariant: after gather_updated() every rank of the dp group holds bitwise-identical
// replicated() bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "config/config.h"
#include "storage/swap_file.h"
#include "parallel/comm.h"
#include "zero/host_link.h"
#include "zero/optimizer_state.h"
#include "zero/param_pool.h"
#include "zero/shard_view.h"
#include "zero/storage16.h"

namespace zero3d {

class ParamStorage {
 public:
  virtual ~ParamStorage() = default;
  // This rank's kept parameters (and the state's master) from the counter-based GPT-2 initialisation.
  virtual void init(uint64_t seed, int n_layer) = 0;
  // The fp32 parameters of bucket b's owned range that Adam updates in place, or nullptr where the
  // master is in the optimizer state (then take_updated() receives what Adam wrote there).
  virtual float* owned(const Bucket& b) = 0;
  // The master of owned-state elements [begin, begin + n) was updated (or loaded): keep its
  // rounding (mixed) or copy (swapped fp32) as the weights.
  virtual void take_updated(size_t begin, size_t n, const float* master) = 0;
  // Mixed precision with the weights in the backend's memory and nothing between them and the
  // update (no host link, no swap file): bucket b's owned 16-bit weights, which the update then
  // writes in its own pass (Backend::adam_step's Weights16) instead of take_updated. Else nullptr.
  virtual uint16_t* owned16(const Bucket& b) = 0;
  // The unit's fp32 parameters where they are resident in fp32 (fp32 stages 0-2), else nullptr:
  // then the model reads them from the pool, which fill() serves.
  virtual const float* resident_unit(int unit) = 0;
  // Starts a slot's fill: the gathers (stage 3), and in mixed precision the 16-bit weights the
  // pool widens (ParamSlot::weights16).
  virtual void fill(ParamSlot& slot, int unit) = 0;
  virtual void gather_updated() = 0;                 // after the step: the replicated copies whole again
  virtual void read_weights16(const Piece& p, uint16_t* out) const = 0;  // mixed: a saved piece's weights

  // What every rank of the group keeps alike (stages 0-2: everything; stage 3: the persistent
  // buckets), as stored (16-bit in mixed precision), with each tensor's element offset in it.
  struct Replicated {
    const void* data = nullptr;
    size_t count = 0, elem_bytes = 4;
    std::vector<std::pair<size_t, size_t>> tensors;  // (tensor index, element offset)
  };
  virtual Replicated replicated() const = 0;
  void flip_first_replicated_bit(Backend& be);  // fault injection (a no-op with nothing replicated)

  size_t param_bytes() const { return param_bytes_; }      // the kept weights in memory (ZeRO's 2 or 4 Psi)
  size_t swapped_bytes() const { return swapped_bytes_; }  // the kept weights in a swap file (offload_param)
  size_t host_bytes() const { return host_bytes_; }  // the kept weights in host memory (offload_param cpu from a device)
  SwapFile::Stats take_swap_io() { return swap_ ? swap_->take_stats() : SwapFile::Stats{}; }  // since the last call

 protected:
  ParamStorage(Backend& be, ProcessGroup& dp, const FlatLayout& layout, const ShardView& view, OptimizerState& state,
               HostLink* link)
      : be_(be), dp_(dp), L_(layout), view_(view), state_(state), link_(link) {}
  void split_updated(size_t begin, size_t n, const float* master);  // take_updated in pieces the link's buffers hold

  Backend& be_;
  ProcessGroup& dp_;
  const FlatLayout& L_;
  const ShardView& view_;
  OptimizerState& state_;
  HostLink* link_;  // offload on a device backend: the master is in host memory, the weights go up through it
  std::unique_ptr<SwapFile> swap_;  // offload_param on nvme: the rank's slices
  size_t param_bytes_ = 0, swapped_bytes_ = 0, host_bytes_ = 0;
};

// param_swap: the swap file for stage 3's slices ("" = in memory). link: offload on a device
// backend (the master in host memory), else null.
std::unique_ptr<ParamStorage> make_param_storage(Backend& be, ProcessGroup& dp, const FlatLayout& layout,
                                                 const ShardView& view, const ZeroConfig& zero,
                                                 const std::optional<Storage16>& s16, OptimizerState& state,
                                                 const std::string& param_swap, const SwapFile::Options& swap_options,
                                                 HostLink* link = nullptr);

}  // namespace zero3d
