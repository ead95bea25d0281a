#include "train/ckpt_policy.h"

#include <algorithm>
#include <filesystem>

#include "ckpt/dir.h"
#include "ckpt/reader.h"
#include "ckpt/tokenizer_record.h"
#include "core/check.h"
#include "core/log.h"
#include "model/gpt.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {
void create_directory(const std::string& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(strprintf("cannot create %s '%s': %s", what, dir.c_str(), ec.message().c_str()));
}
}  // namespace

CheckpointPolicy::CheckpointPolicy(const Config& c, const RunOptions& o, ProcessGroups& g, ZeroEngine& engine,
                                   const FaultInjector& faults, RunRecords& records)
    : cfg_(c), opt_(o), groups_(g), engine_(engine), faults_(faults), records_(records),
      dir_(c.checkpoint.dir.empty() ? o.run_dir + "/checkpoints" : c.checkpoint.dir),
      // Rank 0 reads the tokenizer (a Llama 3 tokenizer.json is 9 MB); load() gives every rank its record.
      tokenizer_(g.world->rank() == 0 ? tokenizer_record(c.data.tokenizer, c.model.vocab_size) : std::string()) {
  if (c.max_minutes > 0) time_budget_s_ = c.max_minutes * 60;
  time_budget_s_ = std::min(time_budget_s_, o.job.seconds_left);
  // Before the first save, a checkpoint is estimated at 100 MB/s (fp32 weights, m and v; plus a
  // 16-bit copy and the master in mixed precision).
  double elems = 0;
  for (const ParamInfo& p : gpt_param_table(c.model)) elems += static_cast<double>(p.size);
  last_save_s_ = elems * (c.precision == Precision::fp32 ? 12 : 18) / 1e8;
}

CheckpointPolicy::~CheckpointPolicy() = default;

std::optional<LoadedCheckpoint> CheckpointPolicy::load() {
  tokenizer_ = groups_.world->broadcast_string(tokenizer_, 0);  // the attribute every rank writes
  faults_.before_load();
  std::optional<LoadedCheckpoint> r = load_checkpoint({cfg_, groups_, engine_, tokenizer_}, cfg_.checkpoint.load,
                                                      cfg_.checkpoint.load_path, dir_, cfg_.checkpoint.timeout_s);
  if (r) committed_step_ = r->state.step;
  // A resume that does not name the tokenizer keeps the checkpoint's: later saves record it too.
  if (r && tokenizer_.empty()) tokenizer_ = r->tokenizer;
  return r;
}

void CheckpointPolicy::prepare(int64_t start_step) {
  // Everything before this validated the inputs; only now does the run directory appear, locked by
  // this run, with the checkpoint directory checked (and locked) before anything is written there.
  ProcessGroup& world = *groups_.world;
  bool created_run_dir = false;
  world.agree([&] {
    if (!is_root()) return;
    std::error_code ec;
    created_run_dir = !fs::exists(opt_.run_dir, ec);
    try {
      create_directory(opt_.run_dir, "run directory");
      std::string warning;
      lock_ = std::make_unique<DirLock>(opt_.run_dir, "run directory", "another --run-dir", warning);
      if (!warning.empty()) log_warn("%s", warning.c_str());
      if (cfg_.checkpoint.save_interval > 0) create_directory(dir_, "checkpoint directory (checkpoint.dir)");
    } catch (const UserError&) {  // leave no trace of this run: it never started
      lock_.reset();
      if (created_run_dir) fs::remove_all(opt_.run_dir, ec);
      throw;
    }
  });
  if (cfg_.checkpoint.save_interval <= 0) hold_or_move_stop_saves();
  writer_ = std::make_unique<CheckpointWriter>(CheckpointRun{cfg_, groups_, engine_, tokenizer_}, dir_, cfg_.checkpoint,
                                               opt_.run_dir + "/hdf5_errors.log");
  if (cfg_.checkpoint.save_interval <= 0) return;
  try {
    check_storage(start_step);
  } catch (const UserError&) {  // leave no trace of this run: it never started
    if (is_root()) {
      ckpt_lock_.reset();
      lock_.reset();
      std::error_code ec;
      fs::remove(dir_, ec);  // only if empty
      if (created_run_dir) fs::remove(opt_.run_dir, ec);
    }
    throw;
  }
}

