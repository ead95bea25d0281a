#include "train/records.h"

#include <algorithm>
#include <fstream>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/host/cpu_kernels.h"
#include "parallel/watchdog.h"
#include "bench/rates.h"
#include "model/gpt.h"
#include "train/flops_profiler.h"
#include "train/versions.h"

namespace zero3d {

namespace {

// A resumed run appends to the metrics of the run it continues: records of steps after the
// checkpoint (written before the interruption, and about to be redone) are dropped first, so the
// file holds every step once. step = -1 drops every record that has a step.
void drop_metrics_after(const std::string& path, int64_t step) {
  if (!std::ifstream(path)) return;  // none yet (or not readable: left as it is)
  std::string kept;
  for (const MetricsLine& m : read_metrics(path)) {
    const nlohmann::json& r = m.record;
    if (r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() > step) continue;
    kept += m.text + "\n";
  }
  write_file_atomic(path, kept);
}

// Where offloaded state lives, for the run record.
std::string offload_text(const OffloadConfig& o, Backend& be) {
  switch (o.device) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu:
      return be.memory_kind() == MemKind::host ? "cpu: the host backend keeps it in host memory already"
                                               : "cpu: in host memory, AdamW on the CPU, gradients down and weights "
                                                 "up per sub-group through pinned buffers";
    case OffloadDevice::nvme:
      return "nvme: swap files under " + o.nvme_path +
             (be.memory_kind() == MemKind::host ? "" : ", AdamW on the CPU, gradients down and weights up per sub-group");
  }
  return "?";
}

}  // namespace

RunRecords::RunRecords(const Config& c, const RunOptions& o, Backend& be, ProcessGroups& g)
    : cfg_(c), opt_(o), be_(be), groups_(g) {}

void RunRecords::open(int64_t resumed_step, uint64_t cursor) {
  groups_.world->agree([&] {
    if (groups_.world_rank != 0) return;
    nlohmann::json written = cfg_.resolved;  // every value, and where it came from (read back: ignored)
    written["provenance"] = cfg_.provenance;
    write_file_atomic(opt_.run_dir + "/config.json", config_json::to_text(written, 2) + "\n");
    // A fresh start into a run dir that has metrics (a run that died before its first
    // checkpoint) starts its steps over too.
    drop_metrics_after(opt_.run_dir + "/metrics.jsonl", resumed_step);
    metrics_ = std::make_unique<MetricsLog>(opt_.run_dir + "/metrics.jsonl");
    if (cfg_.csv_monitor.enabled)
      csv_ = std::make_unique<CsvMonitor>(cfg_.csv_monitor, opt_.run_dir, static_cast<int64_t>(cursor));
  });
}

