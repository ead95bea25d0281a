// zero/storage16.h: the 16-bit storage of mixed precision (fp16 or bf16 weights and gradients
// beside fp32 compute): narrowing with round-to-nearest-even, widening, and accumulating an fp32
// gradient into a 16-bit one, on the backend. fp32 runs have none (the engine holds an empty
// optional), so "is this run mixed" is asked once, at construction.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/math/dtype.h"
#include "parallel/comm.h"  // Dtype16

namespace zero3d {

class Storage16 {
 public:
  Storage16(Backend& be, Dtype16 type) : be_(be), type_(type) {}
  Dtype16 type() const { return type_; }
  void narrow(uint16_t* dst, const float* src, size_t n) const {  // fp32 -> 16 bit
    type_ == Dtype16::fp16 ? be_.cast_to_fp16(dst, src, n) : be_.cast_to_bf16(dst, src, n);
  }
  void widen(float* dst, const uint16_t* src, size_t n) const {  // 16 bit -> fp32
    type_ == Dtype16::fp16 ? be_.cast_from_fp16(dst, src, n) : be_.cast_from_bf16(dst, src, n);
  }
  void accumulate(uint16_t* acc, const float* x, size_t n) const {  // acc = round16(acc + x)
    type_ == Dtype16::fp16 ? be_.accumulate_fp16(acc, x, n) : be_.accumulate_bf16(acc, x, n);
  }
  std::vector<uint16_t> narrow_host(const std::vector<float>& x) const {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      h[i] = type_ == Dtype16::fp16 ? math::fp16_from_float(x[i]) : math::bf16_from_float(x[i]);
    return h;
  }

 private:
  Backend& be_;
  Dtype16 type_;
};

}  // namespace zero3d
