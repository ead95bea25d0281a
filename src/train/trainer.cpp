#include "train/trainer.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <nlohmann/json.hpp>
#include <optional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <algorithm>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "data/loader.h"
#include "io/checkpoint.h"
#include "io/ckpt_writer.h"
#include "io/storage.h"
#include "io/swap_file.h"
#include "parallel/watchdog.h"
#include "model/gpt.h"
#include "optim/lr_schedule.h"
#include "train/bench.h"
#include "kernels/host/cpu_kernels.h"
#include "train/metrics.h"
#include "train/monitors.h"
#include "train/flops_profiler.h"
#include "train/fault.h"
#include "train/stop_signal.h"  // the flag; cmd_train installs the handlers
#include "parallel/schedule.h"
#include "zero/engine.h"
#include "zero/engine_faults.h"
#include "zero/loss_scaler.h"

namespace zero3d {

namespace fs = std::filesystem;

// Minor page faults of this process so far: first touches of fresh memory (1-2.5 GB/s in a VM).
static int64_t minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

struct Trainer::State {
  State(const Config& c, const RunOptions& o, Backend& b, ProcessGroups& g, const SwapFiles& swap_files)
      : cfg(c), opt(o), be(b), groups(g), micro(c.train_micro_batch_size_per_gpu), T(c.model.seq_len),
        dp(g.topo.dp), dp_rank(g.coord.dp),
        train_data(c.data.train, c.model.seq_len, c.model.vocab_size, c.seed, /*shuffle=*/true),
        engine(b, *g.dp, c.model, c.zero, c.optimizer, c.precision, g.topo.tp, g.coord.tp, g.topo.pp, g.coord.pp,
               swap_files),
        stage(pipeline_stage(c.model, g.topo.pp, g.coord.pp)), scaler(c.fp16), swap(swap_files) {
    // 1F1B keeps at most pp - stage micro-batches in flight: one set of activations each.
    const int slots = g.topo.pp == 1 ? 1 : std::min(g.topo.pp - g.coord.pp, c.gradient_accumulation_steps);
    for (int k = 0; k < slots; ++k)
      models.push_back(std::make_unique<GPT>(b, c.model, micro, engine, GPTOptions{c.activation_checkpointing},
                                             g.tp.get(), stage));
    sends.resize(slots);
    if (c.flops_profiler.enabled) {
      module_profile.modules = gpt_modules(c.model, micro, g.topo.tp, g.coord.tp, g.topo.pp, g.coord.pp);
      for (auto& m : models) m->set_module_profile(&module_profile);
    }
    schedule = one_f_one_b(g.coord.pp, g.topo.pp, c.gradient_accumulation_steps);
    if (!c.data.val.empty())
      val_data = std::make_unique<DataLoader>(c.data.val, c.model.seq_len, c.model.vocab_size, c.seed, false);
    inputs.resize(static_cast<size_t>(micro) * T);
    targets.resize(inputs.size());
  }

  const Config& cfg;
  RunOptions opt;
  Backend& be;
  ProcessGroups& groups;
  int micro, T, dp, dp_rank;
  DataLoader train_data;
  std::unique_ptr<DataLoader> val_data;
  ZeroEngine engine;
  PipelineStage stage;
  LossScaler scaler;
  SwapFiles swap;  // this rank's swap files (offload to nvme), for the truncate_swap fault
  std::vector<std::unique_ptr<GPT>> models;       // one per micro-batch in flight (1 without pp)
  std::vector<std::vector<PendingOp>> sends;      // per model: p2p sends still in flight
  std::vector<PipeStep> schedule;                 // this stage's 1F1B operation list
  double pipeline_idle_s = 0;                     // time spent waiting for the neighbours this step
  std::vector<int32_t> inputs, targets;
  std::unique_ptr<MetricsLog> metrics;  // rank 0 only
  uint64_t cursor = 0;                  // global samples consumed
  double flops_per_token = 0;
  std::string ckpt_dir;                 // checkpoint.dir, or <run dir>/checkpoints
  int64_t start_step = 0;               // steps already taken (from the checkpoint resumed)
  std::optional<LoadedCheckpoint> resumed;
  // The wall-time budget: run.max_minutes and the Slurm job's end time, from construction.
  Clock::time_point t_start = Clock::now();
  double time_budget_s = std::numeric_limits<double>::infinity();
  double max_step_s = 0;    // slowest step so far
  // wall_clock_breakdown: the backend's per-op timers from step 2 on, and their bounds.
  int profiled_steps = 0;
  double profiled_s = 0, mem_bandwidth = 0, compute_peak = 0;
  void report_kernels();
  // DeepSpeed's monitors: csv_monitor (rank 0), comms_logger, memory_breakdown.
  std::unique_ptr<CsvMonitor> csv;
  int comm_steps = 0;  // steps the comms log covers
  ModuleProfile module_profile;  // flops_profiler: the models' module timers
  void report_comms();
  void report_memory(int step);
  double last_save_s = 0;   // the last checkpoint's save time (before the first: an estimate)
  std::unique_ptr<DirLock> lock;            // rank 0: this run owns the run dir
  std::unique_ptr<DirLock> ckpt_lock;       // rank 0: and is the one writer of the checkpoint dir
  std::unique_ptr<CheckpointWriter> writer;  // saves (io/ckpt_writer.h)
  void check_storage();
  void finish_save(const SaveResult& r);
  // What `latest` holds (this run's last committed save, or the checkpoint resumed; 0: none), and
  // the last save's error ("" = committed), for the lines that end a run.
  int64_t committed_step = 0;
  std::string last_save_error;
  bool stopping = false;  // a stop signal or the time budget: this step's save is the last
  std::string latest_text() const;
  // Divergence (max_nonfinite_steps): steps in a row whose loss or gradient norm is not finite,
  // and whether this step's loss is, agreed over the world.
  int nonfinite_steps = 0;
  bool loss_nonfinite = false;
  // The run's phases (Trainer::run) and what they share, set by start_run.
  struct StepResult;
  void start_run();
  StepResult train_step(int step);
  void report_step(int step, const StepResult& r);
  int step_boundary(int step, const StepResult& r);
  void check_divergence(int step, const StepResult& r);
  void check_final_state(int step, bool save_due);
  double tokens_per_step = 0;
  MemoryAccount mem;
  int64_t mem_bytes = 0;
  bool mem_swapped_any = false;  // some rank offloads to nvme
  bool mem_host_any = false;     // some rank offloads its optimizer from a device to host memory
  bool validating = false;
  Fault fault = Fault::from_env();  // ZERO3D_FAULT, read once
  Clock::time_point run_start;
  int first_step = 1, profiled_step = 0;  // profiled_step 0: none