void RunRecords::start(const ZeroEngine& engine, const RunFacts& f) {
  const Config& c = cfg_;
  ProcessGroup& world = *groups_.world;
  const int64_t G = c.train_batch_size;
  const int T = c.model.seq_len;
  mem_ = engine.memory();
  mem_bytes_ = world.all_reduce_max(static_cast<int64_t>(mem_.total()));
  swapped_any_ = world.all_reduce_max(static_cast<int64_t>(mem_.swapped)) > 0;
  host_any_ = world.all_reduce_max(static_cast<int64_t>(mem_.host)) > 0;
  const ProcessGroups& g = groups_;
  const JobInfo& job = opt_.job;
  const DType acts = gpt_options(c, be_.kind() == BackendKind::cuda).activations;
  if (metrics_)
    metrics_->write(MetricsRecord("run")
                        .add("backend", be_.describe())
                        .add("world_size", g.topo.world)
                        .add("dp", g.topo.dp)
                        .add("tp", g.topo.tp)
                        .add("pp", g.topo.pp)
                        .add("zero_stage", c.zero.stage)
                        .add("precision", name_of(c.precision))
                        .add("activation_checkpointing", c.activation_checkpointing)
                        .add("mem_activations_bytes", static_cast<int64_t>(f.activation_bytes))
                        .add("num_params", static_cast<int64_t>(engine.layout().num_params))
                        .add("num_params_padded", static_cast<int64_t>(engine.layout().total))
                        .add("num_params_resident", static_cast<int64_t>(engine.layout().resident_size))
                        .add("flops_per_token", f.flops_per_token)
                        .add("peak_flops", opt_.peak_flops)
                        .add("peak_source", opt_.peak_source)
                        .add("train_batch_size", G)
                        .add("seq_len", T)
                        .add("train_steps", c.train_steps)
                        .add("start_step", f.start_step)
                        .add("resumed_from", f.resumed_from)
                        .add("nodes", job.nodes)
                        .add("ranks_per_node", job.local_size)
                        .add("slurm_job", job.slurm_job)
                        .add("omp_num_threads", job.omp_threads)
                        .add("openblas_num_threads", job.blas_threads)
                        .add("threads", job.threads)
                        .add("threads_source", job.threads_source)
                        .add("gemm", be_.describe_gemm())
                        .add("compute", opt_.compute_choice)
                        .add("activations", dtype_name(acts))
                        .add("comm_device_buffers", g.dp->device_path())
                        .add("comm_collectives", g.dp->collectives_path())
                        .add("checkpoint_writes", f.checkpoint_writes)
                        .add("watchdog", Watchdog::running() ? "a thread per rank; on a timeout it asks every rank "
                                                               "where it is (one line per job)"
                                                             : "each rank alone (MPI without MPI_THREAD_MULTIPLE)")
                        .add("time_budget_s", f.time_budget_s)
                        .add("mem_params_bytes", static_cast<int64_t>(mem_.params))
                        .add("mem_grads_bytes", static_cast<int64_t>(mem_.grads))
                        .add("mem_optimizer_bytes", static_cast<int64_t>(mem_.optimizer))
                        .add("mem_buffers_bytes", static_cast<int64_t>(mem_.buffers))
                        .add("mem_swapped_bytes", static_cast<int64_t>(mem_.swapped))
                        .add("mem_host_bytes", static_cast<int64_t>(mem_.host))
                        .add("offload_optimizer", offload_text(c.zero.offload_optimizer, be_))
                        .add("offload_param", c.zero.stage == 3 ? offload_text(c.zero.offload_param, be_) : "none")
                        .add_object("versions", versions().json()));
  log_info("zero3d: %zu parameters per rank, %s, %d ranks (dp %d x tp %d x pp %d, ZeRO stage %d, %s%s), global batch "
           "%lld x %d tokens, %d steps, run dir %s",
           engine.layout().num_params, be_.describe().c_str(), g.topo.world, g.topo.dp, g.topo.tp, g.topo.pp,
           c.zero.stage, name_of(c.precision), acts == DType::bf16 ? ", bf16 activations" : "",
           static_cast<long long>(G), T, c.train_steps, opt_.run_dir.c_str());
}

void RunRecords::start_profiles(int first_step) {
  const Config& c = cfg_;
  if (c.wall_clock_breakdown && be_.profile()) {
    mem_bandwidth_ = measure_copy_bandwidth(be_, 0.2);
    if (be_.kind() == BackendKind::host) compute_peak_ = best_fma_peak(0.1) * cpu::threads();
  }
  CommLog& comms = comm_log();
  comms.enabled = c.comms_logger.enabled, comms.verbose = c.comms_logger.verbose;
  if (!c.comms_logger.prof_all) comms.ops.insert(c.comms_logger.prof_ops.begin(), c.comms_logger.prof_ops.end());
  run_start_ = Clock::now();
  first_step_ = first_step;
  const FlopsProfilerConfig& fp = c.flops_profiler;
  // DeepSpeed profiles when its count of steps done equals profile_step: our step profile_step + 1.
  profiled_step_ = fp.enabled ? fp.profile_step + 1 : 0;
  if (fp.enabled && fp.profile_step < 0)
    log_info("zero3d: notice: flops_profiler.profile_step %d: no step is profiled", fp.profile_step);
  else if (fp.enabled && (profiled_step_ < first_step_ || profiled_step_ > c.train_steps))
    log_warn("flops_profiler.profile_step %d (step %d) is not among this run's steps (%d-%d): no profile",
             fp.profile_step, profiled_step_, first_step_, c.train_steps);
}

