#include "bench/gemm.h"

#include <algorithm>
#include <array>
#include <memory>

#include "bench/rates.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"

namespace zero3d {

namespace {

// A GEMM table's cell: GFLOP/s, or '-' where the library has no such GEMM here.
std::string gemm_column(double rate) { return rate > 0 ? strprintf("%9.1f", rate / 1e9) : strprintf("%9s", "-"); }

// The columns of bench gemm: what training runs (compute.gemm=auto), oneDNN, the CBLAS linked in,
// and oneDNN's bf16 GEMM (nullptr where oneDNN has none).
struct GemmBackends {
  std::unique_ptr<Backend> zero3d, onednn, cblas, bf16;
  std::array<Backend*, 4> columns() const { return {zero3d.get(), onednn.get(), cblas.get(), bf16.get()}; }
};

GemmBackends make_gemm_backends() {
  GemmBackends be;
  HostOptions o;
  be.zero3d = make_host_backend(o);
  o.gemm = "onednn";
  be.onednn = make_host_backend(o);
  o.gemm = "cblas";
  be.cblas = make_host_backend(o);
  o.gemm = "onednn";
  o.bf16_gemm = true;
  // oneDNN 2.6 has no bf16 GEMM below AVX-512: there the column is '-'.
  be.bf16 = onednn_runs_bf16() ? make_host_backend(o) : nullptr;
  return be;
}

// The machine and the libraries: the CPU and its ISA levels, the threads, the GEMM libraries,
// zero3d's plan and why, and what the bf16 column means here.
void log_gemm_setup(const GemmBackends& be, const GemmPlan& plan, const JobInfo& job, int ranks) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const bool native_bf16 = onednn_has_bf16();
  log_info("# CPU: %s (%s family %d model %d): %s%s%s; host loops: %s; %d thread(s) per rank (%s), %d rank(s) "
           "measuring at once",
           f.model.c_str(), f.vendor.c_str(), f.family, f.model_number, f.level().c_str(),
           f.avx512_bf16 ? ", avx512_bf16" : "", f.amx_bf16 ? ", amx_bf16" : "", cpu::select().isa, job.threads,
           job.threads_source.c_str(), ranks);
  log_info("# GEMM libraries: %s (%s); CBLAS: %s", onednn_version().c_str(), onednn_isa().c_str(),
           cblas_name().c_str());
  log_info("# zero3d's plan (compute.gemm=auto): %s; why: %s", be.zero3d->describe_gemm().c_str(), plan.why.c_str());
  if (const std::string w = cblas_core_fallback(); !w.empty()) log_info("# note: %s", w.c_str());
  if (!be.bf16)
    log_info("# note: oneDNN has no bf16 GEMM at %s: the bf16 column is '-' (training with bf16 runs fp32 GEMMs "
             "on the widened weights here)", onednn_isa().c_str());
  else if (!native_bf16)
    log_info("# note: oneDNN has no native bf16 GEMM at %s: the bf16 column is its emulation", onednn_isa().c_str());
}

// The FMA peak of the rank's threads, then square GEMMs of each size through each library.
void bench_square_gemms(const GemmBackends& be, const std::vector<int>& sizes, double seconds, const JobInfo& job) {
  double peak = 0;
#pragma omp parallel reduction(+ : peak)
  peak += best_fma_peak(seconds / 2);  // each thread its best window
  log_info("# FMA peak (%s, %d thread(s)): %.1f GFLOP/s", cpu::select().isa, job.threads, peak / 1e9);
  log_info("%8s %12s %12s %9s %9s %9s %7s", "n", "ms/call", "GFLOP/s", "onednn", "cblas", "bf16", "%peak");
  for (int n : sizes) {
    const GemmRate z = measure_gemm(*be.zero3d, n, n, n, seconds);
    const double r1 = measure_gemm(*be.onednn, n, n, n, seconds / 2).flops_per_s;
    const double r2 = measure_gemm(*be.cblas, n, n, n, seconds / 2).flops_per_s;
    const double r3 = be.bf16 ? measure_gemm(*be.bf16, n, n, n, seconds / 2).flops_per_s : 0;
    log_info("%8d %12.3f %12.1f %9.1f %9.1f %s %6.1f%%", n, z.seconds_per_call * 1e3, z.flops_per_s / 1e9, r1 / 1e9,
             r2 / 1e9, gemm_column(r3).c_str(), 100 * z.flops_per_s / peak);
  }
}

// One GEMM shape through each column, calls for at least t seconds each: rate[b] in FLOP/s (0: no
// such library), secs[b] += its seconds per call.
void time_gemm_shape(const GemmBackends& be, const GemmShape& s, double t, double rate[4], double secs[4]) {
  Backend& z = *be.zero3d;  // its buffers serve every library: all are host memory
  const size_t sa = static_cast<size_t>(s.m) * s.k, sb = static_cast<size_t>(s.k) * s.n;
  DeviceBuffer<float> A(z, sa), B(z, sb), C(z, static_cast<size_t>(s.m) * s.n);
  std::vector<float> h(std::max(sa, sb));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  z.copy_from_host(A.data(), h.data(), A.bytes());
  z.copy_from_host(B.data(), h.data(), B.bytes());
  const std::array<Backend*, 4> bes = be.columns();
  for (int b = 0; b < 4; ++b) {
    if (!bes[b]) {
      rate[b] = 0;
      continue;
    }
    const double sec = time_gemm(*bes[b], s, A.data(), B.data(), C.data(), t);
    rate[b] = 2.0 * s.m * s.n * s.k / sec;
    secs[b] += sec;
  }
}

// The fused attention of one layer: model FLOPs (q k^T and p v over the causal half) per second.
void bench_attention(Backend& be, const ModelConfig& m, int micro, int tp, double t) {
  const int H = m.n_head / tp, Hkv = m.kv_heads() / tp, A = H * m.head_dim(), T = m.seq_len, N = micro * m.seq_len;
  const size_t qkv_floats = static_cast<size_t>(N) * (H + 2 * Hkv) * m.head_dim();
  DeviceBuffer<float> qkv(be, qkv_floats), out(be, static_cast<size_t>(N) * A),
      lse(be, static_cast<size_t>(micro) * H * T), dqkv(be, qkv_floats);
  std::vector<float> h(qkv.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  be.copy_from_host(qkv.data(), h.data(), qkv.bytes());
  const double fwd_flops = 4.0 * micro * A * (T * (T + 1.0) / 2);
  const double tf = time_calls(be, [&] { be.attention_forward(out.data(), lse.data(), qkv.data(), micro, T, H, Hkv, A); }, t);
  const double tb = time_calls(be, [&] {
    be.attention_backward(dqkv.data(), out.data(), out.data(), lse.data(), qkv.data(), micro, T, H, Hkv, A);
  }, t);
  log_info("%-14s %20s %9.1f  (fused, causal: %.2f ms)", "attention fwd", "", fwd_flops / tf / 1e9, tf * 1e3);
  log_info("%-14s %20s %9.1f  (fused, causal, model FLOPs = 2x forward: %.2f ms)", "attention bwd", "",
           2 * fwd_flops / tb / 1e9, tb * 1e3);
}

// Every GEMM of one training micro-batch of `cfg`'s model through each column, the total by time,
// and the fused attention.
void bench_model_gemms(const GemmBackends& be, const GemmPlan& plan, const Config& cfg, const std::string& config,
                       double seconds) {
  const ModelConfig& m = cfg.model;
  const int micro = cfg.train_micro_batch_size_per_gpu, tp = cfg.tp_size, N = micro * m.seq_len;
  log_info("# one micro-batch of %s: micro-batch %d x seq %d = %d tokens, d_model %d, vocab %d, tp %d (GFLOP/s)",
           config.c_str(), micro, m.seq_len, N, m.d_model, m.vocab_size, tp);
  log_info("%-14s %6s %6s %6s %9s %9s %9s %9s  %s", "gemm", "m", "n", "k", "zero3d", "onednn", "cblas", "bf16",
           "zero3d runs");
  const double t = seconds / 4;
  double flops = 0, secs[4] = {0, 0, 0, 0};
  for (const GemmShape& s : model_gemm_shapes(m, micro, tp)) {
    double rate[4];
    time_gemm_shape(be, s, t, rate, secs);
    flops += 2.0 * s.m * s.n * s.k;
    const GemmRole role = s.ta ? GemmRole::weight_grad : s.tb ? GemmRole::forward : GemmRole::input_grad;
    log_info("%-14s %6d %6d %6d %9.1f %9.1f %9.1f %s  %s", s.name.c_str(), s.m, s.n, s.k, rate[0] / 1e9, rate[1] / 1e9,
             rate[2] / 1e9, gemm_column(rate[3]).c_str(), gemm_library_name(plan.for_role(role)));
  }
  log_info("%-14s %20s %9.1f %9.1f %9.1f %s", "all (by time)", "", flops / secs[0] / 1e9, flops / secs[1] / 1e9,
           flops / secs[2] / 1e9, gemm_column(be.bf16 ? flops / secs[3] : 0).c_str());
  bench_attention(*be.zero3d, m, micro, tp, t);
}

}  // namespace

void bench_host_gemm(const std::vector<int>& sizes, double seconds, const Config* cfg, const std::string& config,
                     const JobInfo& job, int ranks) {
  const GemmBackends be = make_gemm_backends();
  const GemmPlan plan = make_gemm_plan("auto", false);
  log_gemm_setup(be, plan, job, ranks);
  bench_square_gemms(be, sizes, seconds, job);
  if (cfg) bench_model_gemms(be, plan, *cfg, config, seconds);
}

}  // namespace zero3d