  bool is_root() const { return groups.world_rank == 0; }
  bool out_of_time() const;
  void save(int step);
  void write_io_record(const char* action, int64_t step, const CheckpointIO& io, const SaveResult* save = nullptr);
  double validate(int step);
  double train_micro_batches(float dloss, double& t_fwd, double& t_bwd);
  void receive(float* buf, int peer, int tag);
  size_t activation_elems() const { return static_cast<size_t>(micro) * T * cfg.model.d_model; }
};

static void create_directory(const std::string& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(strprintf("cannot create %s '%s': %s", what, dir.c_str(), ec.message().c_str()));
}

// A resumed run appends to the metrics of the run it continues: records of steps after the
// checkpoint (written before the interruption, and about to be redone) are dropped first, so the
// file holds every step once. step = -1 drops every record that has a step.
static void drop_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      throw UserError(strprintf("%s:%d: not a JSON record; cannot continue this run's metrics", path.c_str(), n));
    }
    if (r.contains("step") && r["step"].is_number_integer() && r["step"].get<int64_t>() > step) continue;
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

// Offload to nvme: this rank's swap files under each nvme_path (checked: a writable directory),
// after the files of runs that died there are removed. Collective over the world (UserError on all).
static SwapFiles prepare_swap(const Config& c, const RunOptions& o, ProcessGroups& g) {
  SwapFiles files;
  files.aio = c.aio;
  auto file_for = [&](const OffloadConfig& off, const char* key, const char* what) {
    if (off.device != OffloadDevice::nvme) return std::string();
    std::error_code ec;
    if (!fs::is_directory(off.nvme_path, ec))
      throw UserError(strprintf("zero_optimization.%s.nvme_path '%s' is not a directory (create it on the storage to "
                                "swap to, e.g. node-local NVMe)", key, off.nvme_path.c_str()));
    if (const std::string e = probe_writable(off.nvme_path, g.world_rank); !e.empty())
      throw UserError(strprintf("zero_optimization.%s.nvme_path is not writable from rank %d: %s", key, g.world_rank,
                                e.c_str()));
    const std::string dir = swap_dir(off.nvme_path, o.run_dir);
    uint64_t bytes = 0;
    if (const int n = remove_dead_swap_files(off.nvme_path, &bytes); n > 0)
      log_warn("removed %d swap files (%.2f GB) under %s left by runs that died", n, bytes / 1e9,
               off.nvme_path.c_str());
    return strprintf("%s/rank%d.%d.%s", dir.c_str(), g.world_rank, static_cast<int>(getpid()), what);
  };
  g.world->agree([&] {
    files.optimizer = file_for(c.zero.offload_optimizer, "offload_optimizer", "optimizer");
    if (c.zero.stage == 3) files.param = file_for(c.zero.offload_param, "offload_param", "param");
  });
  g.world->agree([&] {  // after every rank's clean-up: the directories, made by whoever comes first
    for (const std::string& f : {files.optimizer, files.param}) {
      std::error_code ec;
      if (!f.empty() && !fs::create_directories(fs::path(f).parent_path(), ec) && ec)
        throw UserError(strprintf("cannot create the swap directory for '%s': %s", f.c_str(), ec.message().c_str()));
    }
  });
  return files;
}

Trainer::Trainer(const Config& config, const RunOptions& options, Backend& backend, ProcessGroups& groups) {
  ProcessGroup& world = *groups.world;
  comm_context().timeout_s = config.comm_timeout_s;
  const SwapFiles swap = prepare_swap(config, options, groups);
  world.agree([&] { s_ = std::make_unique<State>(config, options, backend, groups, swap); });
  State& s = *s_;
  if (config.max_minutes > 0) s.time_budget_s = config.max_minutes * 60;
  s.time_budget_s = std::min(s.time_budget_s, options.job.seconds_left);
  // Before the first save, a checkpoint is estimated at 100 MB/s (fp32 weights, m and v; plus a
  // 16-bit copy and the master in mixed precision).
  double elems = 0;
  for (const ParamInfo& p : gpt_param_table(config.model)) elems += static_cast<double>(p.size);
  s.last_save_s = elems * (config.precision == Precision::fp32 ? 12 : 18) / 1e8;
  s.engine.init_weights(config.seed);
  s.flops_per_token = gpt_flops_per_token(config.model);
  if (s.opt.peak_flops <= 0 && backend.kind() == BackendKind::host) {
    // A CPU: the FMA peak of one core (the best window of any rank) x the cores the run computes
    // on. peak_flops is per rank, as MFU divides by the world.
    const double core = world.all_reduce_max(best_fma_peak(0.2));
    const int cores = s.opt.job.compute_cores;
    s.opt.peak_flops = core * cores / world.size();
    s.opt.peak_source = strprintf("FMA peak %s x %d cores: %.1f GFLOP/s per core (the best 2 ms window of any "
                                  "rank), %.1f GFLOP/s in all",
                                  cpu::select().isa, cores, core / 1e9, core * cores / 1e9);
  } else if (s.opt.peak_flops <= 0) {  // an accelerator without a known peak: its sgemm rate
    GemmRate r = measure_gemm(backend, 1024, 1024, 1024, 1.0);
    s.opt.peak_flops = r.flops_per_s;
    s.opt.peak_source = strprintf("measured sgemm 1024^3 on rank 0 (%.1f GFLOP/s)", r.flops_per_s / 1e9);
    world.broadcast(host_mem(&s.opt.peak_flops), sizeof(double), 0);
  }
  // Resume before anything is written: a checkpoint that does not load is an input error too.
  s.ckpt_dir = config.checkpoint.dir.empty() ? s.opt.run_dir + "/checkpoints" : config.checkpoint.dir;
  if (s.fault.at("pause_load", groups.world_rank, 0)) pause_for_fault_injection("before it loads a checkpoint");
  s.resumed = load_checkpoint({config, groups, s.engine}, config.checkpoint.load, config.checkpoint.load_path, s.ckpt_dir,
                              config.checkpoint.timeout_s);
  if (s.resumed) {
    const TrainingState& st = s.resumed->state;
    s.start_step = st.step;
    s.cursor = st.data_cursor;
    s.committed_step = st.step;
    if (st.loss_scaler_dynamic && s.scaler.dynamic()) s.scaler.restore(st.loss_scaler);
  }
  // Everything above validated the inputs; only now does the run directory appear, locked by
  // this run, with the checkpoint directory checked (and locked) before anything is written there.
  bool created_run_dir = false;
  world.agree([&] {
    if (!s.is_root()) return;
    std::error_code ec;
    created_run_dir = !fs::exists(s.opt.run_dir, ec);
    try {
      create_directory(s.opt.run_dir, "run directory");
      std::string warning;
      s.lock = std::make_unique<DirLock>(s.opt.run_dir, "run directory", "another --run-dir", warning);
      if (!warning.empty()) log_warn("%s", warning.c_str());
      if (config.checkpoint.save_interval > 0) create_directory(s.ckpt_dir, "checkpoint directory (checkpoint.dir)");
    } catch (const UserError&) {  // leave no trace of this run: it never started
      s.lock.reset();
      if (created_run_dir) fs::remove_all(s.opt.run_dir, ec);
      throw;
    }
  });
  s.writer = std::make_unique<CheckpointWriter>(CheckpointRun{config, groups, s.engine}, s.ckpt_dir, config.checkpoint,
                                                s.opt.run_dir + "/hdf5_errors.log");
  if (config.checkpoint.save_interval > 0) {
    try {
      s.check_storage();
    } catch (const UserError&) {  // leave no trace of this run: it never started
      if (s.is_root()) {
        s.ckpt_lock.reset();
        s.lock.reset();
        std::error_code ec;
        fs::remove(s.ckpt_dir, ec);  // only if empty
        if (created_run_dir) fs::remove(s.opt.run_dir, ec);
      }
      throw;
    }
  }
  world.agree([&] {
    if (!s.is_root()) return;
    nlohmann::json written = config.resolved;  // every value, and where it came from (read back: ignored)
    written["provenance"] = config.provenance;
    write_file_atomic(s.opt.run_dir + "/config.json", written.dump(2) + "\n");
    // A fresh start into a run dir that has metrics (a run that died before its first
    // checkpoint) starts its steps over too.
    drop_metrics_after(s.opt.run_dir + "/metrics.jsonl", s.resumed ? s.start_step : -1);
    s.metrics = std::make_unique<MetricsLog>(s.opt.run_dir + "/metrics.jsonl");
    if (config.csv_monitor.enabled)
      s.csv = std::make_unique<CsvMonitor>(config.csv_monitor, s.opt.run_dir, static_cast<int64_t>(s.cursor));
  });
}

