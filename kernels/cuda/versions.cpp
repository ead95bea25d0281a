// kernels/cuda/versions.cpp: what the CUDA module was built with and runs on, for `zero3d --version`
// and the run record (kernels/cuda_module.cpp's cuda_module_report reads it): the CUDA runtime and
// driver, cuBLAS, cuBLASLt, cuDNN and NCCL. Host code (no kernels), built by the host compiler.
// Across dlopen the answer is plain C: one line per library, five tab-separated fields
// (name, built, loaded, from, why not). Nothing here touches a device or creates a context.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cctype>
#include <fstream>
#include <string>

#include "core/check.h"
#include "core/library_file.h"
#if defined(ZERO3D_HAVE_CUDNN)
#include <cudnn_version.h>

#include "kernels/cuda/cudnn_attention.h"
#endif
#if defined(ZERO3D_HAVE_NCCL)
#include <nccl.h>
#endif

namespace zero3d {

namespace {

// CUDA's version numbers are major * 1000 + minor * 10: 12080 is 12.8.
std::string cuda_version(int v) { return strprintf("%d.%d", v / 1000, v % 1000 / 10); }

// The NVIDIA kernel driver's version ("580.65.06"), from the line its module writes under /proc:
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..." (the first word that is a number).
std::string kernel_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string word;
  while (f >> word)
    if (std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos) return word;
  return "";
}

std::string line(const std::string& name, const std::string& built, const std::string& loaded, const std::string& from,
                 const std::string& why_not = "") {
  return name + "\t" + built + "\t" + loaded + "\t" + from + "\t" + why_not + "\n";
}

std::string cublas_property(cublasStatus_t (*get)(libraryPropertyType, int*)) {
  int major = 0, minor = 0, patch = 0;
  get(MAJOR_VERSION, &major);
  get(MINOR_VERSION, &minor);
  get(PATCH_LEVEL, &patch);
  return strprintf("%d.%d.%d", major, minor, patch);
}

std::string report() {
  std::string out;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // the newest CUDA the driver runs; 0: none
  out += line("CUDA runtime", cuda_version(CUDART_VERSION), cuda_version(runtime),
              library_file(&cudaRuntimeGetVersion));
  // libcuda.so.1 is loaded already (kernels/cuda_module.cpp loads it first): ask where from.
  std::string libcuda;
  if (void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    if (const void* fn = dlsym(h, "cuDriverGetVersion")) libcuda = library_file(fn);
    dlclose(h);
  }
  const std::string kernel = kernel_driver_version();
  out += driver > 0 ? line("CUDA driver", "", (kernel.empty() ? "" : kernel + ", ") + "runs CUDA " + cuda_version(driver),
                           libcuda)
                    : line("CUDA driver", "", "", "", "cudaDriverGetVersion finds no working driver in " +
                                                         (libcuda.empty() ? "libcuda.so.1" : libcuda) +
                                                         " (a stub from the toolkit on the library path?)");
  const std::string cublas_built = dotted_version(CUBLAS_VERSION);
  out += line("cuBLAS", cublas_built, cublas_property(&cublasGetProperty), library_file(&cublasGetProperty));
  out += line("cuBLASLt", cublas_built, cublas_property(&cublasLtGetProperty),
              library_file(&cublasLtGetProperty));
#if defined(ZERO3D_HAVE_CUDNN)
  std::string from, why;
  const std::string cudnn = cudnn_loaded_version(from, why);
  out += line("cuDNN", dotted_version(CUDNN_VERSION), cudnn, from, why);
#else
  out += line("cuDNN", "", "", "", "not built in (no cuDNN headers at build time: set CUDNN_HOME)");
#endif
#if defined(ZERO3D_HAVE_NCCL)
  int nccl = 0;
  ncclGetVersion(&nccl);
  out += line("NCCL", dotted_version(NCCL_VERSION_CODE), dotted_version(nccl), library_file(&ncclGetVersion));
#else
  out += line("NCCL", "", "", "", "not built in (no NCCL at build time: device buffers go through host memory for MPI)");
#endif
  return out;
}

}  // namespace

}  // namespace zero3d

// The module's entry point for the report (kernels/cuda_module.cpp loads it with the others).
extern "C" const char* zero3d_cuda_versions() {
  static const std::string text = zero3d::report();
  return text.c_str();
}
