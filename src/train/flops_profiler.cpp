#include "train/flops_profiler.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "model/gpt.h"

namespace zero3d {

namespace {

// 19.23 M, 1.50 G: DeepSpeed's way of printing counts.
std::string si(double v, const char* unit = "") {
  static const char* prefix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) v /= 1000, ++i;
  return strprintf("%.2f %s%s", v, prefix[i], unit);
}
std::string latency(double s) {
  return s >= 1 ? strprintf("%.2f s", s) : s >= 1e-3 ? strprintf("%.2f ms", 1e3 * s) : strprintf("%.2f us", 1e6 * s);
}
std::string pct(double part, double whole) { return strprintf("%.2f%%", whole > 0 ? 100 * part / whole : 0.0); }

// The module tree: GPT > embedding, h > h.N > ln_1 attn ln_2 mlp, ln_f, lm_head.
struct Node {
  std::string name;  // as printed
  std::string kind;  // what the aggregated profile groups by at its depth
  int depth = 0;
  double params = 0, macs = 0, fwd = 0, bwd = 0;
  std::vector<Node> children;
};

Node inner(std::string name, std::string kind, int depth) {
  Node n;
  n.name = std::move(name), n.kind = std::move(kind), n.depth = depth;
  return n;
}
Node leaf(const ModuleStat& m, std::string name, int depth, double accumulation) {
  Node n = inner(name, name, depth);
  n.params = m.params, n.macs = m.macs * accumulation, n.fwd = m.fwd_s, n.bwd = m.bwd_s;
  return n;
}

Node tree_of(const std::vector<ModuleStat>& mods, int accumulation) {
  Node root = inner("GPT", "GPT", 0);
  for (const ModuleStat& m : mods) {
    if (!m.name.starts_with("h.")) {
      root.children.push_back(leaf(m, m.name, 1, accumulation));
      continue;
    }
    const size_t dot = m.name.rfind('.');
    const std::string block = m.name.substr(0, dot);  // "h.3"
    if (root.children.empty() || root.children.back().name != "h") root.children.push_back(inner("h", "h", 1));
    std::vector<Node>& blocks = root.children.back().children;
    if (blocks.empty() || blocks.back().name != block) blocks.push_back(inner(block, "block", 2));
    blocks.back().children.push_back(leaf(m, m.name.substr(dot + 1), 3, accumulation));
  }
  // Inner nodes are the sums of their children.
  auto sum = [](auto& self, Node& n) -> void {
    if (n.children.empty()) return;
    n.params = n.macs = n.fwd = n.bwd = 0;
    for (Node& c : n.children) {
      self(self, c);
      n.params += c.params, n.macs += c.macs, n.fwd += c.fwd, n.bwd += c.bwd;
    }
  };
  sum(sum, root);
  return root;
}

void collect(const Node& n, int depth, std::map<std::string, Node>& by_kind) {
  if (n.depth == depth) {
    Node& a = by_kind[n.kind];
    a.name = n.kind, a.params += n.params, a.macs += n.macs, a.fwd += n.fwd, a.bwd += n.bwd;
    return;
  }
  for (const Node& c : n.children) collect(c, depth, by_kind);
}

// DeepSpeed's aggregated profile: per depth, the top modules by params, MACs and fwd latency,
// modules of one kind summed (all blocks at depth 2, each block part over the blocks at depth 3).
std::string aggregated(const Node& root, int max_depth, int top) {
  std::string out =
      strprintf("Top %d modules in terms of params, MACs or fwd latency at different model depths:\n", top);
  for (int d = 0; d <= 3 && (max_depth < 0 || d <= max_depth); ++d) {
    std::map<std::string, Node> by_kind;
    collect(root, d, by_kind);
    if (by_kind.empty()) break;
    std::vector<Node> v;
    for (auto& [k, n] : by_kind) v.push_back(n);
    auto top_by = [&](double Node::*key, auto show) {
      std::sort(v.begin(), v.end(), [&](const Node& a, const Node& b) { return a.*key > b.*key; });
      std::string s = "{";
      for (size_t i = 0; i < v.size() && i < static_cast<size_t>(top); ++i)
        s += strprintf("%s'%s': '%s'", i ? ", " : "", v[i].name.c_str(), show(v[i].*key).c_str());
      return s + "}";
    };
    out += strprintf("depth %d:\n", d);
    out += "    params      - " + top_by(&Node::params, [](double x) { return si(x); }) + "\n";
    out += "    MACs        - " + top_by(&Node::macs, [](double x) { return si(x, "MACs"); }) + "\n";
    out += "    fwd latency - " + top_by(&Node::fwd, [](double x) { return latency(x); }) + "\n";
  }
  return out;
}

void detailed(const Node& n, const Node& root, int max_depth, std::string& out) {
  if (max_depth >= 0 && n.depth > max_depth) return;
  out += strprintf("%*s%s: %s, %s params, %s, %s MACs, %s, %s fwd latency, %s, %s\n", 2 * n.depth, "", n.name.c_str(),
                   si(n.params).c_str(), pct(n.params, root.params).c_str(), si(n.macs, "MACs").c_str(),
                   pct(n.macs, root.macs).c_str(), latency(n.fwd).c_str(), pct(n.fwd, root.fwd).c_str(),
                   (n.fwd > 0 ? si(2 * n.macs / n.fwd, "FLOPS") : std::string("-")).c_str(),
                   ("bwd " + latency(n.bwd)).c_str());
  for (const Node& c : n.children) detailed(c, root, max_depth, out);
}

// Measured figures of one stage, as sent to world rank 0: per module fwd and bwd times and
// launches, then the step's times.
constexpr size_t kStepTimes = 5, kPerModule = 4;
std::vector<double> pack(const ModuleProfile& p, const ProfiledStep& s) {
  std::vector<double> v;
  for (const ModuleStat& m : p.modules)
    v.push_back(m.fwd_s), v.push_back(m.bwd_s), v.push_back(m.fwd_launches), v.push_back(m.bwd_launches);
  for (double t : {s.reduce_s, s.optimizer_s, s.gather_s, s.idle_s, s.step_s}) v.push_back(t);
  return v;
}

// The whole model's figures, one dp replica's: the summary and every stage's metrics repeat them.
struct ModelTotals {
  double params = 0;     // parameters of the model
  double fwd_flops = 0;  // forward FLOPs of the step's micro-batches
  double samples = 0;    // samples per step, over the dp replicas
};

// One stage as world rank 0 reports it: its module tree and measured times, and what they give.
struct StageProfile {
  int stage = 0;
  Node tree;
  double reduce = 0, optimizer = 0, gather = 0, idle = 0, iter = 0;  // measured (s)
  double fwd = 0, bwd = 0, upd = 0;  // latencies: modules' fwd, bwd + reduction, optimizer + all-gather
  double flops = 0, factor = 0;      // fwd flops; the flops of fwd+bwd in fwd flops (3 + recomputed fwds)
};

std::string summary_header(const FlopsProfilerConfig& cfg, const Topology& topo, const ProfiledStep& step,
                           const ModelTotals& model) {
  std::string text = strprintf(
      "-------------------------- flops profiler (DeepSpeed's summary) --------------------------\n"
      "Profile summary at step %d (profile_step %d: DeepSpeed counts the steps done before it)\n"
      "Notations: params = parameters, MACs = multiply-accumulates (one per parameter per token, plus causal\n"
      "attention: the model-FLOPs convention), flops = 2 MACs, FLOPS = flops per second; every latency is\n"
      "measured (a synchronize around each module); MACs and latencies cover the step's %d micro-batch(es)\n\n"
      "%-56s %d\n%-56s %d\n%-56s %d (tp %d x pp %d)\n%-56s %d (micro-batch %d x %d accumulation)\n%-56s %s\n"
      "%-56s %s\n%-56s %s\n",
      step.step, cfg.profile_step, step.accumulation, "world size:", topo.world, "data parallel size:", topo.dp,
      "model parallel size:", topo.tp * topo.pp, topo.tp, topo.pp,
      "batch size per rank:", step.micro_batch * step.accumulation, step.micro_batch, step.accumulation,
      "params of model:", si(model.params).c_str(), "fwd flops of model (one dp replica):",
      si(model.fwd_flops).c_str(), "iter latency (the measured step):", latency(step.step_s).c_str());
  text += strprintf("%-56s %.2f\n", "samples/second:", model.samples / step.step_s);
  return text;
}

// Stage `stage`'s measured times (pack's order), from its speaker (tp rank 0, dp rank 0) to every
// rank. Collective over the world: every rank calls it for every stage, in stage order.
std::vector<double> stage_times(ProcessGroups& groups, int stage, size_t modules, const std::vector<double>& mine) {
  const int speaker = groups.topo.rank(GridCoord{0, 0, stage});
  std::vector<double> t(kPerModule * modules + kStepTimes);
  if (groups.world_rank == speaker) {
    Z3D_ASSERT(mine.size() == t.size(), "flops profiler: this rank's modules are not its stage's");
    t = mine;
  }
  groups.world->broadcast(host_mem(t.data()), t.size() * sizeof(double), speaker);
  return t;
}

// The stage's modules with their measured times `t` filled in, and its tree and totals.
StageProfile stage_profile(std::vector<ModuleStat>& mods, const std::vector<double>& t, int stage, int accumulation,
                           double recompute_fwd_factor) {
  for (size_t i = 0; i < mods.size(); ++i) {
    const double* f = &t[kPerModule * i];
    mods[i].fwd_s = f[0], mods[i].bwd_s = f[1], mods[i].fwd_launches = f[2], mods[i].bwd_launches = f[3];
  }
  const double* st = &t[kPerModule * mods.size()];
  StageProfile s;
  s.stage = stage;
  s.reduce = st[0], s.optimizer = st[1], s.gather = st[2], s.idle = st[3], s.iter = st[4];
  s.tree = tree_of(mods, accumulation);
  s.fwd = s.tree.fwd, s.bwd = s.tree.bwd + s.reduce, s.upd = s.optimizer + s.gather;
  s.flops = 2 * s.tree.macs, s.factor = 3 + recompute_fwd_factor;
  return s;
}

// One stage's section: its latencies and rates, then the aggregated and (optionally) detailed profile.
std::string stage_report(const StageProfile& s, const FlopsProfilerConfig& cfg, const ModelConfig& model,
                         const Topology& topo) {
  const Node& tree = s.tree;
  const double fwd = s.fwd, bwd = s.bwd, upd = s.upd, flops = s.flops, factor = s.factor;
  const PipelineStage ps = pipeline_stage(model, topo.pp, s.stage);
  std::string text = strprintf("\n---- pipeline stage %d of %d (layers %d-%d), tp rank 0 of %d, dp rank 0 ----\n",
                               s.stage, topo.pp, ps.first_layer, ps.first_layer + ps.num_layers - 1, topo.tp);
  auto line = [&](const char* what, const std::string& v) { text += strprintf("%-56s %s\n", what, v.c_str()); };
  line("params per rank:", si(tree.params));
  line("fwd MACs per rank:", si(tree.macs, "MACs"));
  line("fwd flops per rank:", si(flops));
  line("fwd latency:", latency(fwd));
  line("bwd latency:", latency(bwd) + " (modules " + latency(tree.bwd) + " + gradient reduction " +
                           latency(s.reduce) + ")");
  line("fwd FLOPS per rank = fwd flops / fwd latency:", si(flops / fwd, "FLOPS"));
  line("bwd FLOPS per rank = 2 * fwd flops / bwd latency:", si(2 * flops / bwd, "FLOPS"));
  line(strprintf("fwd+bwd FLOPS per rank = %g * fwd flops / (fwd+bwd):", factor).c_str(),
       si(factor * flops / (fwd + bwd), "FLOPS"));
  line("step latency:", latency(upd) + " (optimizer " + latency(s.optimizer) + " + parameter all-gather " +
                            latency(s.gather) + ")");
  line("outside modules = iter - fwd - bwd - step:",
       latency(s.iter - fwd - bwd - upd) + " (pipeline waits " + latency(s.idle) + ", data, control reductions)");
  text += "\nAggregated profile per rank\n" + aggregated(tree, cfg.module_depth, cfg.top_modules);
  if (cfg.detailed) {
    text += "\nDetailed profile per rank\nEach module: params, % of params, MACs, % of MACs, fwd latency, % of fwd "
            "latency, fwd FLOPS, bwd latency\n";
    detailed(tree, tree, cfg.module_depth, text);
  }
  return text;
}

// The stage's "profile" record and one "profile_module" record per module.
void write_stage_metrics(MetricsLog& metrics, const StageProfile& s, const std::vector<ModuleStat>& mods,
                         const ProfiledStep& step, const Topology& topo, const ModelTotals& model) {
  const Node& tree = s.tree;
  const double fwd = s.fwd, bwd = s.bwd, upd = s.upd, flops = s.flops, factor = s.factor, iter = s.iter;
  metrics.write(MetricsRecord("profile")
                    .add("step", step.step).add("stage", s.stage).add("world_size", topo.world).add("dp", topo.dp)
                    .add("tp", topo.tp).add("pp", topo.pp).add("micro_batch", step.micro_batch)
                    .add("accumulation", step.accumulation).add("params", tree.params).add("fwd_macs", tree.macs)
                    .add("fwd_flops", flops).add("fwd_latency_s", fwd).add("bwd_latency_s", bwd)
                    .add("bwd_modules_s", tree.bwd).add("reduce_s", s.reduce).add("step_latency_s", upd)
                    .add("optimizer_s", s.optimizer).add("gather_s", s.gather).add("iter_latency_s", iter)
                    .add("pipeline_idle_s", s.idle).add("outside_modules_s", iter - fwd - bwd - upd)
                    .add("fwd_flops_per_s", flops / fwd).add("bwd_flops_per_s", 2 * flops / bwd)
                    .add("fwd_bwd_flops_per_s", factor * flops / (fwd + bwd))
                    .add("samples_per_s", model.samples / iter).add("model_params", model.params)
                    .add("model_fwd_flops", model.fwd_flops));
  for (const ModuleStat& m : mods)
    metrics.write(MetricsRecord("profile_module")
                      .add("step", step.step).add("stage", s.stage).add("module", m.name).add("params", m.params)
                      .add("fwd_macs", m.macs * step.accumulation).add("fwd_s", m.fwd_s).add("bwd_s", m.bwd_s)
                      .add("fwd_launches", m.fwd_launches).add("bwd_launches", m.bwd_launches));
}

// flops_profiler.output_file, when set: the whole text; a failed write only warns.
void write_output_file(const FlopsProfilerConfig& cfg, const std::string& text) {
  if (cfg.output_file.empty()) return;
  std::ofstream f(cfg.output_file, std::ios::trunc);
  f << text;
  if (!f.good())
    log_warn("flops_profiler.output_file '%s': cannot write: %s (the profile is in the log and metrics.jsonl)",
             cfg.output_file.c_str(), std::strerror(errno));
}

}  // namespace

