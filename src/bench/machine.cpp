#include "bench/machine.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <functional>
#include <tuple>
#include <vector>

#include "bench/comm.h"
#include "bench/rates.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "kernels/math/adamw.h"
#include "parallel/comm.h"
#include "storage/swap_file.h"

namespace zero3d {

namespace {

const MachineRates::Link* find_link(const std::map<std::string, MachineRates::Link>& links, const std::string& op) {
  auto it = links.find(op);
  if (it == links.end()) it = links.find("all_reduce");
  return it == links.end() || it->second.busbw <= 0 ? nullptr : &it->second;
}

}  // namespace

double MachineRates::collective_seconds(const std::string& op, double msg_bytes, int size, int per_node) const {
  if (size <= 1) return 0;
  const Link* in = find_link(collectives, op);
  const Link* out = size > per_node ? find_link(inter_node.collectives, op) : nullptr;
  if (!out) return in ? in->latency_s + msg_bytes * bus_share(op, size) / in->busbw : 0;
  double busbw = out->busbw * std::min(1.0, static_cast<double>(per_node) / std::max(1, ranks_per_node));
  if (in) busbw = std::min(busbw, in->busbw);
  return out->latency_s + msg_bytes * bus_share(op, size) / busbw;
}

namespace {

// The slowest rank's value: every rank measured at once, the job runs at the pace of the slowest.
double slowest(ProcessGroup& g, double rate) { return -g.all_reduce_max(-rate); }

// `call`'s ops as the backend's profile counts them (time_ops), the profile on meanwhile.
OpStat profiled(Backend& be, const std::function<void()>& call, double seconds) {
  OpProfile* prof = be.profile();
  Z3D_ASSERT(prof != nullptr, "bench machine: the backend keeps no profile");
  const bool was = prof->on;
  prof->on = true;
  const OpStat st = time_ops(be, call, seconds);
  prof->on = was;
  prof->ops.clear();
  return st;
}

// FLOP/s of the fused causal attention forward and backward at a GPT-2-like shape (8 x 256 tokens,
// 8 heads of 64).

double measure_attention(Backend& be, double seconds) {
  const int B = 8, T = 256, H = 8, A = 512;
  DeviceBuffer<float> qkv(be, size_t{3} * B * T * A), out(be, size_t{1} * B * T * A), lse(be, size_t{1} * B * H * T),
      dout(be, size_t{1} * B * T * A), dqkv(be, size_t{3} * B * T * A);
  const OpStat st = profiled(
      be,
      [&] {
        be.attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, A);
        be.attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), B, T, H, H, A);
        be.synchronize();
      },
      seconds);
  return st.flops / st.seconds;
}

// Bytes/s of the AdamW update over 4M parameters (as the backend's profile counts them: 28 a parameter).
double measure_adam(Backend& be, double seconds) {
  const size_t n = size_t{1} << 22;
  DeviceBuffer<float> p(be, n), m(be, n), v(be, n), g(be, n);
  const math::AdamParams a = math::adam_params(1e-4, 0.9, 0.95, 1e-8, 0.1, 10, true, true);
  const OpStat st = profiled(
      be,
      [&] {
        be.adam_step(p.data(), m.data(), v.data(), g.data(), n, a, {});
        be.synchronize();
      },
      seconds);
  return st.bytes / st.seconds;
}

}  // namespace

namespace {

// Each collective's latency and bus bandwidth over g, fit from 64 KiB and 32 MiB, the best of three
// (a rank descheduled once is not the link's rate), in about `seconds` in all. Collective over g.
std::map<std::string, MachineRates::Link> fit_links(ProcessGroup& g, double seconds) {
  std::map<std::string, MachineRates::Link> links;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    const double small = 64 << 10, large = 32 << 20;
    double t1 = 1e30, t2 = 1e30;
    for (int k = 0; k < 3; ++k) {
      t1 = std::min(t1, time_collective(g, op, static_cast<size_t>(small), seconds / 18));
      t2 = std::min(t2, time_collective(g, op, static_cast<size_t>(large), seconds / 18));
    }
    const double share = bus_share(op, g.size());
    MachineRates::Link l;
    l.busbw = share * (large - small) / std::max(t2 - t1, 1e-9);
    l.latency_s = std::max(0.0, t1 - share * small / l.busbw);
    links[op] = l;
  }
  return links;
}