// A run without save_interval still saves on a stop (a signal, the time budget). It holds
// checkpoint.dir's lock for that, or, when another run holds it (this run only loads from there),
// its stop checkpoint goes to <run dir>/checkpoints instead, as it says now: never into a
// directory another run writes and prunes.
void CheckpointPolicy::hold_or_move_stop_saves() {
  ProcessGroup& world = *groups_.world;
  int64_t moved = 0;
  if (is_root()) {
    std::error_code ec;
    if (fs::is_directory(dir_, ec) && !fs::equivalent(dir_, opt_.run_dir, ec)) {
      try {
        std::string warning;
        ckpt_lock_ = std::make_unique<DirLock>(dir_, "checkpoint directory (checkpoint.dir)", "", warning);
        if (!warning.empty()) log_warn("%s", warning.c_str());
      } catch (const UserError&) {
        moved = 1;
      }
    }
  }
  if (world.all_reduce_max(moved) == 0) return;
  const std::string held = dir_;
  dir_ = opt_.run_dir + "/checkpoints";
  if (is_root())
    log_warn("checkpoint.dir '%s' is held by another run, which saves and prunes there: this run only loads from it, "
             "and a checkpoint it saves when stopped (a signal, the time budget) goes to '%s'",
             held.c_str(), dir_.c_str());
}

// The checkpoint directory, before training: writable from every rank's node (a probe file each),
// locked by this run (two runs saving into one directory would prune each other's checkpoints),
// and (rank 0) with room for the checkpoints this run keeps. Partial files of saves that died are
// removed once the lock is held. UserError (exit 2) naming the numbers or the holder.
void CheckpointPolicy::check_storage(int64_t start_step) {
  ProcessGroup& world = *groups_.world;
  world.agree([&] {
    if (const std::string e = probe_writable(dir_, groups_.world_rank); !e.empty())
      throw UserError(strprintf("checkpoint directory (checkpoint.dir) is not writable from rank %d: %s",
                                groups_.world_rank, e.c_str()));
  });
  world.agree([&] {
    if (!is_root()) return;
    std::error_code ec;
    std::string warning;
    if (!fs::equivalent(dir_, opt_.run_dir, ec))  // else the run dir's lock is this one
      ckpt_lock_ = std::make_unique<DirLock>(dir_, "checkpoint directory (checkpoint.dir)", "another checkpoint.dir",
                                             warning);
    if (!warning.empty()) log_warn("%s", warning.c_str());
    remove_partial_saves(dir_);
  });
  world.agree([&] {
    if (!is_root()) return;
    const int interval = cfg_.checkpoint.save_interval;
    const int64_t left = cfg_.train_steps - start_step;
    const int64_t saves = left / interval + (left % interval != 0);
    const int64_t existing = static_cast<int64_t>(list_checkpoints(dir_).size());
    const uint64_t need = checkpoint_space_needed(writer_->file_bytes(), saves, cfg_.checkpoint.keep_last, existing);
    const int64_t have = free_bytes(dir_);
    if (have >= 0 && static_cast<uint64_t>(have) < need)
      throw UserError(strprintf(
          "checkpoint directory '%s' has %.1f MB free, but this run needs %.1f MB more there (%lld saves of %.1f MB, "
          "checkpoint.keep_last %d, %lld checkpoints there now): free space, lower keep_last or set checkpoint.dir",
          dir_.c_str(), have / 1e6, need / 1e6, (long long)saves, writer_->file_bytes() / 1e6,
          cfg_.checkpoint.keep_last, (long long)existing));
  });
}

bool CheckpointPolicy::out_of_time() const {
  return seconds_since(t_start_) + max_step_s_ + last_save_s_ > time_budget_s_;
}

void CheckpointPolicy::finish_if_done() {
  if (writer_->pending() && groups_.world->all_reduce_max(static_cast<int64_t>(!writer_->done_here())) == 0)
    finish(writer_->wait());
}

void CheckpointPolicy::finish_pending() {
  if (writer_->pending()) finish(writer_->wait());
}

