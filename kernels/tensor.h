// kernels/tensor.h: a typed view of backend memory: where a buffer starts, the type of its
// elements and how many it holds. The seam's activation operands are views, so one op serves
// fp32 and bf16 storage, and the model picks its activations' type once, at construction.
//
// bf16 storage, fp32 math: an op widens what it reads, computes in fp32 (its statistics and sums
// too) and rounds what it writes to nearest even, once. An op that accumulates into a bf16 buffer
// (dx +=) widens it, adds and rounds. Norm statistics, attention's log-sum-exps and the losses
// stay fp32 whatever the activations are; the logits are activations like the others.
//
// A bare `float*` converts to a view of unknown extent (the fp32 callers: tests, the engine);
// views made with an extent are checked against what an op reads and writes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace zero3d {

enum class DType : uint8_t { f32, bf16 };
constexpr size_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : 4; }
constexpr const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : "fp32"; }

// Elements a row-major operand of `rows` rows of `cols` at row stride `ld` spans (0 when empty):
// what an op on a strided view reads or writes, for its extent check.
constexpr size_t strided_extent(long rows, long cols, long ld) {
  return rows > 0 && cols > 0 ? static_cast<size_t>(rows - 1) * static_cast<size_t>(ld) + static_cast<size_t>(cols) : 0;
}

template <bool Const>
struct BasicView {
  using Ptr = std::conditional_t<Const, const void*, void*>;
  using F32 = std::conditional_t<Const, const float, float>;
  using U16 = std::conditional_t<Const, const uint16_t, uint16_t>;
  using Byte = std::conditional_t<Const, const char, char>;
  static constexpr size_t kUnbounded = SIZE_MAX;  // a bare pointer's: not checked

  Ptr data = nullptr;
  DType dtype = DType::f32;
  size_t size = 0;

  BasicView() = default;
  BasicView(std::nullptr_t) {}                                                   // NOLINT: "no operand"
  BasicView(F32* p) : data(p), size(p ? kUnbounded : 0) {}                       // NOLINT: an fp32 buffer
  BasicView(U16* p, size_t n) : data(p), dtype(DType::bf16), size(n) {}
  BasicView(F32* p, size_t n) : data(p), size(n) {}
  BasicView(Ptr p, DType t, size_t n) : data(p), dtype(t), size(n) {}
  template <bool C = Const, std::enable_if_t<C, int> = 0>
  BasicView(const BasicView<false>& v) : data(v.data), dtype(v.dtype), size(v.size) {}  // NOLINT: const view

  explicit operator bool() const { return data != nullptr; }
  bool bf16() const { return dtype == DType::bf16; }
  F32* f32_data() const { return static_cast<F32*>(data); }
  U16* bf16_data() const { return static_cast<U16*>(data); }
  size_t bytes() const { return size * dtype_bytes(dtype); }
  // Elements [offset, offset + n) of this view.
  BasicView at(size_t offset, size_t n) const {
    return {static_cast<Ptr>(static_cast<Byte*>(data) + offset * dtype_bytes(dtype)), dtype, n};
  }
};
using View = BasicView<false>;
using ConstView = BasicView<true>;

}  // namespace zero3d