void RunRecords::checkpoint(const char* action, int64_t step, const CheckpointIO& io, const SaveResult* save,
                            bool async) {
  if (!metrics_) return;
  MetricsRecord r("checkpoint");
  r.add("step", step)
      .add("action", action)
      .add("file", io.file)
      .add("bytes", static_cast<int64_t>(io.bytes))
      .add("seconds", io.seconds)
      .add("bytes_per_s", io.bytes / io.seconds)
      .add("stage_s", io.stage_s)
      .add("transfer_s", io.transfer_s)
      .add("commit_s", io.commit_s)
      .add("independent_transfers", io.independent);
  if (save) r.add("stall_s", save->stall_s).add("async", async).add("error", save->error);
  metrics_->write(r);
}

void RunRecords::val(int step, double loss, int64_t tokens) {
  if (metrics_) metrics_->write(MetricsRecord("val").add("step", step).add("loss", loss).add("tokens", tokens));
  log_info("step %6d | val loss %.6f", step, loss);
}

// The op profile (wall_clock_breakdown) covers what the step time covers, from the second step:
// validation and the other work between steps is no step's (it made ops 141% of the step).
OpProfile* RunRecords::op_profile() const { return cfg_.wall_clock_breakdown ? be_.profile() : nullptr; }

void RunRecords::begin_step() {
  CommLog& comms = comm_log();
  comms.active = comms.enabled;  // the comms log covers what comm_bytes covers
  if (OpProfile* prof = op_profile()) prof->on = profiling_;
  launches_ = be_.launch_count();
}

void RunRecords::end_step() {
  CommLog& comms = comm_log();
  if (comms.active) comms.active = false, ++comm_steps_;
  if (OpProfile* prof = op_profile()) prof->on = false;
  launches_ = be_.launch_count() - launches_;
}

