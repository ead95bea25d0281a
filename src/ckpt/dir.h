// ckpt/dir.h: the checkpoint directory and its commit protocol, plain POSIX (no MPI, no HDF5),
// so it is unit-tested alone.
//
// A directory holds committed checkpoints step_XXXXXXXX.h5 and `latest`, one line naming the
// newest committed one. A save writes step_XXXXXXXX.h5.tmp; commit() (rank 0, after every rank
// has closed the file) fsyncs it, renames it into place, fsyncs the directory, replaces `latest`
// durably, prunes to keep_last and removes the .h5.tmp leftovers of saves that died. Invariant: at
// every instant `latest` names a complete, committed file (or does not exist yet).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zero3d {

// step_00000020.h5 -> 20; -1 if the name is not a checkpoint's.
int64_t step_of(const std::string& file);
// Committed checkpoints in dir (step_*.h5), newest first; none when dir does not exist.
std::vector<std::string> list_checkpoints(const std::string& dir);
// The file name DIR/latest holds, "" when there is none (as written: it may not be a checkpoint's).
// printable: a name as a message may show it (no control bytes, at most 64 characters).
std::string read_latest(const std::string& dir);
std::string printable(const std::string& s);
// The checkpoint file DIR_OR_FILE names: a file as is; a directory through its `latest`.
// Throws UserError when there is none, or `latest` holds no checkpoint's name.
std::string checkpoint_file(const std::string& dir_or_file);
// Rank 0, once the file at `tmp` is complete: publish it as `final_path` and point `latest` at it,
// then prune (keep_last > 0: the newest keep_last stay) and remove partial saves. Returns "" or
// what failed (then `tmp` is removed and `latest` still names the previous checkpoint).
std::string commit_checkpoint(const std::string& dir, const std::string& tmp, const std::string& final_path,
                              int keep_last);
// Rank 0, when a run diverged: the committed checkpoints of step `from` on hold states whose next
// loss was not finite, so each is renamed NAME.diverged (kept for a look, never loaded again) and
// `latest` names the newest one before them, or is removed when there is none. Returns the step
// `latest` then names (0: none), or -1 (nothing touched) when no checkpoint is of step `from` or
// later; throws UserError when a rename fails.
int64_t set_aside_diverged(const std::string& dir, int64_t from);
// Removes the DIR/*.h5.tmp files of saves that died (a run that holds the run dir's lock owns them).
void remove_partial_saves(const std::string& dir);

}  // namespace zero3d
