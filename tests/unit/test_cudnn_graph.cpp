// The operation graphs of cuDNN's fused flash attention (kernels/cuda/cudnn_attention.cpp) as cuDNN
// itself checks them, without a GPU: every tensor and operation of the forward and the backward
// graph, and the graph as a whole, finalize for the model shapes zero3d runs (multi-head and
// grouped-query), and the shapes cuDNN's attention cannot take are refused with the reason; then
// the plans for an H100 described in JSON (tests/data/cudnn): which engines take the graphs. What
// cuDNN's engines compute is checked on a GPU (jobscripts/device_check.sh: test_kernels on cuda).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <string>

#if defined(ZERO3D_HAVE_CUDNN)
#include "core/posix_io.h"
#include "kernels/cuda/cudnn_attention.h"
#endif

namespace {

#if defined(ZERO3D_HAVE_CUDNN)
using zero3d::AttnShape;
using zero3d::CudnnAttention;

std::string name(const AttnShape& s) {
  return "B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " Hkv " +
         std::to_string(s.Hkv) + " hd " + std::to_string(s.hd);
}
#endif

TEST(CudnnAttentionGraphs, FinalizeForTheModelShapes) {
#if !defined(ZERO3D_HAVE_CUDNN)
  GTEST_SKIP() << "built without the CUDA backend or without cuDNN's headers";
#else
  const AttnShape shapes[] = {
      {8, 1024, 16, 16, 64},  // GPT-2 350M (d 1024, 16 heads), micro-batch 8
      {4, 2048, 32, 8, 64},   // a Llama ~1B: 32 query heads on 8 key/value heads
      {2, 64, 4, 4, 32},      // gpt-tiny
      {2, 64, 4, 2, 32},      // llama-tiny
      {1, 256, 12, 4, 128},   // head width 128
  };
  for (const AttnShape& s : shapes) {
    bool loaded = false;
    const std::string r = CudnnAttention::check_graphs(s, loaded);
    if (!loaded) GTEST_SKIP() << "no cuDNN to load here: " << r;
    EXPECT_EQ(r, "") << name(s);
  }
#endif
}

// One step further than the graphs: cuDNN's engine heuristics for an H100 (its properties from
// tests/data/cudnn, no device), the configurations walked as a run walks them, and the execution
// plan finalized, forward and backward. A plan's last step loads its NVRTC-compiled kernels through
// the driver: with one here the plans build; without one the toolkit's stub libcuda stands in (it
// refuses every call), so cuDNN matches the graph, picks a deterministic engine and compiles its
// kernels, and only the load fails: the refusal must be that and nothing earlier.
#if defined(ZERO3D_HAVE_CUDNN)
void expect_h100_plans(std::initializer_list<AttnShape> shapes) {
  const std::string h100 =
      zero3d::read_text_file(std::string(ZERO3D_SOURCE_DIR) + "/tests/data/cudnn/h100_sxm.json", "an H100's cuDNN properties");
  // Loaded first, the stub is the libcuda.so.1 cuDNN's later dlopen finds (its SONAME).
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) && !dlopen(ZERO3D_CUDA_STUB, RTLD_NOW | RTLD_GLOBAL))
    GTEST_SKIP() << "no libcuda.so.1 and no stub at " << ZERO3D_CUDA_STUB;
  for (const AttnShape& s : shapes) {
    bool loaded = false;
    std::string taken;
    const std::string r = CudnnAttention::check_plans(s, h100, loaded, taken);
    if (!loaded) GTEST_SKIP() << "no cuDNN to load here: " << r;
    std::printf("%s: %s\n", name(s).c_str(), (r.empty() ? taken : r).c_str());
    if (r.empty()) continue;  // a driver here: both plans built
    for (const char* direction : {"forward: ", "backward: "}) {
      const size_t at = r.find(direction);
      const std::string part = at == std::string::npos ? "" : r.substr(at, r.find(" | ", at) - at);
      // Reached the load: an engine took the graph as deterministic and its kernels compiled.
      EXPECT_NE(part.find("EXECUTION_FAILED_CUDA_DRIVER"), std::string::npos) << name(s) << " " << direction << part;
      EXPECT_EQ(part.find("none offered"), std::string::npos) << name(s) << " " << part;
    }
  }
}
#endif

// The grouped-query graph (its dK and dV summed per group) is the fuller one; NVRTC compiles each
// engine configuration tried, about 2.5 s a shape here, so the suite runs this one.
TEST(CudnnAttentionGraphs, PlansBuildForAnH100WithoutIt) {
#if !defined(ZERO3D_HAVE_CUDNN)
  GTEST_SKIP() << "built without the CUDA backend or without cuDNN's headers";
#else
  expect_h100_plans({{4, 2048, 32, 8, 64}});  // a Llama ~1B: 32 query heads on 8 key/value heads
#endif
}

// The other model shapes, by hand: test_cudnn_graph --gtest_also_run_disabled_tests.
TEST(CudnnAttentionGraphs, DISABLED_PlansBuildForAnH100WithoutItEveryModel) {
#if !defined(ZERO3D_HAVE_CUDNN)
  GTEST_SKIP() << "built without the CUDA backend or without cuDNN's headers";
#else
  expect_h100_plans({{8, 1024, 16, 16, 64},   // GPT-2 350M
                     {8, 1024, 12, 12, 64},   // GPT-2 124M
                     {1, 256, 12, 4, 128}});  // head width 128
#endif
}

TEST(CudnnAttentionGraphs, RefusesWhatItsEnginesCannotTake) {
#if !defined(ZERO3D_HAVE_CUDNN)
  GTEST_SKIP() << "built without the CUDA backend or without cuDNN's headers";
#else
  bool loaded = false;
  const std::string width = CudnnAttention::check_graphs({2, 64, 4, 4, 12}, loaded);
  if (!loaded) GTEST_SKIP() << "no cuDNN to load here: " << width;
  EXPECT_NE(width.find("head width 12"), std::string::npos) << width;
  EXPECT_NE(CudnnAttention::check_graphs({2, 64, 4, 4, 512}, loaded).find("up to 256"), std::string::npos);
  // Head width 256: Hopper's backward takes it, an Ampere's (sm_80) or a Blackwell's (sm_100) not.
  EXPECT_EQ(CudnnAttention::check_graphs({2, 64, 4, 4, 256}, loaded, 90), "");
  EXPECT_NE(CudnnAttention::check_graphs({2, 64, 4, 4, 256}, loaded, 80).find("backward: head width 256"),
            std::string::npos);
  EXPECT_NE(CudnnAttention::check_graphs({2, 64, 4, 4, 256}, loaded, 100).find("up to 128 on sm_100"),
            std::string::npos);
  // One row: cuDNN's backward takes none; its forward none with grouped-query heads (a known issue of
  // its decode kernels, cuDNN 9.18.1's release notes), but multi-head it does.
  EXPECT_NE(CudnnAttention::check_graphs({2, 1, 4, 4, 64}, loaded).find("backward: a sequence of 1"), std::string::npos);
  EXPECT_NE(CudnnAttention::check_graphs({2, 1, 4, 2, 64}, loaded).find("forward: a sequence of 1 with grouped-query"),
            std::string::npos);
#endif
}

}  // namespace
