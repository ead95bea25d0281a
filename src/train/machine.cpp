#include "train/machine.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/math/adamw.h"
#include "parallel/comm.h"
#include "train/bench.h"

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
  const math::AdamParams a{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, true};
  const OpStat st = profiled(
      be,
      [&] {
        be.adam_step(p.data(), m.data(), v.data(), g.data(), n, a);
        be.synchronize();
      },
      seconds);
  return st.bytes / st.seconds;
}

}  // namespace

MachineRates measure_machine(Backend& be, double seconds) {
  auto world = ProcessGroup::world();
  MachineRates m;
  m.name = be.describe();
  m.ranks_per_node = world->size();
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
  if (world->size() > 1)
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
      const double small = 64 << 10, large = 32 << 20;
      double t1 = 1e30, t2 = 1e30;  // the best of three: a rank descheduled once is not the link's rate
      for (int k = 0; k < 3; ++k) {
        t1 = std::min(t1, time_collective(*world, op, static_cast<size_t>(small)));
        t2 = std::min(t2, time_collective(*world, op, static_cast<size_t>(large)));
      }
      const double share = bus_share(op, world->size());
      MachineRates::Link l;
      l.busbw = share * (large - small) / std::max(t2 - t1, 1e-9);
      l.latency_s = std::max(0.0, t1 - share * small / l.busbw);
      m.collectives[op] = l;
    }
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&now));
  m.measured = strprintf("zero3d bench machine, %d rank(s) at once, %s", world->size(), when);
  return m;
}

namespace {

nlohmann::ordered_json links_json(const std::map<std::string, MachineRates::Link>& links) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [op, l] : links) j[op] = {{"latency_s", l.latency_s}, {"busbw_bytes_per_s", l.busbw}};
  return j;
}

std::map<std::string, MachineRates::Link> links_from(const nlohmann::json& j) {
  std::map<std::string, MachineRates::Link> links;
  for (auto it = j.begin(); it != j.end(); ++it)
    links[it.key()] = {it->at("latency_s").get<double>(), it->at("busbw_bytes_per_s").get<double>()};
  return links;
}

}  // namespace

void save_machine(const MachineRates& m, const std::string& path) {
  nlohmann::ordered_json j = {{"name", m.name}, {"ranks_per_node", m.ranks_per_node}};
  if (m.device) j["device"] = true;
  j["gemm_flops_per_s"] = m.gemm_flops;
  if (m.gemm_bf16_flops > 0) j["gemm_bf16_flops_per_s"] = m.gemm_bf16_flops;
  j["attention_flops_per_s"] = m.attention_flops;
  j["copy_bytes_per_s"] = m.copy_bytes;
  j["adam_bytes_per_s"] = m.adam_bytes;
  if (m.p2p_bytes > 0) j["p2p_bytes_per_s"] = m.p2p_bytes;
  if (m.pcie_bytes > 0) j["pcie_bytes_per_s"] = m.pcie_bytes;
  if (m.host_adam_bytes > 0) j["host_adam_bytes_per_s"] = m.host_adam_bytes;
  j["collectives"] = links_json(m.collectives);
  if (!m.inter_node.collectives.empty() || m.inter_node.p2p_bytes > 0)
    j["inter_node"] = {{"p2p_bytes_per_s", m.inter_node.p2p_bytes}, {"collectives", links_json(m.inter_node.collectives)}};
  j["measured"] = m.measured;
  if (!m.sources.empty()) j["sources"] = m.sources;
  write_file_atomic(path, j.dump(2) + "\n");
}

MachineRates load_machine(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UserError(strprintf("cannot read the machine file '%s' (make one with zero3d bench machine)", path.c_str()));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    MachineRates m;
    m.name = j.value("name", "");
    m.ranks_per_node = j.value("ranks_per_node", 1);
    m.gemm_flops = j.at("gemm_flops_per_s").get<double>();
    m.attention_flops = j.at("attention_flops_per_s").get<double>();
    m.copy_bytes = j.at("copy_bytes_per_s").get<double>();
    m.adam_bytes = j.value("adam_bytes_per_s", m.copy_bytes);  // absent: at copy bandwidth
    m.device = j.value("device", false);
    m.gemm_bf16_flops = j.value("gemm_bf16_flops_per_s", 0.0);
    m.p2p_bytes = j.value("p2p_bytes_per_s", 0.0);
    m.pcie_bytes = j.value("pcie_bytes_per_s", 0.0);
    m.host_adam_bytes = j.value("host_adam_bytes_per_s", 0.0);
    m.collectives = links_from(j.value("collectives", nlohmann::json::object()));
    if (j.contains("inter_node")) {
      const nlohmann::json& net = j.at("inter_node");
      m.inter_node.p2p_bytes = net.value("p2p_bytes_per_s", 0.0);
      m.inter_node.collectives = links_from(net.value("collectives", nlohmann::json::object()));
    }
    m.measured = j.value("measured", "");
    m.sources = j.value("sources", std::vector<std::string>{});
    if (m.gemm_flops <= 0 || m.attention_flops <= 0 || m.copy_bytes <= 0 ||
        std::min({m.gemm_bf16_flops, m.p2p_bytes, m.pcie_bytes, m.host_adam_bytes, m.inter_node.p2p_bytes}) < 0)
      throw UserError("a rate is not positive");
    if (m.ranks_per_node < 1) throw UserError("ranks_per_node must be at least 1");
    return m;
  } catch (const std::exception& e) {
    throw UserError(strprintf("machine file '%s': %s (keys: gemm_flops_per_s, attention_flops_per_s, "
                              "copy_bytes_per_s, collectives.OP.latency_s/busbw_bytes_per_s; optional: device, gemm_bf16_flops_per_s, "
                              "adam_bytes_per_s, p2p_bytes_per_s, pcie_bytes_per_s, host_adam_bytes_per_s, "
                              "inter_node.{p2p_bytes_per_s,collectives})", path.c_str(), e.what()));
  }
}

}  // namespace zero3d
