// zero3d bench kernels: every host kernel of a training step at one micro-batch's shapes, at every
// ISA level this CPU runs, each rate against its bound: FLOPs / that level's FMA peak for the
// attention, bytes / the copy bandwidth for the rest (the bytes and FLOPs each call must move or
// compute are the backend's own accounting, kernels/profile.h, as wall_clock_breakdown reports
// them). A level that gets slower shows here on any machine that runs it, not only on its own.
// Kernels whose math needs an exp per element (GELU's forward, SwiGLU, the cross-entropy's
// softmax) have a second roof, the level's exp rate: on SSE2 an exp costs more time than moving its
// 8 bytes, and copy bandwidth alone would call a kernel that runs at its arithmetic's speed slow.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "bench/kernels.h"
#include "bench/rates.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/math/rope.h"

namespace zero3d {

namespace {

struct Case {
  const char* name;
  std::function<void()> call;
  size_t exps = 0;  // the exps one call's math needs at the least: one per element it maps
};

// Elements per second of the level's exp (cpu::Kernels::exp) on the run's threads, over 2 x 256 KiB
// that stay in L2 (a call long enough that its parallel region costs nothing): the best 2 ms
// window in `seconds`, as the FMA peak is taken.
double best_exp_rate(const cpu::Kernels& k, double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  std::vector<float> x(size_t{1} << 16), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = -10.0f + 20.0f * static_cast<float>(i) / static_cast<float>(x.size());
  const auto start = Clock::now();
  double best = 0;
  do {
    const auto t0 = Clock::now();
    long calls = 0;
    do k.exp(y.data(), x.data(), x.size()), ++calls;
    while (since(t0) < 0.002);
    best = std::max(best, static_cast<double>(calls * x.size()) / since(t0));
  } while (since(start) < seconds);
  return best;
}

// One micro-batch's shapes: N = B x T tokens of width C, H heads, MLP width F = 4C, vocabulary V.
struct MicroBatch {
  int B, T, C, H, F, V, N;
  size_t NC, NF, NV;
  size_t block;  // one transformer block's parameters: Adam's n
  MicroBatch(const ModelConfig& m, int micro)
      : B(micro), T(m.seq_len), C(m.d_model), H(m.n_head), F(4 * C), V(m.vocab_size), N(B * T),
        NC(static_cast<size_t>(N) * C), NF(static_cast<size_t>(N) * F), NV(static_cast<size_t>(N) * V),
        block(12ull * C * C + 13ull * C) {}
};

// n floats in [lo, hi), a fixed pattern.
DeviceBuffer<float> filled(Backend& be, size_t n, float lo, float hi) {
  DeviceBuffer<float> b(be, n);
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = lo + (hi - lo) * static_cast<float>((i * 2654435761u) % 1000) * 1e-3f;
  be.copy_from_host(b.data(), h.data(), b.bytes());
  return b;
}

// N token ids in [0, V), a fixed pattern.
DeviceBuffer<int32_t> token_ids(Backend& be, int N, int V) {
  DeviceBuffer<int32_t> tokens(be, N);
  std::vector<int32_t> t(N);
  for (int i = 0; i < N; ++i) t[i] = static_cast<int32_t>((i * 2654435761u) % V);
  be.copy_from_host(tokens.data(), t.data(), tokens.bytes());
  return tokens;
}

// Every kernel's operands at one micro-batch's shapes, and the calls that time them. The calls
// point into this object: it neither copies nor moves.
struct KernelOperands : MicroBatch {
  Backend* be;
  DeviceBuffer<float> x, y, dy, w, b, dw, db, mean, rstd, h, hy, dh, dhx, hb, qkv, att, lse, dqkv, logits, dlogits, losses,
      rmax, sumexp, target_logit, wte, wpe, p, mo, vo, g, dx, rope_cs;
  DeviceBuffer<int32_t> tokens;
  DeviceBuffer<uint16_t> half;
  const math::AdamParams adam = math::adam_params(1e-4, 0.9, 0.95, 1e-8, 0.1, 10, true, true);

