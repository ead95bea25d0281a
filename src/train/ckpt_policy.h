// train/ckpt_policy.h: when and where a run's state goes to disk, and what a failure means.
// Owns the run directory's and the checkpoint directory's locks, the storage checks before
// training, the writer (ckpt/writer.h), the time budget (run.max_minutes, the Slurm job's end),
// and the rules that end a run: a save that fails under checkpoint.on_failure, a final state that
// is not in a committed checkpoint (exit 7), a stop after a committed save (exit 6).
//
// Invariant: nothing is written before every input has been checked; a run that fails its checks
// leaves no trace (no run directory it created, no lock, no empty checkpoint directory).
#pragma once
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/writer.h"
#include "config/config.h"
#include "core/clock.h"
#include "parallel/groups.h"
#include "storage/checks.h"
#include "train/fault.h"
#include "train/records.h"
#include "train/run_options.h"
#include "zero/engine.h"

namespace zero3d {

class CheckpointPolicy {
 public:
  CheckpointPolicy(const Config& c, const RunOptions& o, ProcessGroups& g, ZeroEngine& engine,
                   const FaultInjector& faults, RunRecords& records);
  ~CheckpointPolicy();

  // The checkpoint.load the config asks for (collective; throws UserError: an input error too).
  std::optional<LoadedCheckpoint> load();
  // The run directory (created and locked), the checkpoint directory (checked, locked, room for
  // the saves of steps start_step..train_steps), the writer. UserError leaves no trace.
  void prepare(int64_t start_step);
  const std::string& writer_mode() const { return writer_->mode(); }

  // The time budget: would another step and a checkpoint overrun it? (rank 0 judges)
  void note_step_time(double s) { max_step_s_ = std::max(max_step_s_, s); }
  bool out_of_time() const;
  double time_budget_s() const { return time_budget_s_; }

  // At a step boundary, in this order: a background save every rank has finished gets its record;
  // then this step's save when due (stop: the run's last); then, at the run's end, the last save
  // waited for. Collective.
  void finish_if_done();
  void set_stopping(bool stopping) { stopping_ = stopping; }  // a stop signal or the budget: no save after this
  void save(const TrainingState& st);
  void finish_pending();
  // What `latest` holds, for the lines that end a run; where it is.
  std::string latest_text() const;
  const std::string& dir() const { return dir_; }
  // The run diverged at `first_bad` (the first of the steps in a row whose loss or gradient was not
  // finite): the checkpoints of the states that led there (from step first_bad - 1 on) are set
  // aside (ckpt/dir.h), so `latest` holds the last state whose next loss was finite. Collective;
  // returns what was done, for the run's last line.
  std::string set_aside_diverged(int64_t first_bad);
  // The run's last step: its state must be in a committed checkpoint when one was due (RunError 7),
  // and a non-finite loss is never saved (RunError 9).
  void check_final_state(int step, bool save_due, bool loss_nonfinite) const;
  // The stop line's numbers.
  double max_step_s() const { return max_step_s_; }
  double last_save_s() const { return last_save_s_; }
  // rank 0: the run directory is still this run's (false after an rm -rf under the run)
  bool run_dir_held() const { return !lock_ || lock_->still_held(); }

 private:
  void hold_or_move_stop_saves();
  void check_storage(int64_t start_step);
  void finish(const SaveResult& r);
  bool is_root() const { return groups_.world_rank == 0; }

  const Config& cfg_;
  const RunOptions& opt_;
  ProcessGroups& groups_;
  ZeroEngine& engine_;
  const FaultInjector& faults_;
  RunRecords& records_;
  std::string dir_;                          // checkpoint.dir, or <run dir>/checkpoints
  std::string tokenizer_;                    // data.tokenizer's record (ckpt/tokenizer_record.h), in every save
  bool tokenizer_copy_warned_ = false;
  std::unique_ptr<DirLock> lock_;            // rank 0: this run owns the run dir
  std::unique_ptr<DirLock> ckpt_lock_;       // rank 0: and is the one writer of the checkpoint dir
  std::unique_ptr<CheckpointWriter> writer_;
  int64_t committed_step_ = 0;               // what `latest` holds (0: none)
  std::string last_save_error_;              // "" = the last save committed
  bool stopping_ = false;                    // this step's save is the run's last
  Clock::time_point t_start_ = Clock::now();
  double time_budget_s_ = std::numeric_limits<double>::infinity();
  double max_step_s_ = 0;   // slowest step so far
  double last_save_s_ = 0;  // the last checkpoint's save time (before the first: an estimate)
};

}  // namespace zero3d
