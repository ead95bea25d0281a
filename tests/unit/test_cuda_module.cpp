// The CUDA backend module's contract, on any machine that builds it (no GPU needed): the module
// loads with every symbol resolved (zero3d's own ones from this executable, which exports them),
// exports its two entry points, and without a driver the loader reports the host as the only
// backend instead of failing. On a machine with a driver test_kernels runs the backend itself.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/check.h"
#include "kernels/backend.h"

#if defined(ZERO3D_HAVE_CUDA)
TEST(CudaModule, LoadsWithEverySymbolResolved) {
  void* h = dlopen(ZERO3D_CUDA_MODULE_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto count = reinterpret_cast<int (*)()>(dlsym(h, "zero3d_cuda_device_count"));
  ASSERT_NE(count, nullptr);
  EXPECT_NE(dlsym(h, "zero3d_make_cuda_backend"), nullptr);
  const int n = count();  // 0 without a driver or a device: never an abort
  EXPECT_GE(n, 0);
  if (!dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) && !dlopen("libcuda.so.1", RTLD_LAZY)) {
    EXPECT_EQ(n, 0);
    EXPECT_EQ(zero3d::cuda_device_count(), 0);
    try {
      zero3d::make_cuda_backend(0);
      ADD_FAILURE() << "a CUDA backend without a driver";
    } catch (const zero3d::UserError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("no NVIDIA driver"));
    }
  }
}
#else
TEST(CudaModule, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
