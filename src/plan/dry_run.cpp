#include "plan/dry_run.h"

#include <algorithm>
#include <cmath>

#include "ckpt/dir.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "plan/plan.h"
#include "train/metrics.h"

namespace zero3d {

namespace {

// The estimate's default rates, when ZERO3D_FLOPS_PER_RANK does not give one: 40% of a known
// peak (what well-tuned GPT training sustains of a GPU's dense bf16 peak), else a CPU rank's.
constexpr double kSustainedFraction = 0.4;
constexpr double kCpuRankFlops = 1e10;
constexpr int kMeasuredSteps = 50;  // the measured rate: median of the last this many steps

std::string with_commas(int64_t n) {  // n >= 0
  const std::string d = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) s += ',';
    s += d[i];
  }
  return s;
}

// The checkpoint a real run would continue from (checkpoint.load), "" for a fresh start. `auto`
// takes `latest`, else the newest committed one, as load_checkpoint tries them first; a path that
// names no checkpoint is the real run's error.
std::string resume_checkpoint(const Config& c, const std::string& run_dir) {
  if (c.checkpoint.load == LoadMode::path) return checkpoint_file(c.checkpoint.load_path);
  if (c.checkpoint.load == LoadMode::none) return "";
  const std::string dir = c.checkpoint.dir.empty() ? run_dir + "/checkpoints" : c.checkpoint.dir;
  if (const std::string latest = read_latest(dir); !latest.empty()) return dir + "/" + latest;
  const std::vector<std::string> all = list_checkpoints(dir);
  return all.empty() ? "" : all.front();
}

// The model FLOP/s of the last kMeasuredSteps train records in metrics.jsonl (none: empty).
std::vector<double> measured_rates(const std::string& path) {
  std::vector<double> rates;
  for (const MetricsLine& m : read_metrics(path)) {  // a line that is not JSON: the real run refuses it too
    const nlohmann::json& r = m.record;
    if (r.value("kind", "") == "train" && r.contains("model_flops_per_s") && r["model_flops_per_s"].is_number())
      rates.push_back(r["model_flops_per_s"].get<double>());
  }
  if (rates.size() > kMeasuredSteps) rates.erase(rates.begin(), rates.end() - kMeasuredSteps);
  return rates;
}

}  // namespace

double RunPlan::seconds_left() const {
  const double flops = flops_per_step() * static_cast<double>(std::max<int64_t>(0, train_steps - start_step));
  return flops / (measured_flops_per_s > 0 ? measured_flops_per_s : flops_per_rank * ranks);
}