std::string report_flops_profile(const FlopsProfilerConfig& cfg, const ModelConfig& model, ProcessGroups& groups,
                                 const ModuleProfile& mine, const ProfiledStep& step, MetricsLog* metrics) {
  const Topology& topo = groups.topo;
  const bool root_rank = groups.world_rank == 0;
  const int tokens_per_micro = step.micro_batch * model.seq_len;
  ModelTotals totals;
  for (const ParamInfo& p : gpt_param_table(model)) totals.params += static_cast<double>(p.size);
  totals.fwd_flops = gpt_flops_per_token(model) / 3 * tokens_per_micro * step.accumulation;
  totals.samples = static_cast<double>(step.micro_batch) * step.accumulation * topo.dp;
  std::string text = summary_header(cfg, topo, step, totals);

  const std::vector<double> my_times = pack(mine, step);
  for (int p = 0; p < topo.pp; ++p) {
    std::vector<ModuleStat> mods = gpt_modules(model, step.micro_batch, topo.tp, 0, topo.pp, p);
    const std::vector<double> t = stage_times(groups, p, mods.size(), my_times);
    if (!root_rank) continue;
    const StageProfile stage = stage_profile(mods, t, p, step.accumulation, cfg.recompute_fwd_factor);
    text += stage_report(stage, cfg, model, topo);
    if (metrics) write_stage_metrics(*metrics, stage, mods, step, topo, totals);
  }
  if (!root_rank) return "";
  text += "------------------------------------------------------------------------------------------\n";
  write_output_file(cfg, text);
  return text;
}

}  // namespace zero3d
