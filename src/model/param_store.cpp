#include "model/param_store.h"

#include <utility>

namespace zero3d {

FlatParamStore::FlatParamStore(Backend& be, FlatLayout layout)
    : layout_(std::move(layout)), params_(be, layout_.total), grads_(be, layout_.total) {}

}  // namespace zero3d
