// kernels/staging.h: bf16 views through fp32 row functions, for the backends whose ops compute on
// fp32 arrays (the host's loops, the Kokkos backend's kernels/math rows). One op's operands: an
// fp32 view as it is; a bf16 view widened into a staging buffer (an input, or an output the op
// reads first) or written there and rounded back by store() (an output), once.
// Extents are checked against what the op touches. The buffers grow to the largest op (the first
// step's) and are the backend's to keep: steps after the first allocate nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/backend.h"

namespace zero3d {

// A backend's side of staging: its buffers, and the casts that widen and round (its own loops,
// not Backend::cast_*, which a backend may count as ops of their own).
class StagingBuffers {
 public:
  using Widen = void (*)(float* out, const uint16_t* x, size_t n);
  using Round = void (*)(uint16_t* out, const float* x, size_t n);
  // `name` says whose op overran a view ("host", "kokkos"); `stage` false: every view passes as
  // it is (a counting backend, which moves no data).
  StagingBuffers(Backend& be, const char* name, Widen widen, Round round, bool stage = true)
      : be_(be), name_(name), widen_(widen), round_(round), stage_(stage) {}

  // Buffer i of at least n floats: grown to the largest asked for, then reused.
  float* buffer(size_t i, size_t n) {
    if (bufs_.size() <= i) bufs_.resize(i + 1);
    if (bufs_[i].size() < n) {
      bufs_[i].reset();  // the old one freed first: the peak is the larger buffer, not both
      bufs_[i] = DeviceBuffer<float>(be_, n);
    }
    return bufs_[i].data();
  }
  void clear() { bufs_.clear(); }

 private:
  friend class Staging;
  Backend& be_;
  const char* name_;
  Widen widen_;
  Round round_;
  bool stage_;
  std::vector<DeviceBuffer<float>> bufs_;
};

class Staging {
 public:
  explicit Staging(StagingBuffers& b) : b_(b) {}
  const float* in(ConstView v, size_t n) {
    Z3D_ASSERT(!v || v.size >= n,  // an unbounded view's size is the largest there is
               strprintf("%s op reads %zu elements of a %zu-element view", b_.name_, n, v.size));
    if (!v.bf16() || !b_.stage_) return static_cast<const float*>(v.data);
    float* f = b_.buffer(next_++, n);
    b_.widen_(f, v.bf16_data(), n);
    return f;
  }
  // `reads`: the op reads the output before writing it (accumulates, or works in place).
  float* out(View v, size_t n, bool reads) {
    Z3D_ASSERT(v.size >= n, strprintf("%s op writes %zu elements of a %zu-element view", b_.name_, n, v.size));
    if (!v.bf16() || !b_.stage_) return static_cast<float*>(v.data);
    float* f = b_.buffer(next_++, n);
    if (reads) b_.widen_(f, v.bf16_data(), n);
    outputs_.push_back({v.at(0, n), f});
    return f;
  }
  // Rounds every bf16 output back into its view.
  void store() {
    for (auto& [v, f] : outputs_) b_.round_(v.bf16_data(), f, v.size);
    outputs_.clear();
  }

 private:
  StagingBuffers& b_;
  size_t next_ = 0;
  std::vector<std::pair<View, float*>> outputs_;
};

}  // namespace zero3d