RunPlan plan_run(const Config& c, const DryRunInputs& in) {
  RunPlan p;
  p.config_file = in.config_file;
  p.ranks = in.ranks;
  p.tp = c.tp_size;
  p.pp = c.pp_size;
  p.dp = in.ranks / (c.tp_size * c.pp_size);
  p.zero_stage = c.zero.stage;
  p.precision = c.precision;
  p.notices = c.notices;
  for (const ParamInfo& t : gpt_param_table(c.model)) p.num_params += static_cast<int64_t>(t.size);
  // Tensor-parallel ranks of a stage hold equal shares (tp divides every split dimension): tp rank 0's.
  for (int s = 0; s < p.pp; ++s) {
    int64_t n = 0;
    for (const ParamInfo& t : gpt_param_table(c.model, p.tp, 0, p.pp, s)) n += static_cast<int64_t>(t.size);
    p.params_per_rank.push_back(n);
    const PipelineStage st = pipeline_stage(c.model, p.pp, s);
    std::string what = strprintf("layers %d-%d", st.first_layer, st.first_layer + st.num_layers - 1);
    if (st.first()) what = "embeddings, " + what;
    if (st.last())
      what += !c.model.tie_word_embeddings ? ", ln_f, lm_head" : p.pp > 1 ? ", ln_f, the LM head's copy of wte" : ", ln_f";
    p.stage_layers.push_back(what);
  }
  if (c.zero.offload_optimizer.device != OffloadDevice::nvme && c.zero.offload_param.device != OffloadDevice::nvme)
    for (int s = 0; s < p.pp; ++s)
      p.memory_per_rank.push_back(size_rank(c, p.dp, s, in.device ? MemKind::device : MemKind::host).total());
  p.flops_per_token = gpt_flops_per_token(c.model);
  p.architecture = describe_architecture(c.model);
  p.train_batch_size = c.train_batch_size;
  p.seq_len = c.model.seq_len;
  p.train_steps = c.train_steps;
  // The data files, checked as the trainer opens them.
  p.train_sequences = DataLoader(c.data.train, c.model.seq_len, c.model.vocab_size, c.seed, true, "data.train").num_sequences();
  if (!c.data.val.empty()) DataLoader(c.data.val, c.model.seq_len, c.model.vocab_size, c.seed, false, "data.val");

  p.peak_flops = in.peak_flops;
  p.peak_source = in.peak_source;
  if (in.flops_per_rank > 0) {
    p.flops_per_rank = in.flops_per_rank;
    p.flops_per_rank_source = "ZERO3D_FLOPS_PER_RANK";
  } else if (p.peak_flops > 0) {
    p.flops_per_rank = kSustainedFraction * p.peak_flops;
    p.flops_per_rank_source = strprintf("assumed: %.0f%% of the peak", 100 * kSustainedFraction);
  } else {
    p.flops_per_rank = kCpuRankFlops;
    p.flops_per_rank_source = "assumed for a CPU rank; set ZERO3D_FLOPS_PER_RANK";
  }

  p.resume_from = resume_checkpoint(c, in.run_dir);
  // A checkpoint's step is in its name (step_XXXXXXXX.h5, as zero3d writes them).
  if (!p.resume_from.empty()) p.start_step = std::max<int64_t>(0, step_of(p.resume_from));
  if (p.start_step > 0) {
    std::vector<double> rates = measured_rates(in.run_dir + "/metrics.jsonl");
    if (!rates.empty()) {
      std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
      p.measured_flops_per_s = rates[rates.size() / 2];
      p.measured_steps = static_cast<int>(rates.size());
    }
  }
  p.job_seconds_left = in.job.seconds_left;
  return p;
}

std::string format_plan(const RunPlan& p) {
  std::string s;
  for (const std::string& n : p.notices) s += "zero3d: notice: " + n + "\n";
  s += strprintf("dry run    %s on %d rank%s = tp %d x pp %d x dp %d, ZeRO stage %d, %s; nothing is written\n",
                 p.config_file.c_str(), p.ranks, p.ranks == 1 ? "" : "s", p.tp, p.pp, p.dp, p.zero_stage,
                 name_of(p.precision));
  s += strprintf("model      %s parameters; per rank: ", with_commas(p.num_params).c_str());
  for (int st = 0; st < p.pp; ++st)
    s += strprintf("%s%s (%s%s)", st ? ", " : "", with_commas(p.params_per_rank[st]).c_str(),
                   p.pp > 1 ? strprintf("pp stage %d: ", st).c_str() : "", p.stage_layers[st].c_str());
  s += "\narch       " + p.architecture;
  if (!p.memory_per_rank.empty()) {
    s += "\nmemory     per rank: ";
    for (int st = 0; st < p.pp; ++st)
      s += strprintf("%s%.4g GB%s", st ? ", " : "", p.memory_per_rank[st] / 1e9,
                     p.pp > 1 ? strprintf(" (pp stage %d)", st).c_str() : "");
    s += " of model state, buffers and activations, before the process's own (zero3d plan --explain: the parts)";
  }
  s += strprintf("\nFLOPs      %.5g MFLOP per token, %.4g GFLOP per step (model FLOPs: 6 per parameter in a matrix "
                 "multiply + causal attention)\n",
                 p.flops_per_token / 1e6, p.flops_per_step() / 1e9);
  s += strprintf("tokens     %lld sequences x %lld = %s per step; %lld steps = %s tokens (%.3g epochs of data.train)\n",
                 static_cast<long long>(p.train_batch_size), static_cast<long long>(p.seq_len),
                 with_commas(static_cast<int64_t>(p.tokens_per_step())).c_str(), static_cast<long long>(p.train_steps),
                 with_commas(static_cast<int64_t>(p.tokens_per_step()) * p.train_steps).c_str(),
                 static_cast<double>(p.train_batch_size) * p.train_steps / static_cast<double>(p.train_sequences));
  if (p.peak_flops > 0)
    s += strprintf("peak       %.4g FLOP/s per rank for MFU (%s)\n", p.peak_flops, p.peak_source.c_str());
  else
    s += "peak       for MFU measured at start (sgemm 1024^3 on rank 0); --peak-flops X sets it\n";
  const double total = p.flops_per_step() * static_cast<double>(p.train_steps);
  s += strprintf("compute    %.4g model FLOPs; at %.4g FLOP/s per rank x %d rank%s (%s): %s\n", total,
                 p.flops_per_rank, p.ranks, p.ranks == 1 ? "" : "s", p.flops_per_rank_source.c_str(),
                 format_hms(total / (p.flops_per_rank * p.ranks)).c_str());
  if (!p.resume_from.empty()) {
    s += strprintf("resume     from %s: %lld steps done, %lld left", p.resume_from.c_str(),
                   static_cast<long long>(p.start_step),
                   static_cast<long long>(std::max<int64_t>(0, p.train_steps - p.start_step)));
    s += p.measured_flops_per_s > 0
             ? strprintf(" at the measured %.4g model FLOP/s (median of the last %d steps): %s\n",
                         p.measured_flops_per_s, p.measured_steps, format_hms(p.seconds_left()).c_str())
             : strprintf(" at the rate above: %s\n", format_hms(p.seconds_left()).c_str());
  }
  if (std::isfinite(p.job_seconds_left)) {
    const double need = p.seconds_left();
    s += strprintf("time left  %s in this Slurm job; the rest of the run %s\n", format_hms(p.job_seconds_left).c_str(),
                   need < p.job_seconds_left
                       ? "fits"
                       : strprintf("needs about %.1f jobs of this length (requeue or chain.sh)",
                                   need / std::max(1.0, p.job_seconds_left)).c_str());
  }
  s.pop_back();  // log_info ends the line
  return s;
}