void RunRecords::step(int step, const StepResult& r, StepRunner& runner, double flops_per_token,
                      double tokens_per_step) {
  const Config& c = cfg_;
  const int64_t G = c.train_batch_size;
  const double tokens_per_s = tokens_per_step / r.step_time;
  const double model_flops = tokens_per_s * flops_per_token;
  const double mfu = model_flops / (opt_.peak_flops * groups_.topo.world);
  if (metrics_) {
    MetricsRecord m("train");
    m.add("step", step).add("loss", r.loss).add("lr", r.lr).add("grad_norm", r.grad_norm)
        .add("loss_scale", r.loss_scale).add("skipped", r.skipped)
        .add("tokens", static_cast<int64_t>(step * tokens_per_step))
        .add("tokens_per_s", tokens_per_s).add("step_time_s", r.step_time)
        .add("model_flops_per_s", model_flops).add("mfu", mfu)
        .add("mem_model_states_bytes", mem_bytes_).add("comm_bytes", r.comm_bytes)
        .add("backend_allocs", static_cast<int64_t>(be_.alloc_count())).add("page_faults", r.faults)
        .add("launches", static_cast<int64_t>(launches_))
        .add("device_mem_peak_bytes", static_cast<int64_t>(be_.device_peak_bytes()));
    if (c.wall_clock_breakdown)
      m.add("forward_s", r.t_fwd).add("backward_s", r.t_bwd).add("reduce_s", r.t_reduce).add("optimizer_s", r.t_opt)
          .add("allgather_s", r.t_gather).add("recompute_s", r.recompute)
          .add("pipeline_idle_s", r.idle_s).add("pipeline_idle_fraction", r.idle_s / r.step_time)
          .add("comm_s", r.comm.busy_s).add("comm_exposed_s", r.comm.exposed_s)
          .add("comm_hidden_s", std::max(0.0, r.comm.busy_s - r.comm.exposed_s)).add("comm_skew_s", r.comm.skew_s);
    if (swapped_any_)  // offload to nvme: I/O time, the part the step waited for, and what it hid
      m.add("swap_io_s", r.swap.busy_s).add("swap_wait_s", r.swap.wait_s)
          .add("swap_hidden_s", std::max(0.0, r.swap.busy_s - r.swap.wait_s))
          .add("swap_read_bytes", static_cast<int64_t>(r.swap.bytes_read))
          .add("swap_written_bytes", static_cast<int64_t>(r.swap.bytes_written));
    if (host_any_)  // optimizer offload from a device: the copies, the part the update waited for, the bytes
      m.add("offload_copy_s", r.swap.copy_s).add("offload_copy_wait_s", r.swap.copy_wait_s)
          .add("offload_copy_hidden_s", std::max(0.0, r.swap.copy_s - r.swap.copy_wait_s))
          .add("offload_down_bytes", static_cast<int64_t>(r.swap.bytes_down))
          .add("offload_up_bytes", static_cast<int64_t>(r.swap.bytes_up));
    metrics_->write(m);
  }
  ModuleProfile& mp = runner.module_profile();
  if (mp.on) {
    mp.on = false;
    const ProfiledStep ps{step, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps, r.t_reduce, r.t_opt,
                          r.t_gather, runner.idle_s(), r.step_time};
    const std::string text = report_flops_profile(c.flops_profiler, c.model, groups_, mp, ps, metrics_.get());
    if (groups_.world_rank == 0) log_info("%s", text.c_str());
  }
  if (csv_) {  // DeepSpeed's event names; the x axis is samples trained
    const int64_t samples = static_cast<int64_t>(step) * G;
    csv_->write("Train/Samples/train_loss", r.loss, samples);
    csv_->write("Train/Samples/lr", r.lr, samples);
    if (c.precision == Precision::fp16) csv_->write("Train/Samples/loss_scale", r.loss_scale, samples);
    csv_->write("Train/Samples/grad_norm", r.grad_norm, samples);
    if (c.wall_clock_breakdown) {
      csv_->write("Train/Samples/elapsed_time_ms_forward", 1e3 * r.t_fwd, samples);
      csv_->write("Train/Samples/elapsed_time_ms_backward", 1e3 * (r.t_bwd + r.t_reduce), samples);
      csv_->write("Train/Samples/elapsed_time_ms_backward_inner", 1e3 * r.t_bwd, samples);
      csv_->write("Train/Samples/elapsed_time_ms_backward_allreduce", 1e3 * r.t_reduce, samples);
      csv_->write("Train/Samples/elapsed_time_ms_step", 1e3 * r.t_opt, samples);
    }
  }
  const bool print = step % c.steps_per_print == 0 || step == c.train_steps;
  if (c.memory_breakdown && print) report_memory(step, runner.activation_bytes());
  if (print) {
    const double elapsed = seconds_since(run_start_);
    log_info("step %6d/%d | loss %.6f | lr %.3e | grad norm %.4f | %.0f tok/s | mfu %.1f%% | eta %s", step,
             c.train_steps, r.loss, r.lr, r.grad_norm, tokens_per_s, 100.0 * mfu,
             format_hms(elapsed / (step - first_step_ + 1) * (c.train_steps - step)).c_str());
  }
}

void RunRecords::after_step(double step_time) {
  if (!op_profile()) return;
  if (profiling_) ++profiled_steps_, profiled_s_ += step_time;
  profiling_ = true;  // from step 2: warm
}

void RunRecords::finish() {
  report_kernels();
  report_comms();
}

