#include "train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "model/gpt.h"
#include "model/init_weights.h"
#include "optim/lr_schedule.h"
#include "storage/checks.h"
#include "train/ckpt_policy.h"
#include "train/fault.h"
#include "train/records.h"
#include "train/step_runner.h"
#include "core/stop_signal.h"  // the flag; app/train.cpp installs the handlers
#include "zero/engine.h"
#include "zero/grad_finish.h"
#include "zero/loss_scaler.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {

// Minor page faults of this process so far: first touches of fresh memory (1-2.5 GB/s in a VM).
int64_t minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Offload to nvme: this rank's swap files under each nvme_path (checked: a writable directory),
// after the files of runs that died there are removed. Collective over the world (UserError on all).
SwapFiles prepare_swap(const Config& c, const RunOptions& o, ProcessGroups& g) {
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

// The data cursor counts samples of one order: that of the shards the checkpoint was saved over.
// Over shards of other sizes the same cursor is other data (samples seen again, others never), so
// a resume over them is refused, naming the difference. Checkpoints from before the record: not checked.
void check_resumed_data(const std::optional<DataOrder>& saved, const DataOrder& now, const std::string& file,
                        uint64_t cursor) {
  if (!saved || *saved == now) return;
  const DataOrder& was = *saved;
  auto set = [](const DataOrder& o) {
    return strprintf("%llu shard%s of %llu sequences", (unsigned long long)o.shards, o.shards == 1 ? "" : "s",
                     (unsigned long long)o.sequences);
  };
  const std::string differs = was.shards == now.shards && was.sequences == now.sequences
                                  ? " (the same counts, but the shards' sizes differ: reordered or re-cut)"
                                  : "";
  throw UserError(strprintf(
      "checkpoint '%s' was saved over data.train of %s; this run's data.train is %s%s. Its data cursor (%llu "
      "samples) would point into another order. Resume over the shards it was saved with (`zero3d ckpt inspect` "
      "shows its config), or export its weights (`zero3d ckpt export --format hf`) and start a new run from them "
      "(checkpoint.init_from)",
      file.c_str(), set(was).c_str(), set(now).c_str(), differs.c_str(), (unsigned long long)cursor));
}

}  // namespace

struct Trainer::State {
  State(const Config& c, const RunOptions& o, Backend& b, ProcessGroups& g, const SwapFiles& swap_files)
      : cfg(c), opt(o), be(b), groups(g), swap(swap_files),
        engine(b, *g.dp, c.model, c.zero, c.optimizer, c.precision, g.topo.tp, g.coord.tp, g.topo.pp, g.coord.pp,
               swap_files),
        runner(c, b, g, engine), grads(engine, b, g), scaler(c.fp16), faults(g.world_rank), records(c, opt, b, g),
        ckpt(c, opt, g, engine, faults, records) {}

  const Config& cfg;
  RunOptions opt;
  Backend& be;
  ProcessGroups& groups;
  SwapFiles swap;  // this rank's swap files (offload to nvme)
  ZeroEngine engine;
  StepRunner runner;
  GradFinisher grads;
  LossScaler scaler;
  FaultInjector faults;
  RunRecords records;
  CheckpointPolicy ckpt;

  uint64_t cursor = 0;     // global samples consumed
  int64_t start_step = 0;  // steps already taken (from the checkpoint resumed)
  double flops_per_token = 0, tokens_per_step = 0;
  // Divergence (max_nonfinite_steps): steps in a row whose loss or gradient norm is not finite,
  // and whether this step's loss is, agreed over the world.
  int nonfinite_steps = 0;
  bool loss_nonfinite = false;

  void start_run(const std::optional<LoadedCheckpoint>& resumed);
  StepResult train_step(int step);
  void gather_step_facts(StepResult& r, Clock::time_point t0, int64_t faults0);
  int step_boundary(int step, const StepResult& r);
  void check_divergence(int step, const StepResult& r);
  TrainingState training_state(int step) const;
};

