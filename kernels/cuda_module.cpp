// kernels/cuda_module.cpp: make_cuda_backend, cuda_device_count and cuda_module_report (--version),
// from the CUDA backend module (libzero3d_cuda.so: build/lib in the build tree, <libdir>/zero3d
// installed), loaded with dlopen on first use and only where an NVIDIA driver is (libcuda.so.1
// loads). A CPU node never maps the CUDA libraries: they cost each process 0.65 s of CPU at start-up
// (measured: `zero3d --version` 0.29 s of CPU without them, 0.93 s with). The module takes zero3d's
// own symbols (strprintf, fatal) from the executable that loads it, which exports them (CMake: -rdynamic).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/install_dirs.h"
#include "kernels/backend.h"

namespace zero3d {

namespace {

struct CudaModule {
  int (*device_count)() = nullptr;
  Backend* (*make)(int, int) = nullptr;
  const char* (*versions)() = nullptr;  // "name\tbuilt\tloaded\tfrom\twhy_not\n" per library
  std::string path;  // the file loaded
  std::string why;   // why there is none: no driver, or the module did not load
};

// ZERO3D_CUDA_MODULE, else the module of this executable's tree (core/install_dirs.h: found from
// its own location, build or installed), else the loader's path.
std::string module_path() {
  if (const char* e = std::getenv("ZERO3D_CUDA_MODULE"); e && *e) return e;
  if (const std::string dir = cuda_module_dir(); !dir.empty()) {
    const std::string path = dir + "/libzero3d_cuda.so";
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return "libzero3d_cuda.so";
}

const CudaModule& module() {
  static const CudaModule m = [] {
    CudaModule out;
    if (!dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
      out.why = "no NVIDIA driver (libcuda.so.1 does not load)";
      return out;
    }
    const std::string path = module_path();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      out.why = strprintf("the CUDA backend module '%s' does not load: %s", path.c_str(), dlerror());
      return out;
    }
    out.path = path;
    out.device_count = reinterpret_cast<int (*)()>(dlsym(h, "zero3d_cuda_device_count"));
    out.make = reinterpret_cast<Backend* (*)(int, int)>(dlsym(h, "zero3d_make_cuda_backend"));
    out.versions = reinterpret_cast<const char* (*)()>(dlsym(h, "zero3d_cuda_versions"));
    if (!out.device_count || !out.make || !out.versions) {
      out.device_count = nullptr;
      out.make = nullptr;
      out.why = strprintf("'%s' is not a zero3d CUDA module of this version", path.c_str());
    }
    return out;
  }();
  return m;
}

}  // namespace

int cuda_device_count() {
  const CudaModule& m = module();
  return m.device_count ? m.device_count() : 0;
}

CudaModuleReport cuda_module_report() {
  const CudaModule& m = module();
  CudaModuleReport r;
  if (!m.make) return (r.why_not = m.why), r;
  char real[PATH_MAX];
  r.file = realpath(m.path.c_str(), real) ? real : m.path;  // not bin/../lib/...
  // One line per library, five tab-separated fields (kernels/cuda/versions.cpp): plain C across dlopen.
  const std::string text = m.versions();
  for (size_t start = 0, end; start < text.size(); start = end + 1) {
    end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::vector<std::string> f;
    for (size_t a = start, b; a <= end; a = b + 1) {
      b = std::min(text.find('\t', a), end);
      f.push_back(text.substr(a, b - a));
    }
    if (f.size() == 5) r.libraries.push_back({f[0], f[1], f[2], f[3], f[4]});
  }
  return r;
}

std::unique_ptr<Backend> make_cuda_backend(int device, bool bf16_gemm) {
  const CudaModule& m = module();
  if (!m.make) throw UserError("the CUDA backend is not available here: " + m.why);
  return std::unique_ptr<Backend>(m.make(device, bf16_gemm ? 1 : 0));
}

}  // namespace zero3d