// The per-op profile of this rank (wall_clock_breakdown), per step: each op's time, its share of
// the step, the rate it reached, and that rate against its bound: FLOPs / the FMA peak for
// GEMMs and attention, bytes / the copy bandwidth for everything else. Rank 0 prints it and
// writes a "kernels" record.
void RunRecords::report_kernels() {
  OpProfile* prof = be_.profile();
  if (!prof || profiled_steps_ == 0 || groups_.world_rank != 0) return;
  std::vector<std::pair<std::string, OpStat>> ops(prof->ops.begin(), prof->ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double n = profiled_steps_;
  double total = 0;
  for (const auto& [name, st] : ops) total += st.seconds;
  std::string table = strprintf("%-22s %8s %9s %6s %16s %8s\n", "op (rank 0)", "calls", "ms/step", "share",
                                "reached", "of bound");
  MetricsRecord rec("kernels");
  rec.add("steps", profiled_steps_).add("step_s", profiled_s_ / n).add("ops_s", total / n)
      .add("memory_bandwidth", mem_bandwidth_).add("compute_peak", compute_peak_);
  for (const auto& [name, st] : ops) {
    const bool compute = st.flops > 0;
    const double rate = (compute ? st.flops : st.bytes) / st.seconds;
    const double bound = compute ? compute_peak_ : mem_bandwidth_;
    table += strprintf("%-22s %8.0f %9.2f %5.1f%% %9.1f %s %7.0f%%\n", name.c_str(), st.calls / n,
                       1e3 * st.seconds / n, 100 * st.seconds / profiled_s_, rate / 1e9,
                       compute ? "GFLOP/s" : "GB/s   ", 100 * rate / bound);
    rec.add((name + "_s").c_str(), st.seconds / n).add((name + "_of_bound").c_str(), rate / bound);
  }
  log_info("zero3d: kernel profile over %d steps: step %.1f ms, ops %.1f ms (%.0f%%; the rest: communication, "
           "waits, the host loop); bounds: FMA peak %.1f GFLOP/s, copy %.1f GB/s\n%s",
           profiled_steps_, 1e3 * profiled_s_ / n, 1e3 * total / n, 100 * total / profiled_s_, compute_peak_ / 1e9,
           mem_bandwidth_ / 1e9, table.c_str());
  if (metrics_) metrics_->write(rec);
}

void RunRecords::report_comms() {
  const CommLog& log = comm_log();
  if (!log.enabled || comm_steps_ == 0 || groups_.world_rank != 0) return;
  const std::string table = zero3d::report_comms(log, metrics_.get(), comm_steps_);
  log_info("zero3d: communication of rank 0 over %d steps (comms_logger)\n%s", comm_steps_, table.c_str());
}

// memory_breakdown: every rank's model states, buffers, activations and resident memory, printed
// by rank 0 one line per rank and written as "memory" records.
void RunRecords::report_memory(int step, uint64_t activation_bytes) {
  const ResidentMemory rss = resident_memory();
  const std::vector<uint64_t> mine = {mem_.params, mem_.grads, mem_.optimizer, mem_.buffers, activation_bytes,
                                      static_cast<uint64_t>(rss.rss), static_cast<uint64_t>(rss.peak), mem_.swapped,
                                      mem_.host, static_cast<uint64_t>(rss.pss)};
  std::vector<uint64_t> all;
  groups_.world->all_gather_u64(mine, all);
  if (groups_.world_rank != 0) return;
  std::string lines;
  for (size_t r = 0; r * mine.size() < all.size(); ++r) {
    const uint64_t* v = &all[r * mine.size()];
    lines += strprintf("  rank %3zu: params %.1f MB, grads %.1f MB, optimizer %.1f MB, buffers %.1f MB, activations "
                       "%.1f MB, resident %.1f MB (peak %.1f MB; its share of the node %.1f MB)%s%s\n",
                       r, v[0] / 1e6, v[1] / 1e6, v[2] / 1e6, v[3] / 1e6, v[4] / 1e6, v[5] / 1e6, v[6] / 1e6,
                       v[9] / 1e6,
                       (v[8] ? strprintf(", offloaded to host memory %.1f MB", v[8] / 1e6) : std::string()).c_str(),
                       v[7] ? strprintf(", swapped to nvme %.1f MB", v[7] / 1e6).c_str() : "");
    if (metrics_)
      metrics_->write(MetricsRecord("memory")
                          .add("step", step)
                          .add("rank", static_cast<int64_t>(r))
                          .add("params_bytes", static_cast<int64_t>(v[0]))
                          .add("grads_bytes", static_cast<int64_t>(v[1]))
                          .add("optimizer_bytes", static_cast<int64_t>(v[2]))
                          .add("buffers_bytes", static_cast<int64_t>(v[3]))
                          .add("activations_bytes", static_cast<int64_t>(v[4]))
                          .add("rss_bytes", static_cast<int64_t>(v[5]))
                          .add("rss_peak_bytes", static_cast<int64_t>(v[6]))
                          .add("pss_bytes", static_cast<int64_t>(v[9]))
                          .add("swapped_bytes", static_cast<int64_t>(v[7]))
                          .add("host_bytes", static_cast<int64_t>(v[8])));
  }
  log_info("zero3d: memory after step %d (memory_breakdown)\n%s", step, lines.c_str());
}

}  // namespace zero3d
