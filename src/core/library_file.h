// core/library_file.h: what `zero3d --version` and the run record say of a library besides its
// name: the file a loaded symbol came from, and a version number that packs three parts into one
// integer (major * 10000 + minor * 100 + patch: cuDNN, NCCL from 2.9, cuBLAS, Kokkos) as text.
// Header only: the CUDA module, which zero3d loads with dlopen, compiles its own copy.
#pragma once
#include <dlfcn.h>

#include <string>

#include "core/check.h"

namespace zero3d {

// The shared library `symbol` (a function or a variable) came from, or the executable where it is
// linked in statically; "" where the loader does not say.
template <typename T>
std::string library_file(T* symbol) {
  Dl_info info{};
  return dladdr(reinterpret_cast<const void*>(symbol), &info) && info.dli_fname ? info.dli_fname : "";
}

// 90501 -> "9.5.1".
inline std::string dotted_version(long v) { return strprintf("%ld.%ld.%ld", v / 10000, v / 100 % 100, v % 100); }

}  // namespace zero3d