Trainer::Trainer(const Config& config, const RunOptions& options, Backend& backend, ProcessGroups& groups) {
  const SwapFiles swap = prepare_swap(config, options, groups);
  std::shared_ptr<InitialWeights> from;
  groups.world->agree([&] {
    s_ = std::make_unique<State>(config, options, backend, groups, swap);
    if (!config.checkpoint.init_from.empty()) from = read_hf_weights(config.checkpoint.init_from, config.model);
  });
  State& s = *s_;
  set_initial_weights(from);  // checkpoint.init_from: every rank copies its share of the same weights
  s.engine.init_weights(config.seed);
  set_initial_weights(nullptr);
  s.flops_per_token = gpt_flops_per_token(config.model);
  s.tokens_per_step = static_cast<double>(config.train_batch_size) * config.model.seq_len;
  // Resume before anything is written: a checkpoint that does not load is an input error too.
  std::optional<LoadedCheckpoint> resumed = s.ckpt.load();
  if (resumed) {
    const TrainingState& st = resumed->state;
    s.start_step = st.step;
    s.cursor = st.data_cursor;
    check_resumed_data(st.data_order, s.runner.data_order(), resumed->io.file, st.data_cursor);
    s.scaler.load_state(st.loss_scaler);
  }
  s.ckpt.prepare(s.start_step);
  s.records.open(resumed ? s.start_step : -1, s.cursor);
  s.start_run(resumed);
}

Trainer::~Trainer() = default;

// The run record, the start line, the resume record, validation at step 0, the profilers' bounds.
void Trainer::State::start_run(const std::optional<LoadedCheckpoint>& resumed) {
  RunRecords::RunFacts f;
  f.activation_bytes = runner.activation_bytes();
  f.flops_per_token = flops_per_token;
  f.time_budget_s = ckpt.time_budget_s();
  f.start_step = start_step;
  f.resumed_from = resumed ? resumed->io.file : std::string();
  f.checkpoint_writes = ckpt.writer_mode();
  records.start(engine, f);
  if (resumed) {
    records.checkpoint("load", start_step, resumed->io);
    log_info("zero3d: resumed from %s at step %lld (saved on %s), read %.1f MB in %.2f s", resumed->io.file.c_str(),
             static_cast<long long>(start_step), resumed->saved_layout.c_str(), resumed->io.bytes / 1e6,
             resumed->io.seconds);
  }
  if (runner.can_validate() && start_step == 0) records.val(0, runner.validate(), runner.val_tokens());
  records.start_profiles(static_cast<int>(start_step) + 1);
}

// One optimizer step: the micro-batches in 1F1B order, the gradient finished, the update
// (skipped on overflow), the parameter gather. Collective over the world.
StepResult Trainer::State::train_step(int step) {
  const Config& c = cfg;
  StepResult r;
  comm_context().step = step;
  for (ProcessGroup* g : {groups.dp.get(), groups.tp.get(), groups.pp.get(), groups.embedding.get()})
    if (g) g->reset_bytes_sent();
  records.begin_step();
  if (records.profiled(step)) runner.module_profile().reset_times(), runner.module_profile().on = true;
  const auto t0 = Clock::now();
  take_comm_time();  // from here on: this step's
  const int64_t faults0 = minor_page_faults();
  engine.begin_step(c.gradient_accumulation_steps);
  r.loss_scale = scaler.scale();
  // Each rank's gradient is already its share of the global mean: dloss = 1 / (tokens in the
  // global batch), times the fp16 loss scale.
  const float dloss = static_cast<float>((1.0 / tokens_per_step) * r.loss_scale);
  faults.before_step(step, engine, swap);
  const double loss_sum = runner.forward_backward(cursor, dloss, r.t_fwd, r.t_bwd);
  cursor += static_cast<uint64_t>(c.train_batch_size);
  faults.before_reduction(step);

  const auto tr = Clock::now();
  grads.reduce();
  r.t_reduce = seconds_since(tr);
  r.loss = groups.dp->all_reduce_sum(groups.pp->all_reduce_sum(loss_sum / c.gradient_accumulation_steps)) /
           groups.topo.dp;

  const auto to = Clock::now();
  r.grad_norm = grads.global_norm(r.loss_scale);
  const bool overflow = !std::isfinite(r.grad_norm);  // on any rank: on every rank
  // DeepSpeed's timing: the schedule advances only on applied steps (see optim/lr_schedule.h).
  r.lr = lr_for_step(c.scheduler, c.optimizer.lr, engine.optimizer_steps() + 1);
  // fp16: the loss scaler decides (and may stop the run at its minimum); otherwise a non-finite
  // gradient skips the update too, rather than poisoning the weights.
  r.skipped = scaler.update(overflow, step) || overflow;
  if (overflow && !scaler.enabled()) log_warn("step %d: gradient norm is %f; the update is skipped", step, r.grad_norm);
  if (!r.skipped) {
    grads.unscale_and_clip(c.gradient_clipping, r.grad_norm, r.loss_scale);
    engine.optimizer_step(r.lr);
  }
  be.synchronize();
  r.t_opt = seconds_since(to);
  const auto tg = Clock::now();
  if (!r.skipped) engine.gather_updated_params();
  r.t_gather = seconds_since(tg);
  gather_step_facts(r, t0, faults0);
  return r;
}

