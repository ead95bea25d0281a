#include "bench/machine.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <climits>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/comm.h"
#include "bench/rates.h"
#include "config/json_tree.h"
#include "core/atomic_file.h"
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
// (a rank descheduled once is not the link's rate). Collective over g.
std::map<std::string, MachineRates::Link> fit_links(ProcessGroup& g) {
  std::map<std::string, MachineRates::Link> links;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    const double small = 64 << 10, large = 32 << 20;
    double t1 = 1e30, t2 = 1e30;
    for (int k = 0; k < 3; ++k) {
      t1 = std::min(t1, time_collective(g, op, static_cast<size_t>(small)));
      t2 = std::min(t2, time_collective(g, op, static_cast<size_t>(large)));
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
    if (!std::filesystem::is_directory(nvme_path, ec))
      throw UserError(strprintf("bench machine --nvme-path '%s' is not a directory", nvme_path.c_str()));
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
  if (node->size() > 1) m.collectives = fit_links(*node);
  const int nodes = world->size() / node->size();
  if (nodes > 1) {
    m.inter_node.collectives = fit_links(*world);
    m.inter_node.p2p_bytes = m.inter_node.collectives.at("all_gather").busbw;
  }
  if (!nvme_path.empty()) std::tie(m.nvme_read_bytes, m.nvme_write_bytes) = measure_swap(*world, nvme_path, swap_bytes);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&now));
  m.measured = strprintf("zero3d bench machine, %d node(s) of %d rank(s) at once, %s", nodes, node->size(), when);
  return m;
}

namespace {

// A machine file's rates by key; the required ones must be there, every one present must be positive.
struct RateKey {
  const char* key;
  double MachineRates::*rate;
  bool required;
};
constexpr RateKey kRates[] = {
    {"gemm_flops_per_s", &MachineRates::gemm_flops, true},
    {"gemm_bf16_flops_per_s", &MachineRates::gemm_bf16_flops, false},
    {"attention_flops_per_s", &MachineRates::attention_flops, true},
    {"copy_bytes_per_s", &MachineRates::copy_bytes, true},
    {"adam_bytes_per_s", &MachineRates::adam_bytes, false},  // absent: at copy bandwidth
    {"p2p_bytes_per_s", &MachineRates::p2p_bytes, false},
    {"pcie_bytes_per_s", &MachineRates::pcie_bytes, false},
    {"host_adam_bytes_per_s", &MachineRates::host_adam_bytes, false},
    {"nvme_read_bytes_per_s", &MachineRates::nvme_read_bytes, false},
    {"nvme_write_bytes_per_s", &MachineRates::nvme_write_bytes, false},
};
const std::vector<std::string> kOtherKeys = {"name", "ranks_per_node", "device", "collectives", "inter_node", "measured",
                                             "sources"};

// An object's keys against the valid ones: the first unknown one named, with the nearest valid key.
void known_keys(const nlohmann::json& j, const std::vector<std::string>& valid, const std::string& where) {
  if (!j.is_object()) throw UserError((where.empty() ? "the top level" : where) + " is not an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(valid.begin(), valid.end(), it.key()) == valid.end()) {
      const std::string best = config_json::nearest(it.key(), valid);
      throw UserError(strprintf("unknown key '%s%s'%s", where.empty() ? "" : (where + ".").c_str(),
                                config_json::show_key(it.key()).c_str(),
                                best.empty() ? "" : (" (did you mean '" + best + "'?)").c_str()));
    }
}

// j[key] (at `where`) as a T when it is there (else `otherwise`); a UserError naming it when it is
// not a T (a number given as a string, a name as a number).
template <class T>
T typed(const nlohmann::json& j, const std::string& key, T otherwise, const std::string& where = "") {
  if (!j.contains(key)) return otherwise;
  const nlohmann::json& v = j.at(key);
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) ok = v.is_string();
  else if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
  else ok = v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_string(); });
  if (!ok)
    throw UserError(strprintf("%s is %s: it must be %s", (where.empty() ? key : where + "." + key).c_str(),
                              config_json::show(v).c_str(),
                              std::is_same_v<T, std::string> ? "a string" : std::is_same_v<T, bool> ? "true or false"
                              : std::is_integral_v<T> ? "a whole number" : std::is_floating_point_v<T> ? "a number"
                                                                                                        : "a list of strings"));
  return v.get<T>();
}