  KernelOperands(Backend& backend, const ModelConfig& m, int micro)
      : MicroBatch(m, micro), be(&backend), x(filled(backend, NC, -1, 1)), y(filled(backend, NC, -1, 1)),
        dy(filled(backend, NC, -1, 1)), w(filled(backend, C, 0.5, 1.5)), b(filled(backend, C, -0.1f, 0.1f)),
        dw(filled(backend, C, 0, 0)), db(filled(backend, C, 0, 0)), mean(filled(backend, N, 0, 0)),
        rstd(filled(backend, N, 0, 0)), h(filled(backend, NF, -3, 3)), hy(backend, NF), dh(filled(backend, NF, -1, 1)),
        dhx(filled(backend, NF, 0, 0)), hb(filled(backend, F, 0, 0)), qkv(filled(backend, 3 * NC, -1, 1)),
        att(filled(backend, NC, 0, 0)), lse(filled(backend, static_cast<size_t>(B) * H * T, 0, 0)),
        dqkv(filled(backend, 3 * NC, 0, 0)), logits(filled(backend, NV, -4, 4)), dlogits(filled(backend, NV, 0, 0)),
        losses(filled(backend, N, 0, 0)), rmax(filled(backend, N, 0, 0)), sumexp(filled(backend, N, 0, 0)),
        target_logit(filled(backend, N, 0, 0)), wte(filled(backend, static_cast<size_t>(V) * C, -1, 1)),
        wpe(filled(backend, static_cast<size_t>(T) * C, -1, 1)), p(filled(backend, block, -1, 1)),
        mo(filled(backend, block, -1e-3f, 1e-3f)), vo(filled(backend, block, 0, 1e-6f)),
        g(filled(backend, block, -1e-2f, 1e-2f)), dx(filled(backend, NC, 0, 0)),
        rope_cs(backend, math::rope_table(T, C / H, 10000.0).size()), tokens(token_ids(backend, N, V)),
        half(backend, block) {
    const std::vector<float> cs = math::rope_table(T, C / H, 10000.0);
    be->copy_from_host(rope_cs.data(), cs.data(), rope_cs.bytes());
    be->attention_forward(att.data(), lse.data(), qkv.data(), B, T, H, H, C);  // backward reads its lse
    be->gelu_forward(hy.data(), h.data(), NF);                                   // and GELU's its output
    be->vocab_row_max(rmax.data(), logits.data(), N, V, V);
    be->vocab_sumexp(sumexp.data(), target_logit.data(), logits.data(), rmax.data(), tokens.data(), 0, N, V, V);
  }
  KernelOperands(const KernelOperands&) = delete;
  KernelOperands& operator=(const KernelOperands&) = delete;

  std::vector<Case> cases() {
    return {
        {"attention_forward", [this] { be->attention_forward(att.data(), lse.data(), qkv.data(), B, T, H, H, C); }},
        {"attention_backward",
         [this] { be->attention_backward(dqkv.data(), y.data(), att.data(), lse.data(), qkv.data(), B, T, H, H, C); }},
        {"layernorm_forward",
         [this] { be->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C); }},
        {"layernorm_backward", [this] {
           be->layernorm_backward(dy.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), mean.data(),
                                  rstd.data(), N, C);
         }},
        // The Llama family's: RMSNorm, RoPE on the queries and keys of qkv (in place: a rotation keeps
        // the values bounded), SwiGLU on h as [gate | up] of F / 2 each.
        {"rmsnorm_forward", [this] { be->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f); }},
        {"rmsnorm_backward", [this] {
           be->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
         }},
        {"rope_forward", [this] { be->rope(qkv.data(), rope_cs.data(), N, T, 2 * H, C / H, 3L * C, false); }},
        {"rope_backward", [this] { be->rope(dqkv.data(), rope_cs.data(), N, T, 2 * H, C / H, 3L * C, true); }},
        {"swiglu_forward", [this] { be->swiglu_forward(dhx.data(), h.data(), N, F / 2); }, NF / 2},
        {"swiglu_backward", [this] { be->swiglu_backward(dhx.data(), h.data(), dh.data(), N, F / 2); }, NF / 2},
        {"gelu_forward", [this] { be->gelu_forward(dh.data(), h.data(), NF); }, NF},
        // Out of place: in place, each call would scale dh by gelu' again, down into subnormals. No
        // exp: the sigmoid comes from the forward's output.
        {"gelu_backward (+bias)",
         [this] { be->gelu_backward(dhx.data(), hb.data(), h.data(), hy.data(), dh.data(), N, F); }},
        {"bias_backward", [this] { be->bias_backward(db.data(), dy.data(), N, C); }},
        {"accumulate", [this] { be->accumulate(y.data(), x.data(), NC); }},
        {"embedding_forward",
         [this] { be->embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), N, T, C, 0, V); }},
        {"embedding_backward",
         [this] { be->embedding_backward(wte.data(), wpe.data(), dy.data(), tokens.data(), N, T, C, 0, V); }},
        {"crossentropy",
         [this] { be->crossentropy(losses.data(), dlogits.data(), logits.data(), tokens.data(), N, V, V, 1e-3f); }, NV},
        {"vocab_sumexp", [this] {
           be->vocab_sumexp(sumexp.data(), target_logit.data(), logits.data(), rmax.data(), tokens.data(), 0, N, V, V);
         }, NV},
        {"vocab_crossentropy_grad", [this] {
           be->vocab_crossentropy_grad(dlogits.data(), logits.data(), rmax.data(), sumexp.data(), tokens.data(), 0, N,
                                       V, V, 1e-3f);
         }, NV},
        {"adam_step", [this] { be->adam_step(p.data(), mo.data(), vo.data(), g.data(), block, adam, {}); }},
        // with the bf16 weights out in the same pass (a mixed run's update)
        {"adam_step_bf16",
         [this] { be->adam_step(p.data(), mo.data(), vo.data(), g.data(), block, adam, {half.data(), false}); }},
        {"scale", [this] { be->scale(g.data(), 1.0f, block); }},
        {"cast_to_bf16", [this] { be->cast_to_bf16(half.data(), p.data(), block); }},
        {"accumulate_bf16", [this] { be->accumulate_bf16(half.data(), g.data(), block); }},
        {"sum_squares", [this] { (void)be->sum_squares(g.data(), block); }},
    };
  }
};