std::string plan_json(const RunPlan& p) {
  using Json = nlohmann::ordered_json;  // in the order of RunPlan
  auto number_or_null = [](double v) { return v > 0 && std::isfinite(v) ? Json(v) : Json(); };
  Json j;
  j["kind"] = "dry_run";
  j["config"] = p.config_file;
  j["ranks"] = p.ranks;
  j["dp"] = p.dp;
  j["tp"] = p.tp;
  j["pp"] = p.pp;
  j["zero_stage"] = p.zero_stage;
  j["precision"] = name_of(p.precision);
  j["num_params_total"] = p.num_params;
  j["num_params_per_rank"] = p.params_per_rank;
  j["memory_bytes_per_rank"] = p.memory_per_rank;
  j["flops_per_token"] = p.flops_per_token;
  j["flops_per_step"] = p.flops_per_step();
  j["train_batch_size"] = p.train_batch_size;
  j["seq_len"] = p.seq_len;
  j["tokens_per_step"] = static_cast<int64_t>(p.tokens_per_step());
  j["train_steps"] = p.train_steps;
  j["tokens"] = static_cast<int64_t>(p.tokens_per_step()) * p.train_steps;
  j["flops"] = p.flops_per_step() * static_cast<double>(p.train_steps);
  j["peak_flops"] = number_or_null(p.peak_flops);
  j["peak_source"] = p.peak_flops > 0 ? p.peak_source : "measured at start";
  j["flops_per_rank"] = p.flops_per_rank;
  j["flops_per_rank_source"] = p.flops_per_rank_source;
  j["seconds"] = p.flops_per_step() * static_cast<double>(p.train_steps) / (p.flops_per_rank * p.ranks);
  j["start_step"] = p.start_step;
  j["resume_from"] = p.resume_from;
  j["measured_flops_per_s"] = number_or_null(p.measured_flops_per_s);
  j["measured_steps"] = p.measured_steps;
  j["seconds_left"] = p.seconds_left();
  j["job_seconds_left"] = number_or_null(p.job_seconds_left);
  j["notices"] = p.notices;
  return config_json::to_text(j);
}

}  // namespace zero3d