// j[key] (at `where`), which must be there and positive.
double positive(const nlohmann::json& j, const std::string& key, const std::string& where = "") {
  const std::string at = where.empty() ? key : where + "." + key;
  if (!j.contains(key)) throw UserError("missing " + at);
  const double v = typed(j, key, 0.0, where);
  if (!(v > 0)) throw UserError(strprintf("%s is %g: it must be positive", at.c_str(), v));
  return v;
}

nlohmann::ordered_json links_json(const std::map<std::string, MachineRates::Link>& links) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [op, l] : links) j[op] = {{"latency_s", l.latency_s}, {"busbw_bytes_per_s", l.busbw}};
  return j;
}

const std::vector<std::string> kCollectives = {"all_reduce", "reduce_scatter", "all_gather"};

std::map<std::string, MachineRates::Link> links_from(const nlohmann::json& j, const std::string& where) {
  known_keys(j, kCollectives, where);
  std::map<std::string, MachineRates::Link> links;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string at = where + "." + it.key();
    known_keys(*it, {"latency_s", "busbw_bytes_per_s"}, at);
    const double latency = typed(*it, "latency_s", -1.0, at);
    if (latency < 0) throw UserError(at + ".latency_s is missing or negative");
    links[it.key()] = {latency, positive(*it, "busbw_bytes_per_s", at)};
  }
  return links;
}

}  // namespace

void save_machine(const MachineRates& m, const std::string& path) {
  nlohmann::ordered_json j = {{"name", m.name}, {"ranks_per_node", m.ranks_per_node}};
  if (m.device) j["device"] = true;
  for (const RateKey& r : kRates)
    if (r.required || m.*r.rate > 0) j[r.key] = m.*r.rate;
  j["collectives"] = links_json(m.collectives);
  if (!m.inter_node.collectives.empty() || m.inter_node.p2p_bytes > 0)
    j["inter_node"] = {{"p2p_bytes_per_s", m.inter_node.p2p_bytes}, {"collectives", links_json(m.inter_node.collectives)}};
  j["measured"] = m.measured;
  if (!m.sources.empty()) j["sources"] = m.sources;
  write_file_atomic(path, j.dump(2) + "\n");
}

MachineRates load_machine(const std::string& path) {
  const nlohmann::json j = config_json::read_file(path, "machine file");
  std::vector<std::string> valid = kOtherKeys;
  for (const RateKey& r : kRates) valid.push_back(r.key);
  try {
    known_keys(j, valid, "");
    MachineRates m;
    m.name = typed(j, "name", std::string());
    m.ranks_per_node = typed(j, "ranks_per_node", 1);
    if (m.ranks_per_node < 1) throw UserError("ranks_per_node must be at least 1");
    m.device = typed(j, "device", false);
    for (const RateKey& r : kRates)
      if (r.required || j.contains(r.key)) m.*r.rate = positive(j, r.key);
    if (m.adam_bytes == 0) m.adam_bytes = m.copy_bytes;
    m.collectives = links_from(j.contains("collectives") ? j.at("collectives") : nlohmann::json::object(), "collectives");
    // A node of several ranks communicates: without its rates every collective would cost nothing.
    for (const std::string& op : kCollectives)
      if (m.ranks_per_node > 1 && !m.collectives.count(op))
        throw UserError(strprintf("missing collectives.%s (a node of %d ranks communicates)", op.c_str(), m.ranks_per_node));
    if (j.contains("inter_node")) {
      const nlohmann::json& net = j.at("inter_node");
      known_keys(net, {"p2p_bytes_per_s", "collectives"}, "inter_node");
      if (net.contains("p2p_bytes_per_s")) m.inter_node.p2p_bytes = positive(net, "p2p_bytes_per_s", "inter_node");
      m.inter_node.collectives = links_from(net.contains("collectives") ? net.at("collectives") : nlohmann::json::object(),
                                            "inter_node.collectives");
    }
    m.measured = typed(j, "measured", std::string());
    m.sources = typed(j, "sources", std::vector<std::string>{});
    return m;
  } catch (const UserError& e) {
    throw UserError(strprintf("machine file '%s': %s (required: %s)", path.c_str(), e.what(),
                              "gemm_flops_per_s, attention_flops_per_s, copy_bytes_per_s, and collectives where a node "
                              "has more than one rank; see src/plan/README.md"));
  }
}

}  // namespace zero3d