// The levels asked for (every level this CPU runs when none is): a level it does not run is the
// user's mistake.
std::vector<const cpu::Kernels*> levels_to_bench(const std::vector<std::string>& levels) {
  std::vector<const cpu::Kernels*> ks;
  for (const std::string& l : levels) {
    const cpu::Kernels* k = cpu::by_name(l);
    if (!k)
      throw UserError(strprintf("bench kernels: this CPU does not run level '%s'; it runs %s", l.c_str(),
                                cpu::runnable_levels().c_str()));
    ks.push_back(k);
  }
  if (ks.empty()) ks = cpu::runnable();
  return ks;
}

// The table: a column per level, a row per kernel, and each level's bounds.
struct KernelTable {
  std::vector<std::string> header = {"kernel"};
  std::vector<std::vector<std::string>> rows;
  std::vector<double> peaks, exp_rates;  // per level: FMA peak (FLOP/s), exp rate (1/s)
  double copy_bw = 0;                    // bytes/s, measured once (the first level's backend)
};

// One level's column: its bounds, then every kernel's rate against the binding one.
void bench_level(const cpu::Kernels& k, const ModelConfig& m, int micro, double seconds, KernelTable& t) {
  HostOptions o;
  o.isa = k.isa;
  std::unique_ptr<Backend> be = make_host_backend(o);
  if (t.copy_bw == 0) t.copy_bw = measure_copy_bandwidth(*be, seconds);
  const double peak = best_fma_peak(seconds, 0.002, &k);
  t.peaks.push_back(peak);
  const double exp_rate = best_exp_rate(k, seconds);
  t.exp_rates.push_back(exp_rate);
  t.header.push_back(k.isa);

  KernelOperands ops(*be, m, micro);
  const std::vector<Case> cases = ops.cases();
  be->profile()->on = true;
  if (t.rows.empty()) t.rows.resize(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    const OpStat st = time_ops(*be, cases[c].call, seconds);
    const bool compute = st.flops > 0;
    // The slower roof binds: moving the bytes, or (marked *) computing the exps.
    const double copy_s = st.bytes / t.copy_bw, exp_s = static_cast<double>(cases[c].exps * st.calls) / exp_rate;
    const double rate = (compute ? st.flops : st.bytes) / st.seconds;
    const double bound = compute ? peak : st.bytes / std::max(copy_s, exp_s);
    if (t.rows[c].empty()) t.rows[c].push_back(cases[c].name);
    t.rows[c].push_back(strprintf("%7.1f %s %4.0f%%%s", rate / 1e9, compute ? "GF/s" : "GB/s", 100 * rate / bound,
                                  exp_s > copy_s ? "*" : " "));
  }
}

