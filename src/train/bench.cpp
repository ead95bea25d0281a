#include "train/bench.h"

#include <chrono>
#include <vector>

namespace zero3d {

GemmRate measure_gemm(Backend& be, int m, int n, int k, double min_seconds) {
  DeviceBuffer<float> a(be, static_cast<size_t>(m) * k), b(be, static_cast<size_t>(n) * k),
      c(be, static_cast<size_t>(m) * n);
  std::vector<float> host(std::max(a.size(), b.size()));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  be.copy_from_host(a.data(), host.data(), a.bytes());
  be.copy_from_host(b.data(), host.data(), b.bytes());
  auto call = [&] { be.gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n); };
  call();
  be.synchronize();
  using clock = std::chrono::steady_clock;
  int calls = 0;
  auto t0 = clock::now();
  double elapsed = 0;
  do {
    call();
    ++calls;
    be.synchronize();
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < min_seconds);
  GemmRate r{m, n, k, elapsed / calls, 0};
  r.flops_per_s = 2.0 * m * n * k / r.seconds_per_call;
  return r;
}

double known_accelerator_peak(const std::string& name) {
  struct Peak {
    const char* match;
    double flops;
  };
  // Dense bf16 tensor-core peaks (vendor data sheets; SXM parts).
  static const Peak peaks[] = {{"H200", 989e12}, {"H100 PCIe", 756e12}, {"H100", 989e12}, {"A100", 312e12}};
  for (const auto& p : peaks)
    if (name.find(p.match) != std::string::npos) return p.flops;
  return 0.0;
}

}  // namespace zero3d
