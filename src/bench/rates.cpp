#include "bench/rates.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/check.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"

namespace zero3d {

double time_calls(Backend& be, const std::function<void()>& call, double min_seconds) {
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
  return elapsed / calls;
}

OpStat time_ops(Backend& be, const std::function<void()>& call, double seconds) {
  OpProfile& prof = *be.profile();
  call();
  prof.ops.clear();
  OpStat total;
  do {
    call();
    total = OpStat{};
    for (const auto& [name, st] : prof.ops) {
      total.calls = std::max(total.calls, st.calls);
      total.seconds += st.seconds;
      total.bytes += st.bytes;
      total.flops += st.flops;
    }
  } while (total.seconds < seconds);
  return total;
}

double time_gemm(Backend& be, const GemmShape& s, const float* A, const float* B, float* C, double min_seconds) {
  const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  return time_calls(be, [&] {
    be.gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, A, lda, B, ldb, static_cast<float>(s.beta), C, s.n);
  }, min_seconds);
}

GemmRate measure_gemm(Backend& be, int m, int n, int k, double min_seconds) {
  DeviceBuffer<float> a(be, static_cast<size_t>(m) * k), b(be, static_cast<size_t>(n) * k),
      c(be, static_cast<size_t>(m) * n);
  std::vector<float> host(std::max(a.size(), b.size()));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  be.copy_from_host(a.data(), host.data(), a.bytes());
  be.copy_from_host(b.data(), host.data(), b.bytes());
  GemmRate r{m, n, k, 0, 0};
  r.seconds_per_call = time_gemm(be, GemmShape{"", false, true, m, n, k}, a.data(), b.data(), c.data(), min_seconds);
  r.flops_per_s = 2.0 * m * n * k / r.seconds_per_call;
  return r;
}

double measure_copy_bandwidth(Backend& be, double min_seconds) {
  const size_t n = size_t{64} << 20;
  DeviceBuffer<char> a(be, n), b(be, n);
  return 2.0 * n / time_calls(be, [&] { be.copy(b.data(), a.data(), n); }, min_seconds);
}

double best_fma_peak(double seconds, double window_s, const cpu::Kernels* level) {
  const cpu::Kernels& k = level ? *level : cpu::select();
  const auto t0 = std::chrono::steady_clock::now();
  double best = 0;
  do best = std::max(best, k.fma_peak(window_s));
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds);
  return best;
}

// The shapes of the model's linear layers on one tp rank (model/gpt.cpp's block_tensors): grouped
// key/value heads narrow qkv, SwiGLU's fc holds the gate and the up projection, the LM head has
// the padded vocabulary's rows.
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& m, int micro, int tp) {
  const int N = micro * m.seq_len, C = m.d_model, Q = m.n_head * m.head_dim() / tp, KV = m.kv_heads() * m.head_dim() / tp,
            F = m.ffn_hidden() / tp, V = m.padded_vocab() / tp;
  struct Layer {
    const char* name;
    int in, out;
  };
  const Layer layers[] = {{"qkv", C, Q + 2 * KV}, {"attn proj", Q, C}, {"mlp fc", C, m.swiglu() ? 2 * F : F},
                          {"mlp proj", F, C}, {"lm head", C, V}};
  std::vector<GemmShape> shapes;
  for (const Layer& l : layers) {
    shapes.push_back({std::string(l.name) + " fwd", false, true, N, l.out, l.in, 0});
    shapes.push_back({std::string(l.name) + " dx", false, false, N, l.in, l.out, 0});
    shapes.push_back({std::string(l.name) + " dW", true, false, l.out, l.in, N, 1});
  }
  return shapes;
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

PeakFlops mfu_peak(Backend& be, ProcessGroup* world, int compute_cores) {
  PeakFlops p;
  if (be.kind() == BackendKind::cuda) {
    p.flops = known_accelerator_peak(be.describe());
    p.source = "known bf16 peak of " + be.describe();
  }
  if (p.flops > 0 || !world) return p;  // a dry run: measured when the run starts
  if (be.kind() == BackendKind::host) {
    const double core = world->all_reduce_max(best_fma_peak(0.2));
    p.flops = core * compute_cores / world->size();
    p.source = strprintf("FMA peak %s x %d cores: %.1f GFLOP/s per core (the best 2 ms window of any rank), "
                         "%.1f GFLOP/s in all",
                         cpu::select().isa, compute_cores, core / 1e9, core * compute_cores / 1e9);
    return p;
  }
  // An accelerator without a known peak: its sgemm rate, rank 0's for every rank.
  const GemmRate r = measure_gemm(be, 1024, 1024, 1024, 1.0);
  p.flops = r.flops_per_s;
  p.source = strprintf("measured sgemm 1024^3 on rank 0 (%.1f GFLOP/s)", r.flops_per_s / 1e9);
  world->broadcast(host_mem(&p.flops), sizeof(double), 0);
  return p;
}

double measure_collective_write(MPI_Comm comm, const std::string& dir, uint64_t bytes) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::string path = dir + "/zero3d-bench-io.tmp";
  const uint64_t per = bytes / size, chunk = 16 << 20;
  std::vector<char> buf(chunk, static_cast<char>(rank + 1));
  MPI_File f;
  MPI_CHECK(MPI_File_open(comm, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &f));
  MPI_CHECK(MPI_Barrier(comm));
  const double t0 = MPI_Wtime();
  const uint64_t calls = (per + chunk - 1) / chunk;  // the same number of collective calls on every rank
  for (uint64_t c = 0; c < calls; ++c) {
    const uint64_t n = std::min(chunk, per - c * chunk);
    MPI_CHECK(MPI_File_write_at_all(f, static_cast<MPI_Offset>(rank * per + c * chunk), buf.data(), static_cast<int>(n),
                                    MPI_BYTE, MPI_STATUS_IGNORE));
  }
  MPI_CHECK(MPI_File_sync(f));
  double t = MPI_Wtime() - t0;
  MPI_CHECK(MPI_File_close(&f));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm));
  if (rank == 0) std::remove(path.c_str());
  return t;
}

}  // namespace zero3d
