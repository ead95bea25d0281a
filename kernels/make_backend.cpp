// kernels/make_backend.cpp: the backend a command line names (--backend host, cuda, kokkos or auto), in
// one place for every command: auto is CUDA where it is built and a GPU is visible, else the host.
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "kernels/backend.h"

namespace zero3d {

bool backend_is_cuda(const std::string& name) {
#if defined(ZERO3D_HAVE_CUDA)
  return name == "cuda" || (name == "auto" && cuda_device_count() > 0);
#else
  return name == "cuda";
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank, const HostOptions& host) {
  if (name != "auto" && name != "host" && name != "cuda" && name != "kokkos")
    throw UserError(strprintf("--backend must be host, cuda, kokkos or auto, got '%s'", name.c_str()));
#if defined(ZERO3D_HAVE_KOKKOS)
  if (name == "kokkos") return make_kokkos_backend();
#else
  if (name == "kokkos")
    throw UserError("--backend kokkos: this zero3d was built without the Kokkos backend (ZERO3D_KOKKOS=OFF or no "
                    "Kokkos found: Debian's libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev)");
#endif
#if defined(ZERO3D_HAVE_CUDA)
  if (backend_is_cuda(name)) {
    if (cuda_device_count() == 0) throw UserError("--backend cuda: no CUDA device is visible to this process");
    return make_cuda_backend(local_rank % cuda_device_count(), host.bf16_gemm);
  }
#else
  (void)local_rank;
  if (name == "cuda") throw UserError("--backend cuda: this zero3d was built without the CUDA backend (ZERO3D_CUDA=OFF or no toolkit found)");
#endif
  if (const char* e = std::getenv("ZERO3D_DEVICE_WALLS"); e && std::string(e) == "1") return make_walled_backend(host);
  return make_host_backend(host);
}

}  // namespace zero3d