// A checkpoint of the state after `st.step` (collective): the previous save's result first, then
// this one staged and written (in the background, or before this returns).
void CheckpointPolicy::save(const TrainingState& st) {
  finish_pending();
  if (is_root()) {  // it may be a stop before any interval checkpoint (checkpoint.save_interval = 0)
    std::error_code ec;
    fs::create_directories(dir_, ec);  // a failure here fails the save, cleanly (the writer reports it)
    faults_.before_tokenizer_copy(static_cast<int>(st.step));
    if (const std::string e = copy_recorded_tokenizer(tokenizer_, dir_); !e.empty() && !tokenizer_copy_warned_) {
      log_warn("%s (generate and export read it from its source path while that holds the same file)", e.c_str());
      tokenizer_copy_warned_ = true;
    }
  }
  const SaveFaults faults = faults_.before_save(static_cast<int>(st.step), dir_);
  groups_.world->barrier();  // the directory exists before anyone opens the file
  writer_->save(st, faults);
  if (!writer_->async()) finish(writer_->wait());
}

// A save that finished (committed or failed, alike on every rank): its record and line, and what
// a failure means (checkpoint.on_failure): a RunError (exit 7, on every rank) or a warning.
void CheckpointPolicy::finish(const SaveResult& r) {
  records_.checkpoint("save", r.step, r.io, &r, writer_->async());
  last_save_error_ = r.error;
  if (!r.error.empty()) {
    if (cfg_.checkpoint.on_failure == "stop")
      throw RunError(r.error + "; stopping (checkpoint.on_failure = stop): fix the storage, then run again with "
                               "checkpoint.load=auto to resume from the last committed checkpoint",
                     kExitCheckpointFailed);
    // The run's last save: check_final_state says it, in the run's last line.
    if (is_root() && !stopping_ && r.step < cfg_.train_steps)
      log_warn("%s; training goes on and tries again at the next interval (checkpoint.on_failure = continue)",
               r.error.c_str());
    return;
  }
  last_save_s_ = r.io.seconds;
  committed_step_ = r.step;
  log_info("step %6lld | checkpoint %s: %.1f MB in %.2f s (%.1f MB/s), training waited %.2f s", (long long)r.step,
           r.io.file.c_str(), r.io.bytes / 1e6, r.io.seconds, r.io.bytes / 1e6 / r.io.seconds, r.stall_s);
}

std::string CheckpointPolicy::set_aside_diverged(int64_t first_bad) {
  std::string error;
  int64_t kept = -1;
  if (is_root()) {
    try {
      kept = zero3d::set_aside_diverged(dir_, first_bad - 1);
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  kept = groups_.world->all_reduce_max(kept);  // -1: nothing to set aside
  if (kept < 0) return error.empty() ? "" : "; " + error;
  committed_step_ = kept;
  return strprintf("; the checkpoints from step %lld on (the states that gave non-finite values) are renamed "
                   "*.h5.diverged in '%s'",
                   static_cast<long long>(first_bad - 1), dir_.c_str()) +
         (error.empty() ? "" : " (" + error + ")");
}

std::string CheckpointPolicy::latest_text() const {
  return committed_step_ > 0 ? strprintf("'latest' holds step %lld", static_cast<long long>(committed_step_))
                             : std::string("no checkpoint of this run is committed");
}

void CheckpointPolicy::check_final_state(int step, bool save_due, bool loss_nonfinite) const {
  if (loss_nonfinite)
    throw RunError(strprintf("the loss at step %d, the run's last, is not finite: its state is not saved; %s, %lld "
                             "steps are not saved (exit code %d: the run diverged)",
                             step, latest_text().c_str(), static_cast<long long>(step - committed_step_),
                             kExitDiverged),
                   kExitDiverged);
  if (save_due && committed_step_ != step)
    throw RunError(strprintf("%s; the run's final state (step %d) is not in a committed checkpoint: %s, %lld steps "
                             "are not saved (checkpoint.on_failure = continue); fix the storage, then resume with "
                             "checkpoint.load=auto",
                             last_save_error_.c_str(), step, latest_text().c_str(),
                             static_cast<long long>(step - committed_step_)),
                   kExitCheckpointFailed);
}

}  // namespace zero3d
