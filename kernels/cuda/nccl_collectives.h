// kernels/cuda/nccl_collectives.h: the CUDA backend's DeviceCollectives (parallel/comm.h), NCCL.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "core/mem.h"

namespace zero3d {

// NCCL for one group of `size` ranks, this one `rank`, on the calling thread's current device;
// every operation waits for the work queued on `compute` when it is issued. Collective over the
// group (share, point_to_point: DeviceMemory::make_collectives). Null in a build without NCCL.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(cudaStream_t compute, int size, int rank,
                                                         const std::string& name, bool point_to_point,
                                                         const DeviceMemory::Share& share);

}  // namespace zero3d
