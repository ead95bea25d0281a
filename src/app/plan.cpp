// app/plan.cpp: zero3d plan, which layouts of a config fit and which is fastest, as a table, JSON,
// sweep.sh's LAYOUTS lines or one layout explained (the planner itself is src/plan/).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "bench/machine.h"
#include "config/config.h"
#include "config/presets.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "parallel/comm.h"
#include "plan/plan.h"

namespace zero3d {

namespace {

const char* kPlanUsage =
    "usage: zero3d plan CONFIG --ranks N [--mem-per-rank BYTES] [--machine FILE] [--device] [--top K]\n"
    "                   [--json | --explain | --sweep K [--ranks-per-node R]] [--deepspeed FILE] [--set k=v]...\n"
    "  Every layout of CONFIG's model and global batch on N ranks: tp x pp x dp, ZeRO stage 0-3, micro-batch and\n"
    "  gradient accumulation, activation checkpointing; each checked by the config code (why it is refused) and\n"
    "  sized by building its engine and models as a run does, on a backend that counts allocations without\n"
    "  memory: per rank params, grads, optimizer state, buffers (ZeRO's buckets, the stage-3 pool, the 16-bit\n"
    "  copies), activations (1F1B's in-flight micro-batches) and other, for the stage that needs the most.\n"
    "  --mem-per-rank BYTES (suffix K, M, G, T: powers of 1024): which fit. --top K rows (default 20; 0: all).\n"
    "  --device: the buffers in device memory, as a GPU run allocates them (the CUDA backend's own workspaces\n"
    "  not counted), with optimizer offload to host memory as one more choice (its host bytes apart).\n"
    "  A config naming zero_optimization.offload_optimizer.nvme_path: offload to nvme as one more choice,\n"
    "  its swap files sized (the nvme column, not in the total) without making them.\n"
    "  --machine FILE (zero3d bench machine's, or a GPU node preset's name: h100-sxm, h200-sxm): each layout's\n"
    "  step time too, its work counted by running its model's and engine's code on the sizing backend\n"
    "  (--explain prints it) and priced at FILE's rates: compute, communication (over the network for a\n"
    "  group that spans nodes), 1F1B's bubble, the step's end; ranked by tokens/s (else by memory).\n"
    "  --json: one object per layout on stdout.\n"
    "  --sweep K: the first K layouts that fit as jobscripts/sweep.sh's LAYOUTS lines (strong scaling; NODES\n"
    "  from --ranks-per-node, default one node): zero3d plan ... --sweep 5 > layouts.txt.\n"
    "  --explain: CONFIG's own layout on N ranks part by part, and what each single change (ZeRO stage,\n"
    "  activation checkpointing, micro-batch, tp, pp) leaves per rank, and with --machine its step time;\n"
    "  a run whose node would need more than its available memory stops before it allocates and prints\n"
    "  the same.\n";

// Bytes in the table's unit: GB, or MB when every layout is under 1 GB.
double g_unit = 1e9;
std::string gb(uint64_t b) { return strprintf(g_unit == 1e9 ? "%.3f" : "%.2f", b / g_unit); }

}  // namespace

int cmd_plan(const Args& a) {
  ConfigSources src;
  int ranks = 0, top = 20;
  uint64_t mem = 0;
  bool json = false, explain = false;
  MemKind kind = MemKind::host;
  int sweep = 0, per_node = 0;  // --sweep K: sweep.sh's LAYOUTS lines; their nodes of --ranks-per-node
  std::optional<MachineRates> machine;  // --machine FILE: price each layout's step
  // Option a[i]'s value as a whole number from `least` to kMaxRanks (advances i).
  auto whole = [&](size_t& i, int least) {
    const std::string opt = a[i];
    return static_cast<int>(parse_whole(option_value(a, i, kPlanUsage), opt.c_str(), least, kMaxRanks));
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help" || a[i] == "-h") return log_info("%s", kPlanUsage), 0;
    if (a[i] == "--ranks") ranks = whole(i, 1);
    else if (a[i] == "--top") top = whole(i, 0);
    else if (a[i] == "--sweep") sweep = whole(i, 1);
    else if (a[i] == "--ranks-per-node") per_node = whole(i, 1);
    else if (a[i] == "--mem-per-rank") mem = parse_bytes(option_value(a, i, kPlanUsage), "--mem-per-rank");
    else if (a[i] == "--json") json = true;
    else if (a[i] == "--explain") explain = true;
    else if (a[i] == "--device") kind = MemKind::device;
    else if (a[i] == "--machine")
      machine = load_machine(find_config_file(option_value(a, i, kPlanUsage), PresetKind::machine).file);
    else if (a[i] == "--set") src.overrides.push_back(option_value(a, i, kPlanUsage));
    else if (a[i] == "--deepspeed") src.deepspeed_file = option_value(a, i, kPlanUsage);
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kPlanUsage));
    else if (src.config_file.empty()) set_config_file(src, a[i]);  // a file, or a preset's name
    else throw UserError(strprintf("zero3d plan takes one config, got a second: '%s'", a[i].c_str()));
  }
  if (src.config_file.empty() || ranks == 0)
    throw UserError(strprintf("zero3d plan needs a config and --ranks N\n%s", kPlanUsage));
  if (machine && ranks > 1 && machine->collectives.empty() && machine->inter_node.collectives.empty())
    throw UserError(strprintf("--machine: the machine file has no collective rates (it was measured on one rank), and "
                              "%d ranks communicate: measure it with zero3d bench machine on the ranks a node runs",
                              ranks));
  catch_interrupts();
  if (ProcessGroup::world()->rank() != 0) return 0;
  if (explain) {
    log_info("%s", explain_layout(src, ranks, mem, kind, machine ? &*machine : nullptr).c_str());
    return 0;
  }

  std::vector<PlanLayout> all = plan_layouts(src, ranks, mem, kind, machine ? &*machine : nullptr);
  std::vector<const PlanLayout*> valid;
  std::map<std::string, int> reasons;
  for (const PlanLayout& l : all) {
    if (l.excluded.empty()) valid.push_back(&l);
    else ++reasons[l.excluded];
  }
  const bool timed = machine.has_value();  // ranked by tokens/s (unpriced last), else by memory
  std::stable_sort(valid.begin(), valid.end(), [&](const PlanLayout* x, const PlanLayout* y) {
    if (x->fits != y->fits) return x->fits;
    if (timed && x->tokens_per_s != y->tokens_per_s) return x->tokens_per_s > y->tokens_per_s;
    return x->worst.total() < y->worst.total();
  });
  // Without --ranks-per-node the ranks fill nodes of the machine's (a preset's 8 GPUs, bench machine's ranks).
  if (timed && (per_node ? per_node != machine->ranks_per_node : ranks % machine->ranks_per_node != 0))
    log_warn("zero3d plan: the machine file was measured with %d ranks a node, this plan has %d: its rates may not "
             "hold (measure it with the ranks a node will run)", machine->ranks_per_node, per_node ? per_node : ranks);
  if (timed && ranks > machine->ranks_per_node && machine->inter_node.collectives.empty())
    log_warn("zero3d plan: %d ranks fill more than one node of %d, and the machine file has no inter_node rates: groups "
             "across nodes are priced at the node's own", ranks, machine->ranks_per_node);
  if (per_node && ranks % per_node)
    throw UserError(strprintf("--ranks %d do not fill nodes of --ranks-per-node %d", ranks, per_node));
  if (sweep) {  // jobscripts/sweep.sh's LAYOUTS: NAME MODE NODES TP PP DP STAGE MICRO GAS [ARGS...]
    std::printf("# zero3d plan %s --ranks %d: the %d layouts that fit %s\n", src.config_file.c_str(), ranks, sweep,
                timed ? "with the most tokens/s predicted" : "with the least memory per rank (no --machine)");
    int n = 0;
    for (const PlanLayout* l : valid) {
      if (!l->fits) continue;
      if (n++ == sweep) break;
      std::string name = strprintf("t%dp%dd%d-s%d-m%dg%d", l->tp, l->pp, l->dp, l->stage, l->micro, l->gas), extra;
      if (l->checkpointing) name += "-ckpt", extra += " --set activation_checkpointing.enabled=true";
      if (l->offload != OffloadDevice::none) name += '-', name += offload_device_name(l->offload);
      if (l->offload != OffloadDevice::none || l->stage > 0)  // the config's own choice may differ
        extra += " --set zero_optimization.offload_optimizer.device=" + offload_device_name(l->offload);
      if (!l->nvme_path.empty()) extra += " --set zero_optimization.offload_optimizer.nvme_path=" + l->nvme_path;
      std::printf("%-28s strong %3d %3d %3d %3d %d %4d %4d%s   # %s GB per rank\n", name.c_str(),
                  per_node ? ranks / per_node : 1, l->tp, l->pp, l->dp, l->stage, l->micro, l->gas, extra.c_str(),
                  strprintf("%.3f", l->worst.total() / 1e9).c_str());
    }
    return 0;
  }
  if (json) {
    for (const PlanLayout& l : all) {
      nlohmann::ordered_json j = {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"stage", l.stage}, {"micro", l.micro},
                                  {"gas", l.gas}, {"activation_checkpointing", l.checkpointing},
                                  {"offload_optimizer", offload_device_name(l.offload)}};
      if (!l.excluded.empty()) {
        j["excluded"] = l.excluded;
      } else {
        auto bytes = [](const RankMemory& r) {
          return nlohmann::ordered_json{{"pp_rank", r.pp_rank}, {"params", r.params}, {"grads", r.grads},
                                        {"optimizer", r.optimizer}, {"buffers", r.buffers},
                                        {"activations", r.activations}, {"other", r.other}, {"total", r.total()},
                                        {"host", r.host}, {"swapped", r.swapped}};
        };
        j["fits"] = l.fits;
        if (l.tokens_per_s > 0)
          j["time"] = {{"step_s", l.time.step_s()}, {"compute_s", l.time.compute_s}, {"comm_s", l.time.comm_s},
                       {"param_io_s", l.time.param_io_s}, {"bubble_s", l.time.bubble_s},
                       {"step_end_s", l.time.step_end_s},
                       {"tokens_per_s", l.tokens_per_s},
                       {"comm", {{"tp_s", l.time.tp_s}, {"dp_s", l.time.dp_s}, {"pp_s", l.time.pp_s},
                                 {"end_collectives_s", l.time.end_collectives_s}, {"offload_s", l.time.offload_s},
                                 {"tp_across_nodes", l.time.tp_across}, {"dp_across_nodes", l.time.dp_across},
                                 {"pp_across_nodes", l.time.pp_across}}}};
        j["worst"] = bytes(l.worst);
        j["stages"] = nlohmann::ordered_json::array();
        for (const RankMemory& r : l.stages) j["stages"].push_back(bytes(r));
      }
      std::printf("%s\n", config_json::to_text(j).c_str());
    }
    return 0;
  }
  uint64_t largest = mem;
  for (const PlanLayout* l : valid) largest = std::max(largest, l->worst.total());
  g_unit = largest < 1000000000 ? 1e6 : 1e9;
  const char* unit = g_unit == 1e9 ? "GB" : "MB";
  const size_t fit = static_cast<size_t>(std::count_if(valid.begin(), valid.end(), [](auto* l) { return l->fits; }));
  log_info("plan     %s on %d ranks: %zu layouts, %zu valid%s; memory per rank (%s) of the stage that needs the most, "
           "from the engine's and the models' own allocations; %s",
           src.config_file.c_str(), ranks, all.size(), valid.size(),
           mem ? strprintf(", %zu fit in %s %s", fit, gb(mem).c_str(), unit).c_str() : "", unit,
           timed ? strprintf("step time priced on %s (%s); ranked by tokens/s", machine->name.c_str(),
                             machine->measured.c_str()).c_str()
                 : "ranked by memory (--machine FILE: by predicted tokens/s)");
  // More columns where they say something: optimizer offload (a device's, or to nvme), what offload
  // puts in host memory (a device's), and in swap files.
  const bool dev = kind == MemKind::device;
  const bool offload_col = dev || std::any_of(all.begin(), all.end(), [](auto& l) { return l.offload != OffloadDevice::none; });
  const bool swap_col = std::any_of(valid.begin(), valid.end(), [](auto* l) { return l->worst.swapped > 0; });
  const std::string time_head = timed ? strprintf(" %8s %8s %8s %8s %9s", "step s", "comm", "bubble", "end", "tokens/s") : "";
  log_info("%4s %3s %3s %5s %5s %4s %4s%s %9s %9s %9s %9s %9s %9s %9s %5s%s%s %s%s", "dp", "tp", "pp", "stage", "micro",
           "gas", "ckpt", offload_col ? " offload" : "", "params", "grads", "optimizer", "buffers", "activ", "other",
           "total", "stage", dev ? strprintf(" %9s", "host").c_str() : "", swap_col ? strprintf(" %9s", "nvme").c_str() : "",
           mem ? "fits" : "", time_head.c_str());
  for (size_t k = 0; k < valid.size() && (top == 0 || k < static_cast<size_t>(top)); ++k) {
    const PlanLayout& l = *valid[k];
    const RankMemory& r = l.worst;
    const std::string time_cols =
        !timed ? ""
        : l.tokens_per_s > 0
            ? strprintf(" %8.4g %8.3g %8.3g %8.3g %9.0f", l.time.step_s(), l.time.comm_s, l.time.bubble_s,
                        l.time.step_end_s, l.tokens_per_s)
            : strprintf(" %8s", "-");
    log_info("%4d %3d %3d %5d %5d %4d %4s%s %9s %9s %9s %9s %9s %9s %9s %5d%s%s %s%s", l.dp, l.tp, l.pp, l.stage,
             l.micro, l.gas, l.checkpointing ? "yes" : "no",
             offload_col ? strprintf(" %7s", offload_device_name(l.offload).c_str()).c_str() : "", gb(r.params).c_str(),
             gb(r.grads).c_str(), gb(r.optimizer).c_str(), gb(r.buffers).c_str(), gb(r.activations).c_str(),
             gb(r.other).c_str(), gb(r.total()).c_str(), r.pp_rank, dev ? strprintf(" %9s", gb(r.host).c_str()).c_str() : "",
             swap_col ? strprintf(" %9s", gb(r.swapped).c_str()).c_str() : "", mem ? (l.fits ? "yes" : "no ") : "",
             time_cols.c_str());
  }
  if (top && valid.size() > static_cast<size_t>(top)) log_info("... %zu more (--top 0 shows all)", valid.size() - top);
  for (const auto& [why, n] : reasons) log_info("excluded %d: %s", n, why.c_str());
  return 0;
}

}  // namespace zero3d