// The step's times, bytes and offload I/O, agreed over the world (the slowest rank's).
void Trainer::State::gather_step_facts(StepResult& r, Clock::time_point t0, int64_t faults0) {
  ProcessGroup& world = *groups.world;
  r.comm = take_comm_time();
  r.step_time = world.all_reduce_max(seconds_since(t0));
  if (cfg.wall_clock_breakdown) {
    r.comm.busy_s = world.all_reduce_max(r.comm.busy_s);
    r.comm.exposed_s = world.all_reduce_max(r.comm.exposed_s);
    r.comm.skew_s = world.all_reduce_max(r.comm.skew_s);
  }
  r.faults = minor_page_faults() - faults0;  // this rank's, during the step
  int64_t sent = 0;
  for (ProcessGroup* g : {groups.dp.get(), groups.tp.get(), groups.pp.get(), groups.embedding.get()})
    if (g) sent += static_cast<int64_t>(g->bytes_sent());
  r.comm_bytes = world.all_reduce_max(sent);
  records.end_step();
  r.recompute = runner.take_recompute_s();
  r.idle_s = world.all_reduce_max(runner.idle_s());  // every rank: it is a collective
  if (records.swaps()) {
    r.swap = engine.take_swap_io();
    double times[4] = {r.swap.wait_s, r.swap.busy_s, r.swap.copy_wait_s, r.swap.copy_s};
    for (double& t : times) t = world.all_reduce_max(t);
    r.swap.wait_s = times[0], r.swap.busy_s = times[1], r.swap.copy_wait_s = times[2], r.swap.copy_s = times[3];
    uint64_t bytes[4] = {r.swap.bytes_read, r.swap.bytes_written, r.swap.bytes_down, r.swap.bytes_up};
    world.all_reduce_sum(bytes, 4);
    r.swap.bytes_read = bytes[0], r.swap.bytes_written = bytes[1], r.swap.bytes_down = bytes[2], r.swap.bytes_up = bytes[3];
  }
}

// The state a checkpoint after `step` holds besides the engine's: each owner's part.
TrainingState Trainer::State::training_state(int step) const {
  TrainingState st;
  st.step = step;
  st.optimizer_steps = engine.optimizer_steps();
  st.data_cursor = cursor;
  st.loss_scaler = scaler.save_state();
  st.lr_scheduler = schedule_state(cfg.scheduler, cfg.optimizer.lr, st.optimizer_steps);
  st.data_order = runner.data_order();
  return st;
}