// The checkpoint directory, before training: writable from every rank's node (a probe file each),
// locked by this run (two runs saving into one directory would prune each other's checkpoints),
// and (rank 0) with room for the checkpoints this run keeps. Partial files of saves that died are
// removed once the lock is held. UserError (exit 2) naming the numbers or the holder.
void Trainer::State::check_storage() {
  ProcessGroup& world = *groups.world;
  world.agree([&] {
    if (const std::string e = probe_writable(ckpt_dir, groups.world_rank); !e.empty())
      throw UserError(strprintf("checkpoint directory (checkpoint.dir) is not writable from rank %d: %s",
                                groups.world_rank, e.c_str()));
  });
  world.agree([&] {
    if (!is_root()) return;
    std::error_code ec;
    std::string warning;
    if (!fs::equivalent(ckpt_dir, opt.run_dir, ec))  // else the run dir's lock is this one
      ckpt_lock = std::make_unique<DirLock>(ckpt_dir, "checkpoint directory (checkpoint.dir)",
                                            "another checkpoint.dir", warning);
    if (!warning.empty()) log_warn("%s", warning.c_str());
    remove_partial_saves(ckpt_dir);
  });
  world.agree([&] {
    if (!is_root()) return;
    const int interval = cfg.checkpoint.save_interval;
    const int64_t saves = (cfg.train_steps - start_step) / interval + ((cfg.train_steps - start_step) % interval != 0);
    const int64_t existing = static_cast<int64_t>(list_checkpoints(ckpt_dir).size());
    const uint64_t need = checkpoint_space_needed(writer->file_bytes(), saves, cfg.checkpoint.keep_last, existing);
    const int64_t have = free_bytes(ckpt_dir);
    if (have >= 0 && static_cast<uint64_t>(have) < need)
      throw UserError(strprintf(
          "checkpoint directory '%s' has %.1f MB free, but this run needs %.1f MB more there (%lld saves of %.1f MB, "
          "checkpoint.keep_last %d, %lld checkpoints there now): free space, lower keep_last or set checkpoint.dir",
          ckpt_dir.c_str(), have / 1e6, need / 1e6, (long long)saves, writer->file_bytes() / 1e6,
          cfg.checkpoint.keep_last, (long long)existing));
  });
}

Trainer::~Trainer() = default;

// Would another step and then a checkpoint overrun the budget?
bool Trainer::State::out_of_time() const {
  return seconds_since(t_start) + max_step_s + last_save_s > time_budget_s;
}

void Trainer::State::write_io_record(const char* action, int64_t step, const CheckpointIO& io, const SaveResult* save) {
  if (!metrics) return;
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
  if (save) r.add("stall_s", save->stall_s).add("async", writer->async()).add("error", save->error);
  metrics->write(r);
}

// A checkpoint of the state after `step` (collective): the previous save's result first, then
// this one staged and written (in the background, or before this returns).
void Trainer::State::save(int step) {
  if (writer->pending()) finish_save(writer->wait());
  TrainingState st;
  st.step = step;
  st.optimizer_steps = engine.optimizer_steps();
  st.data_cursor = cursor;
  st.loss_scaler_dynamic = scaler.dynamic();
  st.loss_scaler = scaler.state();
  if (is_root()) {  // it may be a stop before any interval checkpoint (checkpoint.save_interval = 0)
    std::error_code ec;
    fs::create_directories(ckpt_dir, ec);  // a failure here fails the save, cleanly (the writer reports it)
  }
  const std::string filler = ckpt_dir + "/.fill";
  if (fault.at("fill_disk", groups.world_rank, step)) {
    const int64_t left = free_bytes(ckpt_dir) - (512 << 10);
    std::FILE* f = std::fopen(filler.c_str(), "wb");
    if (f && left > 0 && posix_fallocate(fileno(f), 0, left) == 0)
      log_warn("fault injection: filled the checkpoint file system before the save of step %d", step);
    if (f) std::fclose(f);
  }
  if (fault.at("free_disk", groups.world_rank, step)) std::remove(filler.c_str());
  groups.world->barrier();  // the directory exists before anyone opens the file
  const int r = groups.world_rank;
  writer->save(st, {fault.at("stall_save", r, step), fault.at("pause_save_start", r, step),
                    fault.at("pause_save_middle", r, step)});
  if (!writer->async()) finish_save(writer->wait());
}

