// kernels/typed_views.h: an op's activation views (kernels/tensor.h) as the templated kernels of the
// CUDA and Kokkos backends take them: kernels are templates on the storage type S (float, or bf16
// carried as its bits, uint16_t), and a launcher picks S once from the views the op is given.
// Invariant: an op's views share one type; a mix is a caller's bug, fatal, naming the op.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "core/check.h"
#include "kernels/tensor.h"

namespace zero3d {

// f.template operator()<S>() with S the storage type of t: float, or bf16 as its bits (uint16_t).
template <typename F>
void with_storage(DType t, F&& f) {
  if (t == DType::bf16) f.template operator()<uint16_t>();
  else f.template operator()<float>();
}
template <typename S>
S* ptr(View v) {
  return static_cast<S*>(v.data);
}
template <typename S>
const S* ptr(ConstView v) {
  return static_cast<const S*>(v.data);
}

// An op's activation view, and how many elements the op touches in it.
struct Touch {
  ConstView v;
  size_t n;
};
// The storage type the op's views share (null ones aside), each checked to hold what the op touches
// (a bare pointer's extent is unknown: unchecked). A kernel reads and writes one type, so views of
// two types are a caller's bug: fatal, naming the op.
inline DType storage(const char* name, std::initializer_list<Touch> views) {
  const Touch* first = nullptr;
  for (const Touch& t : views) {
    if (!t.v) continue;
    Z3D_ASSERT(t.v.size >= t.n, strprintf("%s: a %s view of %zu elements where the op touches %zu", name,
                                          dtype_name(t.v.dtype), t.v.size, t.n));
    if (!first) first = &t;
    Z3D_ASSERT(t.v.dtype == first->v.dtype,
               strprintf("%s: %s and %s views; the backend runs an op's activations in one type", name,
                         dtype_name(first->v.dtype), dtype_name(t.v.dtype)));
  }
  return first ? first->v.dtype : DType::f32;
}

}  // namespace zero3d
