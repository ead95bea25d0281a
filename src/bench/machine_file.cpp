// bench/machine_file.cpp: the machine file's format (src/plan/README.md): written by zero3d bench
// machine, read by zero3d plan --machine; apart from the measurements, so its reader links alone.
#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/machine.h"
#include "config/json_tree.h"
#include "core/atomic_file.h"
#include "core/check.h"

namespace zero3d {

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
  write_file_atomic(path, config_json::to_text(j, 2) + "\n");
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