void log_kernel_table(const KernelTable& t, const std::vector<const cpu::Kernels*>& ks, const MicroBatch& mb,
                      const std::string& config) {
  std::string peaks_line, exps_line;
  for (size_t i = 0; i < ks.size(); ++i) {
    peaks_line += strprintf("%s%s %.1f", i ? ", " : "", ks[i]->isa, t.peaks[i] / 1e9);
    exps_line += strprintf("%s%s %.2f", i ? ", " : "", ks[i]->isa, t.exp_rates[i] / 1e9);
  }
  log_info("# host kernels, one micro-batch of %s: %d x %d tokens, d_model %d, %d heads, vocab %d; Adam and the casts "
           "over one block's %zu parameters; %d thread(s)",
           config.c_str(), mb.B, mb.T, mb.C, mb.H, mb.V, mb.block, cpu::threads());
  log_info("# bounds: copy bandwidth %.1f GB/s (64 MiB copies); FMA peak (GFLOP/s) %s; exp rate (G/s, in L2) %s. "
           "Each cell: rate, %% of its bound (above 100%%: the data stayed in cache; *: bound by one exp per element "
           "at the exp rate, which is slower there than the copy)",
           t.copy_bw / 1e9, peaks_line.c_str(), exps_line.c_str());
  std::string line = strprintf("%-24s", t.header[0].c_str());
  for (size_t i = 1; i < t.header.size(); ++i) line += strprintf(" %19s", t.header[i].c_str());
  log_info("%s", line.c_str());
  for (const auto& r : t.rows) {
    line = strprintf("%-24s", r[0].c_str());
    for (size_t i = 1; i < r.size(); ++i) line += strprintf(" %19s", r[i].c_str());
    log_info("%s", line.c_str());
  }
}

}  // namespace

void bench_kernels(const ModelConfig& m, int micro, const std::string& config, double seconds,
                   const std::vector<std::string>& levels) {
  const std::vector<const cpu::Kernels*> ks = levels_to_bench(levels);
  KernelTable table;
  for (const cpu::Kernels* k : ks) bench_level(*k, m, micro, seconds, table);
  log_kernel_table(table, ks, MicroBatch(m, micro), config);
}

void bench_backend_kernels(Backend& be, const PeakFlops& peak, const ModelConfig& m, int micro,
                           const std::string& config, double seconds) {
  HostOptions counting;
  counting.count_only = true;
  const std::unique_ptr<Backend> counter = make_host_backend(counting);
  KernelOperands counted(*counter, m, micro), ops(be, m, micro);
  const std::vector<Case> count_cases = counted.cases(), cases = ops.cases();
  const double copy_bw = measure_copy_bandwidth(be, seconds);
  const MicroBatch& mb = ops;
  log_info("# kernels on %s, one micro-batch of %s: %d x %d tokens, d_model %d, %d heads, vocab %d; Adam and the "
           "casts over one block's %zu parameters",
           be.describe().c_str(), config.c_str(), mb.B, mb.T, mb.C, mb.H, mb.V, mb.block);
  log_info("# bounds: copy bandwidth %.1f GB/s (64 MiB copies through the backend); peak %.1f TFLOP/s (%s). Each "
           "row: time per call, rate, %% of its bound (FLOPs: the peak; bytes: the copy bandwidth); what a call must "
           "move or compute is the host's accounting of the same call",
           copy_bw / 1e9, peak.flops / 1e12, peak.source.c_str());
  log_info("%-24s %12s %16s %7s", "kernel", "us/call", "rate", "bound");
  counter->profile()->on = true;
  for (size_t c = 0; c < cases.size(); ++c) {
    const OpStat one = time_ops(*counter, count_cases[c].call, 0);  // counts one call (and its warm-up)
    const double s = time_calls(be, cases[c].call, seconds);
    const bool compute = one.flops > 0;
    const double rate = (compute ? one.flops : one.bytes) / s, bound = compute ? peak.flops : copy_bw;
    log_info("%-24s %12.1f %10.2f %s %6.1f%%", cases[c].name, s * 1e6, rate / (compute ? 1e12 : 1e9),
             compute ? "TF/s" : "GB/s", bound > 0 ? 100 * rate / bound : 0.0);
  }
  // Every GEMM of the micro-batch (C = op(A) op(B), row-major, leading dimensions as stored).
  const std::vector<GemmShape> shapes = model_gemm_shapes(m, micro, 1);
  size_t most = 0;
  for (const GemmShape& g : shapes)
    most = std::max({most, static_cast<size_t>(g.m) * g.k, static_cast<size_t>(g.k) * g.n, static_cast<size_t>(g.m) * g.n});
  const DeviceBuffer<float> a = filled(be, most, -1, 1), b = filled(be, most, -1, 1);
  DeviceBuffer<float> out(be, most);
  log_info("%-24s %12s %16s %7s  (%s)", "gemm", "us/call", "rate", "of peak", be.describe_gemm().c_str());
  for (const GemmShape& g : shapes) {
    const double s = time_gemm(be, g, a.data(), b.data(), out.data(), seconds);
    const double rate = 2.0 * g.m * g.n * g.k / s;
    log_info("%-24s %12.1f %10.2f TF/s %6.1f%%", (g.name + strprintf(" %dx%dx%d", g.m, g.n, g.k)).c_str(), s * 1e6,
             rate / 1e12, peak.flops > 0 ? 100 * rate / peak.flops : 0.0);
  }
}

}  // namespace zero3d
