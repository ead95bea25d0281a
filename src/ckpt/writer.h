// ckpt/writer.h: a checkpoint save in two halves, so training need not wait for the disk.
//
//   stage (training thread, at the save step): this rank's pieces (zero/shard_view.h) are copied
//     into one host buffer, allocated and touched once, in file order.
//   write (a writer thread with its own communicator; in place when checkpoint.async is off or MPI
//     lacks MPI_THREAD_MULTIPLE): checksums of the staged pieces, summed over the world; rank 0
//     creates the HDF5 file alone (root attributes, every dataset contiguous with its space
//     allocated and its checksum attribute) and tells every rank where each dataset's data
//     starts; every rank writes its pieces there with pwrite, straight from the staging buffer,
//     one call per contiguous run, and fsyncs; the ranks vote; rank 0 commits (ckpt/dir.h).
//     The data never passes through MPI-IO's two-phase collective buffering: each rank's pieces
//     are large contiguous runs already, and the page cache takes them at memory speed.
//
// Invariants: `latest` only ever names a committed file; a save that fails anywhere (disk full,
// I/O error, a read-only directory) aborts nothing: every rank gets the same SaveResult with the
// first error (errno text, file, rank), the partial file is removed, and the HDF5 error stack, if
// any, goes to the error log, not the terminal. A save, a stop, the time budget and the end of the
// run first wait for a pending save (wait()). The writer's phases run under the watchdog
// (parallel/watchdog.h) with the save's time limit.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/host_buffer.h"
#include "ckpt/checkpoint.h"
#include "parallel/watchdog.h"

namespace zero3d {

struct SaveResult {
  int64_t step = 0;
  CheckpointIO io;      // io.file: the committed file
  std::string error;    // "" = committed; else what failed, the same text on every rank
  double stall_s = 0;   // the training thread's time in save(): the wait for the previous save, staging, and (in
                        // place) the write
};

// Fault injection for the tests (train/fault.h): this rank's writer, in one save, stops for good
// halfway through its writes, or pauses a second (saying so, with its pid, on stderr) before its
// first write or halfway, so that a test can arm a failure point in the process (libfiu's fiu-ctrl).
struct SaveFaults {
  bool stall_halfway = false, pause_start = false, pause_middle = false;
};
// The pause itself, also before a load: one line on stderr naming the pid and where, then 1 s.
void pause_for_fault_injection(const std::string& where);

class CheckpointWriter {
 public:
  // Collective over the world (it makes the writer's communicator). error_log: where HDF5's error
  // stack goes when a save fails.
  CheckpointWriter(const CheckpointRun& run, std::string dir, const CheckpointConfig& cfg, std::string error_log);
  ~CheckpointWriter();  // waits for a pending save
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // How saves run, for the run record: "background (writer thread)" or why in place.
  const std::string& mode() const { return mode_; }
  bool async() const { return async_; }
  // The tensor bytes of one checkpoint file (the whole file, every rank's part).
  uint64_t file_bytes() const { return file_bytes_; }

  // Collective. Stages the state after `st.step` and writes it (in the background, or before
  // returning). Requires !pending(): wait() for the previous one first.
  void save(const TrainingState& st, SaveFaults faults = {});
  bool pending() const { return pending_; }
  // This rank's writer is done with the pending save (non-blocking; ranks may see it at different
  // times, so agree before acting on it).
  bool done_here();
  // Collective. Blocks until the pending save committed or failed; its result, alike on every rank.
  SaveResult wait();

 private:
  struct StagedPiece;  // one dataset's piece: where it is staged and where its runs go in the dataset
  void write(int64_t step, const TrainingState& st, SaveFaults faults);  // the second half
  std::vector<uint64_t> staged_checksums();                              // collective over group_
  std::string write_pieces(const std::string& tmp, const std::vector<uint64_t>& offsets, int64_t step,
                           SaveFaults faults, Watchdog::Phase& phase);  // this rank's, local
  void thread_main();
  double timeout_s() const;

  const CheckpointRun run_;
  const std::string dir_, error_log_;
  const CheckpointConfig cfg_;
  std::unique_ptr<ProcessGroup> group_;  // the world again, for the writer alone
  std::vector<DatasetSpec> specs_;
  std::vector<StagedPiece> parts_;
  HostBuffer staging_;         // every part, in spec order (allocated at the first save)
  size_t staging_bytes_ = 0;
  bool keep_staging_ = true;   // false with swapped state: freed after each save
  uint64_t file_bytes_ = 0;
  double bandwidth_ = 100e6;   // bytes/s of the last write (a cautious guess before the first)
  std::string mode_;
  bool async_ = false, pending_ = false;
  TrainingState staged_;
  SaveResult result_;

  // The writer thread and its one-job queue.
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  bool job_ = false, done_ = false, stop_ = false;
  SaveFaults faults_;
};

}  // namespace zero3d