// Bytes/s a rank writes to and then reads from a swap file of `bytes` under nvme_path, as offload
// to nvme drives it (aio's defaults, a buffer of the host backend's as the optimizer's records),
// every rank at once: the slowest rank's, the better of two. Collective over g: a failure on one
// rank ends every rank's measurement with it.
std::pair<double, double> measure_swap(ProcessGroup& g, const std::string& nvme_path, uint64_t bytes) {
  const std::unique_ptr<Backend> host = make_host_backend();
  DeviceBuffer<char> buf(*host, bytes);
  for (size_t i = 0; i < bytes; i += 4096) buf.data()[i] = static_cast<char>(i >> 12);  // not all zeros
  std::unique_ptr<SwapFile> f;
  g.agree([&] {
    std::error_code ec;
    const std::string dir = swap_dir(nvme_path, "bench-machine");
    std::filesystem::create_directories(dir, ec);
    const AioConfig aio;
    try {
      f = std::make_unique<SwapFile>(strprintf("%s/rank%d.%d.bench", dir.c_str(), g.rank(), static_cast<int>(getpid())),
                                     bytes, SwapFile::Options{static_cast<size_t>(aio.block_size), aio.thread_count});
    } catch (const IoError& e) {
      throw UserError(strprintf("bench machine --nvme-path: %s", e.what()));
    }
  });
  auto timed = [&](bool write) {  // every rank at once; the slowest rank's seconds
    g.barrier();
    double s = 0;
    g.agree([&] {
      const Clock::time_point t0 = Clock::now();
      try {
        f->wait(write ? f->write(0, buf.data(), bytes) : f->read(0, buf.data(), bytes));
      } catch (const IoError& e) {
        throw UserError(strprintf("bench machine --nvme-path: %s", e.what()));
      }
      s = seconds_since(t0);
    });
    return g.all_reduce_max(s);
  };
  double write_s = 1e30, read_s = 1e30;
  for (int k = 0; k < 2; ++k) write_s = std::min(write_s, timed(true)), read_s = std::min(read_s, timed(false));
  return {bytes / read_s, bytes / write_s};
}

}  // namespace

MachineRates measure_machine(Backend& be, double seconds, const std::string& nvme_path, uint64_t swap_bytes) {
  auto world = ProcessGroup::world();
  auto node = world->split_node("node");  // (nodes of ZERO3D_RANKS_PER_NODE consecutive ranks in tests)
  const double here = node->size();
  if (world->all_reduce_max(here) != -world->all_reduce_max(-here))
    throw UserError("zero3d bench machine: every node needs the same number of ranks");
  world->agree([&] {  // before the measurements, not after them
    std::error_code ec;
    if (!nvme_path.empty() && !std::filesystem::is_directory(nvme_path, ec))
      throw UserError(strprintf("bench machine --nvme-path '%s' is not a directory", nvme_path.c_str()));
  });
  MachineRates m;
  m.name = be.describe();
  m.ranks_per_node = node->size();
  // GEMMs: the shapes of a GPT-2 block's layers at 2048 tokens of d_model 512 and 1024, the rate
  // over all of them by time.
  double flops = 0, secs = 0;
  for (int C : {512, 1024})
    for (auto [n, k] : {std::pair{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}}) {
      const GemmRate r = measure_gemm(be, 2048, n, k, seconds / 8);
      flops += 2.0 * 2048 * n * k, secs += r.seconds_per_call;
    }
  m.gemm_flops = slowest(*world, flops / secs);
  m.attention_flops = slowest(*world, measure_attention(be, seconds / 4));
  m.copy_bytes = slowest(*world, measure_copy_bandwidth(be, seconds / 4));
  m.adam_bytes = slowest(*world, measure_adam(be, seconds / 4));
  // Within a node, every node's ranks at once; between nodes, the whole world (every rank of each
  // node: what inter_node's rates mean), a pipeline neighbour's rate taken as the all-gather ring's
  // per-link bus bandwidth.
  if (node->size() > 1) m.collectives = fit_links(*node, seconds);
  const int nodes = world->size() / node->size();
  if (nodes > 1) {
    m.inter_node.collectives = fit_links(*world, seconds);
    m.inter_node.p2p_bytes = m.inter_node.collectives.at("all_gather").busbw;
  }
  if (!nvme_path.empty()) std::tie(m.nvme_read_bytes, m.nvme_write_bytes) = measure_swap(*world, nvme_path, swap_bytes);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&now));
  m.measured = strprintf("zero3d bench machine, %d node(s) of %d rank(s) at once, %s", nodes, node->size(), when);
  return m;
}

}  // namespace zero3d