// A save that finished (committed or failed, alike on every rank): its record and line, and what
// a failure means (checkpoint.on_failure): a RunError (exit 7, on every rank) or a warning.
void Trainer::State::finish_save(const SaveResult& r) {
  write_io_record("save", r.step, r.io, &r);
  last_save_error = r.error;
  if (!r.error.empty()) {
    if (cfg.checkpoint.on_failure == "stop")
      throw RunError(r.error + "; stopping (checkpoint.on_failure = stop): fix the storage, then run again with "
                               "checkpoint.load=auto to resume from the last committed checkpoint",
                     kExitCheckpointFailed);
    // The run's last save: check_final_state says it, in the run's last line.
    if (is_root() && !stopping && r.step < cfg.train_steps)
      log_warn("%s; training goes on and tries again at the next interval (checkpoint.on_failure = continue)",
               r.error.c_str());
    return;
  }
  last_save_s = r.io.seconds;
  committed_step = r.step;
  log_info("step %6lld | checkpoint %s: %.1f MB in %.2f s (%.1f MB/s), training waited %.2f s", (long long)r.step,
           r.io.file.c_str(), r.io.bytes / 1e6, r.io.seconds, r.io.bytes / 1e6 / r.io.seconds, r.stall_s);
}

// The validation set: global batch k is val samples [k*micro*dp, (k+1)*micro*dp), each rank
// taking its slice; the loss is the mean over all of them.
double Trainer::State::validate(int step) {
  const int batches = cfg.data.val_batches;
  ProcessGroup& pp = *groups.pp;
  GPT& model = *models[0];
  double sum = 0;
  for (int k = 0; k < batches; ++k) {  // a forward-only pipeline: each stage waits for the previous
    val_data->load((static_cast<uint64_t>(k) * dp + dp_rank) * micro, micro, inputs.data(), targets.data());
    if (!stage.first()) receive(model.input_activation(), pp.rank() - 1, 0);
    sum += model.forward(inputs.data(), targets.data(), 0.0f);
    if (!stage.last()) pp.isend(be.mem(model.output_activation()), activation_elems(), pp.rank() + 1, 0).wait();
  }
  sum = pp.all_reduce_sum(sum);  // the loss is known on the last stage only
  const double loss = groups.dp->all_reduce_sum(sum) / (static_cast<double>(batches) * dp);
  if (metrics)
    metrics->write(MetricsRecord("val").add("step", step).add("loss", loss).add(
        "tokens", static_cast<int64_t>(batches) * micro * dp * T));
  log_info("step %6d | val loss %.6f", step, loss);
  return loss;
}

void Trainer::State::receive(float* buf, int peer, int tag) {
  const auto t0 = Clock::now();
  groups.pp->irecv(be.mem(buf), activation_elems(), peer, tag).wait();
  pipeline_idle_s += seconds_since(t0);
}

// Forward and backward of this step's micro-batches on this rank's slice of the global batch
// (samples [dp_rank*micro*gas, (dp_rank+1)*micro*gas) from the cursor), in the stage's 1F1B
// order. Returns the summed loss (on the last stage; 0 elsewhere).
double Trainer::State::train_micro_batches(float dloss, double& t_fwd, double& t_bwd) {
  const int gas = cfg.gradient_accumulation_steps;
  const int K = static_cast<int>(models.size());
  ProcessGroup& pp = *groups.pp;
  auto sample = [&](int m) { return cursor + (static_cast<uint64_t>(dp_rank) * gas + m) * micro; };
  // Tags: activations 2m, gradients 2m + 1 (one stream per neighbour and direction, in order).
  double loss_sum = 0;
  pipeline_idle_s = 0;
  for (const PipeStep& op : schedule) {
    const int slot = op.micro_batch % K;
    GPT& model = *models[slot];
    const bool sending = op.op == PipeOp::send_activation || op.op == PipeOp::send_grad;
    if (!sending) {  // anything that writes a slot's buffers waits for the sends still reading them
      for (auto& s : sends[slot]) s.wait();
      sends[slot].clear();
    }
    switch (op.op) {
      case PipeOp::recv_activation:
        receive(model.input_activation(), op.peer_stage, 2 * op.micro_batch);
        break;
      case PipeOp::forward: {
        train_data.load(sample(op.micro_batch), micro, inputs.data(), targets.data());
        const auto t0 = Clock::now();
        loss_sum += model.forward(inputs.data(), targets.data(), dloss);
        t_fwd += seconds_since(t0);
        break;
      }
      case PipeOp::send_activation:
        sends[slot].push_back(pp.isend(be.mem(model.output_activation()), activation_elems(), op.peer_stage, 2 * op.micro_batch));
        break;
      case PipeOp::recv_grad:
        receive(model.output_gradient(), op.peer_stage, 2 * op.micro_batch + 1);
        break;
      case PipeOp::backward: {
        const auto t0 = Clock::now();
        model.backward();
        if (cfg.wall_clock_breakdown) be.synchronize();
        t_bwd += seconds_since(t0);
        break;
      }
      case PipeOp::send_grad:
        sends[slot].push_back(pp.isend(be.mem(model.input_gradient()), activation_elems(), op.peer_stage, 2 * op.micro_batch + 1));
        break;
    }
  }
  for (auto& slot_sends : sends) {
    for (auto& s : slot_sends) s.wait();
    slot_sends.clear();
  }
  return loss_sum;
}

