// model/param_store.h: how the model reaches its parameters and gradients, one unit at a time
// (unit = the embeddings, one block, or the final LayerNorm; see model/flat_layout.h). The model
// never owns these buffers: the ZeRO engine decides whether a unit's parameters are resident or
// gathered on demand, and whether its gradients accumulate in place or are reduced away as soon as
// backward has finished with the unit.
//
// Protocol per micro-batch: forward acquires and releases units in order; backward acquires
// parameters and gradients in reverse order and calls grads_done(u) once the unit's gradient for
// this micro-batch is complete. Unit 0 (the tied token embedding) stays acquired from the LM head
// to the embedding, in both passes.
#pragma once
#include "kernels/backend.h"
#include "model/flat_layout.h"

namespace zero3d {

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual const FlatLayout& layout() const = 0;
  // The unit's full parameters (its padded range of the flat layout), valid until release_params.
  virtual const float* acquire_params(int unit) = 0;
  virtual void release_params(int unit) { (void)unit; }
  // The same parameters as the run keeps them in bf16 (the fp32 ones were widened from these), in
  // the same layout, valid while acquired; nullptr where the run keeps no bf16 weights (fp32 and
  // fp16 runs). The model hands them to its GEMMs beside the fp32 ones (GemmWeight).
  virtual const uint16_t* acquired_bf16(int unit) const {
    (void)unit;
    return nullptr;
  }
  // Whether the fp32 parameters include the gemm_only tensors (model/param_info.h). Not where the
  // GEMMs run in bf16 on bf16 weights: then only those tensors' bf16 copies are lent.
  virtual bool fp32_gemm_weights() const { return true; }
  // Where backward accumulates (+=) the unit's gradient, valid until grads_done.
  virtual float* acquire_grads(int unit) = 0;
  virtual void grads_done(int unit) { (void)unit; }
};

// Every unit resident in two full buffers: the single-rank store, and the tests' store.
class FlatParamStore final : public ParamStore {
 public:
  FlatParamStore(Backend& be, FlatLayout layout);
  const FlatLayout& layout() const override { return layout_; }
  const float* acquire_params(int unit) override { return params_.data() + layout_.units[unit].offset; }
  float* acquire_grads(int unit) override { return grads_.data() + layout_.units[unit].offset; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  size_t size() const { return layout_.total; }

 private:
  FlatLayout layout_;
  DeviceBuffer<float> params_, grads_;
};

}  // namespace zero3d