// After the step: the safety checks, validation, then a stop signal on any rank, or (rank 0
// judges) a time budget that would not fit another step and a checkpoint, stops every rank after
// a checkpoint. Returns the exit code when the run stops here, else -1.
int Trainer::State::step_boundary(int step, const StepResult& r) {
  const Config& c = cfg;
  check_divergence(step, r);
  faults.after_step(step, engine);
  const int check = c.zero.consistency_check_interval;
  if (check > 0 && (step % check == 0 || step == c.train_steps)) engine.check_replicas_consistent(step);
  if (runner.can_validate() && ((c.data.val_interval > 0 && step % c.data.val_interval == 0) || step == c.train_steps))
    records.val(step, runner.validate(), runner.val_tokens());
  ckpt.note_step_time(r.step_time);
  records.after_step(r.step_time);
  // Stop reason: the signal number, or 1 for the budget.
  int64_t stop = stop_signal();
  if (groups.world_rank == 0 && step < c.train_steps && ckpt.out_of_time()) stop = std::max<int64_t>(stop, 1);
  stop = groups.world->all_reduce_max(stop);
  ckpt.finish_if_done();  // a background save every rank's writer has finished
  ckpt.set_stopping(stop != 0);
  const int interval = c.checkpoint.save_interval;
  const bool last = stop != 0 || step == c.train_steps;
  const bool save_due = stop != 0 || (interval > 0 && (step % interval == 0 || step == c.train_steps));
  if (save_due && loss_nonfinite) {  // a state past a non-finite loss is never committed
    if (groups.world_rank == 0)
      log_warn("step %d: the loss is %g: this step's checkpoint is not written, so %s", step, r.loss,
               ckpt.latest_text().c_str());
  } else if (save_due) {
    ckpt.save(training_state(step));
  }
  if (!last) return -1;
  ckpt.finish_pending();  // nothing ends before the last save committed (or failed)
  records.finish();
  ckpt.check_final_state(step, save_due, loss_nonfinite);
  if (stop == 1) {
    log_info("stopping after step %d: another step (%.1f s) and a checkpoint (%.1f s) would overrun the time budget "
             "(%.1f s: run.max_minutes or the Slurm job's end time); the checkpoint is committed in '%s' (%s); run again "
             "with checkpoint.load=auto to continue (exit code %d)",
             step, ckpt.max_step_s(), ckpt.last_save_s(), ckpt.time_budget_s(), ckpt.dir().c_str(),
             ckpt.latest_text().c_str(), kExitStopped);
    return kExitStopped;
  }
  if (stop != 0) {
    log_warn("stopping after step %d on %s: the checkpoint is committed in '%s' (%s); run again with "
             "checkpoint.load=auto to continue (exit code %d)",
             step, stop == SIGTERM ? "SIGTERM" : "SIGUSR1", ckpt.dir().c_str(), ckpt.latest_text().c_str(),
             kExitStopped);
    return kExitStopped;
  }
  return -1;
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
  ckpt.finish_pending();
  const int first_bad = step - nonfinite_steps + 1;
  const std::string set_aside = ckpt.set_aside_diverged(first_bad);
  throw RunError(strprintf("the run diverged: the loss or gradient norm was not finite in %d steps in a row (steps "
                           "%d-%d; step %d: loss %g, gradient norm %g; max_nonfinite_steps = %d): stopping%s; %s; "
                           "lower optimizer.params.lr or set gradient_clipping, then resume with "
                           "checkpoint.load=auto",
                           nonfinite_steps, first_bad, step, step, r.loss, r.grad_norm, limit, set_aside.c_str(),
                           ckpt.latest_text().c_str()),
                 kExitDiverged);
}

// The run: its phases, each behind one call.
int Trainer::run() {
  State& s = *s_;
  for (int step = static_cast<int>(s.start_step) + 1; step <= s.cfg.train_steps; ++step) {
    const StepResult r = s.train_step(step);
    s.records.step(step, r, s.runner, s.flops_per_token, s.tokens_per_step);
    if (const int rc = s.step_boundary(step, r); rc >= 0) return rc;
  }
  if (s.start_step >= s.cfg.train_steps)
    log_info("zero3d: the checkpoint is at step %lld, train_steps is %d: nothing to train",
             static_cast<long long>(s.start_step), s.cfg.train_steps);
  // A run dir removed under the run (rm -rf) took its metrics and its lock with it: not "done".
  const bool gone = s.groups.world_rank == 0 && !s.ckpt.run_dir_held();
  if (s.groups.world->all_reduce_max(static_cast<int64_t>(gone)) != 0)
    throw RunError(strprintf("the run directory '%s' was removed while the run went on: its metrics.jsonl%s and its lock "
                             "are gone, and a second run could have started there",
                             s.opt.run_dir.c_str(), s.cfg.checkpoint.dir.empty() ? ", its checkpoints" : ""),
                   kExitCheckpointFailed);
  if (s.records.metrics()) log_info("zero3d: done; metrics in %s", s.records.metrics()->path().c_str());
  return 0;
}

}  // namespace zero3d