// The per-op profile of this rank (wall_clock_breakdown), per step: each op's time, its share of
// the step, the rate it reached, and that rate against its bound: FLOPs / the FMA peak for
// GEMMs and attention, bytes / the copy bandwidth for everything else. Rank 0 prints it and
// writes a "kernels" record.
void Trainer::State::report_kernels() {
  OpProfile* prof = be.profile();
  if (!prof || profiled_steps == 0 || !is_root()) return;
  std::vector<std::pair<std::string, OpStat>> ops(prof->ops.begin(), prof->ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double n = profiled_steps;
  double total = 0;
  for (const auto& [name, st] : ops) total += st.seconds;
  std::string table = strprintf("%-22s %8s %9s %6s %16s %8s\n", "op (rank 0)", "calls", "ms/step", "share",
                                "reached", "of bound");
  MetricsRecord rec("kernels");
  rec.add("steps", profiled_steps).add("step_s", profiled_s / n).add("ops_s", total / n)
      .add("memory_bandwidth", mem_bandwidth).add("compute_peak", compute_peak);
  for (const auto& [name, st] : ops) {
    const bool compute = st.flops > 0;
    const double rate = (compute ? st.flops : st.bytes) / st.seconds;
    const double bound = compute ? compute_peak : mem_bandwidth;
    table += strprintf("%-22s %8.0f %9.2f %5.1f%% %9.1f %s %7.0f%%\n", name.c_str(), st.calls / n,
                       1e3 * st.seconds / n, 100 * st.seconds / profiled_s, rate / 1e9, compute ? "GFLOP/s" : "GB/s   ",
                       100 * rate / bound);
    rec.add((name + "_s").c_str(), st.seconds / n).add((name + "_of_bound").c_str(), rate / bound);
  }
  log_info("zero3d: kernel profile over %d steps: step %.1f ms, ops %.1f ms (%.0f%%; the rest: communication, "
           "waits, the host loop); bounds: FMA peak %.1f GFLOP/s, copy %.1f GB/s\n%s",
           profiled_steps, 1e3 * profiled_s / n, 1e3 * total / n, 100 * total / profiled_s, compute_peak / 1e9,
           mem_bandwidth / 1e9, table.c_str());
  if (metrics) metrics->write(rec);
}

void Trainer::State::report_comms() {
  const CommLog& log = comm_log();
  if (!log.enabled || comm_steps == 0 || !is_root()) return;
  const std::string table = zero3d::report_comms(log, metrics.get(), comm_steps);
  log_info("zero3d: communication of rank 0 over %d steps (comms_logger)\n%s", comm_steps, table.c_str());
}

// memory_breakdown: every rank's model states, buffers, activations and resident memory, printed
// by rank 0 one line per rank and written as "memory" records.
void Trainer::State::report_memory(int step) {
  const ResidentMemory rss = resident_memory();
  const std::vector<uint64_t> mine = {mem.params, mem.grads, mem.optimizer, mem.buffers,
                                      models.size() * models[0]->activation_bytes(), static_cast<uint64_t>(rss.rss),
                                      static_cast<uint64_t>(rss.peak), mem.swapped, mem.host};
  std::vector<uint64_t> all;
  groups.world->all_gather_u64(mine, all);
  if (!is_root()) return;
  std::string lines;
  for (size_t r = 0; r * mine.size() < all.size(); ++r) {
    const uint64_t* v = &all[r * mine.size()];
    lines += strprintf("  rank %3zu: params %.1f MB, grads %.1f MB, optimizer %.1f MB, buffers %.1f MB, activations "
                       "%.1f MB, resident %.1f MB (peak %.1f MB)%s%s\n",
                       r, v[0] / 1e6, v[1] / 1e6, v[2] / 1e6, v[3] / 1e6, v[4] / 1e6, v[5] / 1e6, v[6] / 1e6,
                       (v[8] ? strprintf(", offloaded to host memory %.1f MB", v[8] / 1e6) : std::string()).c_str(),
                       v[7] ? strprintf(", swapped to nvme %.1f MB", v[7] / 1e6).c_str() : "");
    if (metrics)
      metrics->write(MetricsRecord("memory")
                         .add("step", step)
                         .add("rank", static_cast<int64_t>(r))
                         .add("params_bytes", static_cast<int64_t>(v[0]))
                         .add("grads_bytes", static_cast<int64_t>(v[1]))
                         .add("optimizer_bytes", static_cast<int64_t>(v[2]))
                         .add("buffers_bytes", static_cast<int64_t>(v[3]))
                         .add("activations_bytes", static_cast<int64_t>(v[4]))
                         .add("rss_bytes", static_cast<int64_t>(v[5]))
                         .add("rss_peak_bytes", static_cast<int64_t>(v[6]))
                         .add("swapped_bytes", static_cast<int64_t>(v[7]))
                         .add("host_bytes", static_cast<int64_t>(v[8])));
  }
  log_info("zero3d: memory after step %d (memory_breakdown)\n%s", step, lines.c_str());
}

// What one step measured and decided, for the phases after it.
struct Trainer::State::StepResult {
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
  bool skipped = false;
  double t_fwd = 0, t_bwd = 0, t_reduce = 0, t_opt = 0, t_gather = 0, step_time = 0, idle_s = 0, recompute = 0;
  int64_t faults = 0, comm_bytes = 0;
  CommTime comm;  // wall_clock_breakdown: the data collectives' time and its exposed part (slowest rank's)
  SwapIo swap;  // offload to nvme: the slowest rank's waits and I/O time, and the bytes of all ranks
};

// Where offloaded state lives, for the run record.
static std::string offload_text(const OffloadConfig& o, Backend& be) {
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

// The run record, the start line, the resume record, validation at step 0, the profilers' bounds.
void Trainer::State::start_run() {
  const Config& c = cfg;
  ProcessGroup& world = *groups.world;
  const int64_t G = c.train_batch_size;
  tokens_per_step = static_cast<double>(G) * T;
  mem = engine.memory();
  mem_bytes = world.all_reduce_max(static_cast<int64_t>(mem.total()));
  mem_swapped_any = world.all_reduce_max(static_cast<int64_t>(mem.swapped)) > 0;
  mem_host_any = world.all_reduce_max(static_cast<int64_t>(mem.host)) > 0;
  if (metrics)
    metrics->write(MetricsRecord("run")
                         .add("backend", be.describe())
                         .add("world_size", groups.topo.world)
                         .add("dp", dp)
                         .add("tp", groups.topo.tp)
                         .add("pp", groups.topo.pp)
                         .add("zero_stage", c.zero.stage)
                         .add("precision", name_of(c.precision))
                         .add("activation_checkpointing", c.activation_checkpointing)
                         .add("mem_activations_bytes", static_cast<int64_t>(models.size() * models[0]->activation_bytes()))
                         .add("num_params", static_cast<int64_t>(engine.layout().num_params))
                         .add("num_params_padded", static_cast<int64_t>(engine.layout().total))
                         .add("num_params_resident", static_cast<int64_t>(engine.layout().resident_size))
                         .add("flops_per_token", flops_per_token)
                         .add("peak_flops", opt.peak_flops)
                         .add("peak_source", opt.peak_source)
                         .add("train_batch_size", G)
                         .add("seq_len", T)
                         .add("train_steps", c.train_steps)
                         .add("start_step", start_step)
                         .add("resumed_from", resumed ? resumed->io.file : std::string())
                         .add("nodes", opt.job.nodes)
                         .add("ranks_per_node", opt.job.local_size)
                         .add("slurm_job", opt.job.slurm_job)
                         .add("omp_num_threads", opt.job.omp_threads)
                         .add("openblas_num_threads", opt.job.blas_threads)
                         .add("threads", opt.job.threads)
                         .add("threads_source", opt.job.threads_source)
                         .add("gemm", be.describe_gemm())
                         .add("compute", opt.compute_choice)
                         .add("comm_device_buffers", groups.dp->device_path())
                         .add("comm_collectives", groups.dp->collectives_path())
                         .add("checkpoint_writes", writer->mode())
                         .add("watchdog", Watchdog::running() ? "a thread per rank; on a timeout it asks every rank "
                                                                "where it is (one line per job)"
                                                              : "each rank alone (MPI without MPI_THREAD_MULTIPLE)")
                         .add("time_budget_s", time_budget_s)
                         .add("mem_params_bytes", static_cast<int64_t>(mem.params))
                         .add("mem_grads_bytes", static_cast<int64_t>(mem.grads))
                         .add("mem_optimizer_bytes", static_cast<int64_t>(mem.optimizer))
                         .add("mem_buffers_bytes", static_cast<int64_t>(mem.buffers))
                         .add("mem_swapped_bytes", static_cast<int64_t>(mem.swapped))
                         .add("mem_host_bytes", static_cast<int64_t>(mem.host))
                         .add("offload_optimizer", offload_text(c.zero.offload_optimizer, be))
                         .add("offload_param", c.zero.stage == 3 ? offload_text(c.zero.offload_param, be) : "none"));
  log_info("zero3d: %zu parameters per rank, %s, %d ranks (dp %d x tp %d x pp %d, ZeRO stage %d, %s), global batch "
           "%lld x %d tokens, %d steps, run dir %s",
           engine.layout().num_params, be.describe().c_str(), groups.topo.world, dp, groups.topo.tp,
           groups.topo.pp, c.zero.stage,
           name_of(c.precision), static_cast<long long>(G), T, c.train_steps, opt.run_dir.c_str());
  if (resumed) {
    write_io_record("load", start_step, resumed->io);
    log_info("zero3d: resumed from %s at step %lld (saved on %s), read %.1f MB in %.2f s", resumed->io.file.c_str(),
             static_cast<long long>(start_step), resumed->saved_layout.c_str(), resumed->io.bytes / 1e6,
             resumed->io.seconds);
  }
  validating = val_data != nullptr && c.data.val_batches > 0;
  if (validating && start_step == 0) validate(0);
  if (c.wall_clock_breakdown && be.profile()) {
    mem_bandwidth = measure_copy_bandwidth(be, 0.2);
    if (be.kind() == BackendKind::host) compute_peak = best_fma_peak(0.1) * cpu::threads();
  }
  CommLog& comms = comm_log();
  comms.enabled = c.comms_logger.enabled, comms.verbose = c.comms_logger.verbose;
  if (!c.comms_logger.prof_all) comms.ops.insert(c.comms_logger.prof_ops.begin(), c.comms_logger.prof_ops.end());
  run_start = Clock::now();
  first_step = static_cast<int>(start_step) + 1;
  const FlopsProfilerConfig& fp = c.flops_profiler;
  // DeepSpeed profiles when its count of steps done equals profile_step: our step profile_step + 1.
  profiled_step = fp.enabled ? fp.profile_step + 1 : 0;
  if (fp.enabled && fp.profile_step < 0)
    log_info("zero3d: notice: flops_profiler.profile_step %d: no step is profiled", fp.profile_step);
  else if (fp.enabled && (profiled_step < first_step || profiled_step > c.train_steps))
    log_warn("flops_profiler.profile_step %d (step %d) is not among this run's steps (%d-%d): no profile",
             fp.profile_step, profiled_step, first_step, c.train_steps);
}

// One optimizer step: the micro-batches in 1F1B order, the gradient sync, the norm, the update
// (skipped on overflow), the parameter gather. Collective over the world.
Trainer::State::StepResult Trainer::State::train_step(int step) {
  const Config& c = cfg;
  ProcessGroup& world = *groups.world;
  StepResult r;
  comm_context().step = step;
  groups.dp->reset_bytes_sent();
  groups.tp->reset_bytes_sent();
  groups.pp->reset_bytes_sent();
  if (groups.embedding) groups.embedding->reset_bytes_sent();
  CommLog& comms = comm_log();
  comms.active = comms.enabled;  // the comms log covers what comm_bytes covers
  if (step == profiled_step) module_profile.reset_times(), module_profile.on = true;
  auto t0 = Clock::now();
  take_comm_time();  // from here on: this step's
  const int64_t faults0 = minor_page_faults();
  engine.begin_step(c.gradient_accumulation_steps);
  r.loss_scale = scaler.scale();
  // Each rank's gradient is already its share of the global mean: dloss = 1 / (tokens in the
  // global batch), times the fp16 loss scale.
  const float dloss = static_cast<float>((1.0 / tokens_per_step) * r.loss_scale);
  if (fault.at("inf", groups.world_rank, step)) EngineFaults::inject_inf_gradient(engine);
  if (fault.at("truncate_swap", groups.world_rank, step))
    for (const std::string& f : {swap.optimizer, swap.param})
      if (!f.empty() && ::truncate(f.c_str(), 0) != 0) log_warn("truncate_swap: %s: %s", f.c_str(), strerror(errno));
  const double loss_sum = train_micro_batches(dloss, r.t_fwd, r.t_bwd);
  cursor += static_cast<uint64_t>(c.train_batch_size);
  if (fault.at("hang", groups.world_rank, step))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  auto tr = Clock::now();
  engine.finish_gradients();
  if (groups.topo.pp > 1 && groups.embedding) {  // the tied embedding's two copies: one gradient
    auto [g, n] = engine.tied_embedding_grad();
    be.synchronize();
    groups.embedding->all_reduce_sum(be.mem(g), n);
  }
  r.t_reduce = seconds_since(tr);
  r.loss = groups.dp->all_reduce_sum(groups.pp->all_reduce_sum(loss_sum / c.gradient_accumulation_steps)) / dp;

  auto to = Clock::now();
  // The norm of the unscaled gradient; inf or nan on any rank is an overflow on every rank.
  r.grad_norm = std::sqrt(groups.pp->all_reduce_sum(groups.tp->all_reduce_sum(engine.grad_norm_sq()))) / r.loss_scale;
  const bool overflow = !std::isfinite(r.grad_norm);
  // DeepSpeed's timing: the schedule advances only on applied steps (see optim/lr_schedule.h).
  r.lr = lr_for_step(c.scheduler, c.optimizer.lr, engine.optimizer_steps() + 1);
  // fp16: the loss scaler decides (and may stop the run at its minimum); otherwise a non-finite
  // gradient skips the update too, rather than poisoning the weights.
  r.skipped = scaler.update(overflow, step) || overflow;
  if (overflow && !scaler.enabled()) log_warn("step %d: gradient norm is %f; the update is skipped", step, r.grad_norm);
  if (!r.skipped) {
    // Unscale with the scale the backward used, and clip, in one pass.
    const double factor = clip_coefficient(c.gradient_clipping, r.grad_norm) / r.loss_scale;
    if (factor != 1.0) engine.scale_grads(static_cast<float>(factor));
    engine.optimizer_step(r.lr);
  }
  be.synchronize();
  r.t_opt = seconds_since(to);
  auto tg = Clock::now();
  if (!r.skipped) engine.gather_updated_params();
  r.t_gather = seconds_since(tg);
  r.comm = take_comm_time();
  r.step_time = world.all_reduce_max(seconds_since(t0));
  if (c.wall_clock_breakdown) {
    r.comm.busy_s = world.all_reduce_max(r.comm.busy_s);
    r.comm.exposed_s = world.all_reduce_max(r.comm.exposed_s);
    r.comm.skew_s = world.all_reduce_max(r.comm.skew_s);
  }
  r.faults = minor_page_faults() - faults0;  // this rank's, during the step
  r.comm_bytes = world.all_reduce_max(static_cast<int64_t>(groups.dp->bytes_sent() + groups.tp->bytes_sent() +
                                                           groups.pp->bytes_sent() +
                                                           (groups.embedding ? groups.embedding->bytes_sent() : 0)));
  if (comms.active) comms.active = false, ++comm_steps;
  for (auto& m : models) r.recompute += m->take_recompute_seconds();
  r.idle_s = world.all_reduce_max(pipeline_idle_s);  // every rank: it is a collective
  if (mem_swapped_any || mem_host_any) {
    r.swap = engine.take_swap_io();
    double times[4] = {r.swap.wait_s, r.swap.busy_s, r.swap.copy_wait_s, r.swap.copy_s};
    for (double& t : times) t = world.all_reduce_max(t);
    r.swap.wait_s = times[0], r.swap.busy_s = times[1], r.swap.copy_wait_s = times[2], r.swap.copy_s = times[3];
    uint64_t bytes[4] = {r.swap.bytes_read, r.swap.bytes_written, r.swap.bytes_down, r.swap.bytes_up};
    world.all_reduce_sum(bytes, 4);
    r.swap.bytes_read = bytes[0], r.swap.bytes_written = bytes[1], r.swap.bytes_down = bytes[2], r.swap.bytes_up = bytes[3];
  }
  return r;
}

// The step's records: metrics.jsonl, the flops profile, csv_monitor, memory_breakdown, the progress line.
void Trainer::State::report_step(int step, const StepResult& r) {
  const Config& c = cfg;
  const int64_t G = c.train_batch_size;
  const double tokens_per_s = tokens_per_step / r.step_time;
  const double model_flops = tokens_per_s * flops_per_token;
  if (metrics) {
    MetricsRecord m("train");
    m.add("step", step).add("loss", r.loss).add("lr", r.lr).add("grad_norm", r.grad_norm)
        .add("loss_scale", r.loss_scale).add("skipped", r.skipped)
        .add("tokens", static_cast<int64_t>(step * tokens_per_step))
        .add("tokens_per_s", tokens_per_s).add("step_time_s", r.step_time)
        .add("model_flops_per_s", model_flops).add("mfu", model_flops / (opt.peak_flops * groups.topo.world))
        .add("mem_model_states_bytes", mem_bytes).add("comm_bytes", r.comm_bytes)
        .add("backend_allocs", static_cast<int64_t>(be.alloc_count())).add("page_faults", r.faults);
    if (c.wall_clock_breakdown)
      m.add("forward_s", r.t_fwd).add("backward_s", r.t_bwd).add("reduce_s", r.t_reduce).add("optimizer_s", r.t_opt)
          .add("allgather_s", r.t_gather).add("recompute_s", r.recompute)
          .add("pipeline_idle_s", r.idle_s).add("pipeline_idle_fraction", r.idle_s / r.step_time)
          .add("comm_s", r.comm.busy_s).add("comm_exposed_s", r.comm.exposed_s)
          .add("comm_hidden_s", std::max(0.0, r.comm.busy_s - r.comm.exposed_s)).add("comm_skew_s", r.comm.skew_s);
    if (mem_swapped_any)  // offload to nvme: I/O time, the part the step waited for, and what it hid
      m.add("swap_io_s", r.swap.busy_s).add("swap_wait_s", r.swap.wait_s)
          .add("swap_hidden_s", std::max(0.0, r.swap.busy_s - r.swap.wait_s))
          .add("swap_read_bytes", static_cast<int64_t>(r.swap.bytes_read))
          .add("swap_written_bytes", static_cast<int64_t>(r.swap.bytes_written));
    if (mem_host_any)  // optimizer offload from a device: the copies, the part the update waited for, the bytes
      m.add("offload_copy_s", r.swap.copy_s).add("offload_copy_wait_s", r.swap.copy_wait_s)
          .add("offload_copy_hidden_s", std::max(0.0, r.swap.copy_s - r.swap.copy_wait_s))
          .add("offload_down_bytes", static_cast<int64_t>(r.swap.bytes_down))
          .add("offload_up_bytes", static_cast<int64_t>(r.swap.bytes_up));
    metrics->write(m);
  }
  if (module_profile.on) {
    module_profile.on = false;
    const ProfiledStep ps{step, micro, c.gradient_accumulation_steps, r.t_reduce, r.t_opt, r.t_gather,
                          pipeline_idle_s, r.step_time};
    const std::string text = report_flops_profile(c.flops_profiler, c.model, groups, module_profile, ps, metrics.get());
    if (is_root()) log_info("%s", text.c_str());
  }
  if (csv) {  // DeepSpeed's event names; the x axis is samples trained
    const int64_t samples = static_cast<int64_t>(step) * G;
    csv->write("Train/Samples/train_loss", r.loss, samples);
    csv->write("Train/Samples/lr", r.lr, samples);
    if (c.precision == Precision::fp16) csv->write("Train/Samples/loss_scale", r.loss_scale, samples);
    csv->write("Train/Samples/grad_norm", r.grad_norm, samples);
    if (c.wall_clock_breakdown) {
      csv->write("Train/Samples/elapsed_time_ms_forward", 1e3 * r.t_fwd, samples);
      csv->write("Train/Samples/elapsed_time_ms_backward", 1e3 * (r.t_bwd + r.t_reduce), samples);
      csv->write("Train/Samples/elapsed_time_ms_backward_inner", 1e3 * r.t_bwd, samples);
      csv->write("Train/Samples/elapsed_time_ms_backward_allreduce", 1e3 * r.t_reduce, samples);
      csv->write("Train/Samples/elapsed_time_ms_step", 1e3 * r.t_opt, samples);
    }
  }
  if (c.memory_breakdown && (step % c.steps_per_print == 0 || step == c.train_steps)) report_memory(step);
  if (step % c.steps_per_print == 0 || step == c.train_steps) {
    const double elapsed = seconds_since(run_start);
    log_info("step %6d/%d | loss %.6f | lr %.3e | grad norm %.4f | %.0f tok/s | mfu %.1f%% | eta %s", step,
             c.train_steps, r.loss, r.lr, r.grad_norm, tokens_per_s,
             100.0 * model_flops / (opt.peak_flops * groups.topo.world),
             format_hms(elapsed / (step - first_step + 1) * (c.train_steps - step)).c_str());
  }
}

// After the step: the safety checks, validation, then a stop signal on any rank, or (rank 0
// judges) a time budget that would not fit another step and a checkpoint, stops every rank after
// a checkpoint. Returns the exit code when the run stops here, else -1.
int Trainer::State::step_boundary(int step, const StepResult& r) {
  const Config& c = cfg;
  ProcessGroup& world = *groups.world;
  check_divergence(step, r);
  if (fault.at("perturb", groups.world_rank, step)) EngineFaults::perturb_replica(engine);
  const int check = c.zero.consistency_check_interval;
  if (check > 0 && (step % check == 0 || step == c.train_steps)) engine.check_replicas_consistent(step);
  if (validating && ((c.data.val_interval > 0 && step % c.data.val_interval == 0) || step == c.train_steps))
    validate(step);

  max_step_s = std::max(max_step_s, r.step_time);
  if (OpProfile* prof = be.profile(); prof && c.wall_clock_breakdown) {  // from step 2: warm
    if (prof->on) ++profiled_steps, profiled_s += r.step_time;
    prof->on = true;
  }
  // Stop reason: the signal number, or 1 for the budget.
  int64_t stop = stop_signal();
  if (is_root() && step < c.train_steps && out_of_time()) stop = std::max<int64_t>(stop, 1);
  stop = world.all_reduce_max(stop);
  const int interval = c.checkpoint.save_interval;
  // A background save that every rank's writer has finished: its record, its failure policy.
  if (writer->pending() && world.all_reduce_max(static_cast<int64_t>(!writer->done_here())) == 0)
    finish_save(writer->wait());
  stopping = stop != 0;
  const bool save_due = stop != 0 || (interval > 0 && (step % interval == 0 || step == c.train_steps));
  if (save_due && loss_nonfinite) {  // a state past a non-finite loss is never committed
    if (is_root())
      log_warn("step %d: the loss is %g: this step's checkpoint is not written, so %s", step, r.loss,
               latest_text().c_str());
  } else if (save_due) {
    save(step);
  }
  // Nothing ends before the last save committed (or failed).
  if ((stop != 0 || step == c.train_steps) && writer->pending()) finish_save(writer->wait());
  if (stop != 0 || step == c.train_steps) {
    report_kernels(), report_comms();
    check_final_state(step, save_due);
  }
  if (stop == 1) {
    log_info("stopping after step %d: another step (%.1f s) and a checkpoint (%.1f s) would overrun the time budget "
             "(%.1f s: run.max_minutes or the Slurm job's end time); the checkpoint is committed; run again with "
             "checkpoint.load=auto to continue (exit code %d)",
             step, max_step_s, last_save_s, time_budget_s, kExitStopped);
    return kExitStopped;
  }
  if (stop != 0) {
    log_warn("stopping after step %d on %s: the checkpoint is committed; run again with checkpoint.load=auto to "
             "continue (exit code %d)",
             step, stop == SIGTERM ? "SIGTERM" : "SIGUSR1", kExitStopped);
    return kExitStopped;
  }
  return -1;
}

std::string Trainer::State::latest_text() const {
  return committed_step > 0 ? strprintf("'latest' holds step %lld", static_cast<long long>(committed_step))
                            : std::string("no checkpoint of this run is committed");
}

// Divergence: a step whose loss, or (outside fp16's loss scaling, where an overflow is the
// scaler's business) whose gradient norm, is not finite. The flag is agreed over the world (a max:
// 2 = the loss, 1 = the gradient norm only). max_nonfinite_steps of them in a row stop every rank
// with exit 9, after any pending save, so `latest` is the last checkpoint before the divergence.
void Trainer::State::check_divergence(int step, const StepResult& r) {
  const bool loss_bad = !std::isfinite(r.loss);
  const bool norm_bad = !scaler.enabled() && !std::isfinite(r.grad_norm);
  const int64_t bad = groups.world->all_reduce_max(static_cast<int64_t>(loss_bad ? 2 : norm_bad ? 1 : 0));
  loss_nonfinite = bad == 2;
  nonfinite_steps = bad > 0 ? nonfinite_steps + 1 : 0;
  const int limit = cfg.max_nonfinite_steps;
  if (limit == 0 || nonfinite_steps < limit) return;
  if (writer->pending()) finish_save(writer->wait());
  throw RunError(strprintf("the run diverged: the loss or gradient norm was not finite in %d steps in a row (steps "
                           "%d-%d; step %d: loss %g, gradient norm %g; max_nonfinite_steps = %d): stopping; %s; "
                           "lower optimizer.params.lr or set gradient_clipping, then resume with "
                           "checkpoint.load=auto",
                           nonfinite_steps, step - nonfinite_steps + 1, step, step, r.loss, r.grad_norm, limit,
                           latest_text().c_str()),
                 kExitDiverged);
}

// The run's last step (train_steps, or a stop): its state must be in a committed checkpoint when
// one was due, and no run ends with exit 0 or 6 otherwise. A non-finite loss: exit 9 (its save
// was not written); a failed last save under checkpoint.on_failure = continue: exit 7.
void Trainer::State::check_final_state(int step, bool save_due) {
  if (loss_nonfinite)
    throw RunError(strprintf("the loss at step %d, the run's last, is not finite: its state is not saved; %s, %lld "
                             "steps are not saved (exit code %d: the run diverged)",
                             step, latest_text().c_str(), static_cast<long long>(step - committed_step),
                             kExitDiverged),
                   kExitDiverged);
  if (save_due && committed_step != step)
    throw RunError(strprintf("%s; the run's final state (step %d) is not in a committed checkpoint: %s, %lld steps "
                             "are not saved (checkpoint.on_failure = continue); fix the storage, then resume with "
                             "checkpoint.load=auto",
                             last_save_error.c_str(), step, latest_text().c_str(),
                             static_cast<long long>(step - committed_step)),
                   kExitCheckpointFailed);
}

// The run: its phases, each behind one call.
int Trainer::run() {
  State& s = *s_;
  s.start_run();
  for (int step = s.first_step; step <= s.cfg.train_steps; ++step) {
    const State::StepResult r = s.train_step(step);
    s.report_step(step, r);
    if (const int rc = s.step_boundary(step, r); rc >= 0) return rc;
  }
  if (s.start_step >= s.cfg.train_steps)
    log_info("zero3d: the checkpoint is at step %lld, train_steps is %d: nothing to train",
             static_cast<long long>(s.start_step), s.cfg.train_steps);
  // A run dir removed under the run (rm -rf) took its metrics and its lock with it: not "done".
  const bool gone = s.is_root() && s.lock && !s.lock->still_held();
  if (s.groups.world->all_reduce_max(static_cast<int64_t>(gone)) != 0)
    throw RunError(strprintf("the run directory '%s' was removed while the run went on: its metrics.jsonl%s and its lock "
                             "are gone, and a second run could have started there",
                             s.opt.run_dir.c_str(), s.cfg.checkpoint.dir.empty() ? ", its checkpoints" : ""),
                   kExitCheckpointFailed);
  if (s.metrics) log_info("zero3d: done; metrics in %s", s.metrics->path().c_str());
  return 0;
}

}  // namespace zero3d
