// zero/optimizer_state.h: where the fp32 optimizer state of this rank's owned elements lives:
// exp_avg and exp_avg_sq, and the master weights where they are not the kept parameters
// themselves (mixed precision; fp32 stage 3 with offload_param). Chosen once, by
// offload_optimizer.device:
//   in memory (none; cpu, which on the host backend is the same memory): three arrays;
//   swapped (nvme): one swap file per rank (storage/swap_file.h), streamed through buffer_count
//     buffers of one sub-group (sub_group_size elements, rounded up to 1024) each. While the
//     update runs on sub-group k, the reads of the next ones and the write of the previous one are
//     in flight; the first reads of the next step start as soon as this step's stream ends, so
//     they hide behind forward and backward. With ratio < 1 only the first ceil(ratio * groups)
//     sub-groups are swapped; the rest stays in memory.
// In the file, sub-group k is one record at k * stride holding its fields one after another
// ([master,] exp_avg, exp_avg_sq, S elements each), so a sub-group is one read and one write.
// Every record is checked against the checksum it was written with when it is read back.
//
// Invariant: stream() hands every owned element to the update exactly once, in order, and what
// the update changes is what the next stream() and read() see.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "storage/swap_file.h"
#include "kernels/backend.h"
#include "model/flat_layout.h"  // ShardInfo

namespace zero3d {

// Ends a job whose swapped state failed (an I/O error, a file changed under the run): one line,
// `what` (naming the file) and what to do, exit 8 (kExitSwapFailed); checkpoints are untouched.
[[noreturn]] void swap_failed(const std::string& what);
// Waits for a swap transfer the run cannot do without: an IoError ends the job (swap_failed).
void swap_wait(SwapFile& f, SwapFile::Ticket t);

class OptimizerState {
 public:
  enum Field { master = 0, exp_avg = 1, exp_avg_sq = 2 };
  // Owned elements [begin, begin + n) with their fields (field[master] null without a master).
  struct Span {
    size_t begin = 0, n = 0;
    float* field[3] = {nullptr, nullptr, nullptr};
  };
  using Update = std::function<void(const Span&)>;

  // n owned elements; `with_master`: the state holds the fp32 master weights too. `swap_path`:
  // the swap file when offload.device is nvme (ignored otherwise). `stream_in_sub_groups`: the
  // part in memory is handed over in spans of sub_group_size too (else in one span).
  OptimizerState(Backend& be, size_t n, bool with_master, const OffloadConfig& offload, int64_t sub_group_size,
                 const SwapFile::Options& swap_options, const std::string& swap_path,
                 bool stream_in_sub_groups = false);
  ~OptimizerState();

  size_t size() const { return n_; }
  bool has_master() const { return with_master_; }
  bool swapped() const { return file_ != nullptr; }

  void stream(const Update& update);  // every owned element once, in order; changes are kept
  std::vector<ShardInfo> spans() const;  // the spans stream() hands over (offset, size), in order
  void read(Field f, size_t at, size_t n, float* out);         // host memory out
  void write(Field f, size_t at, size_t n, const float* in);   // host memory in

  size_t resident_bytes() const;  // in memory: the arrays, or the stream buffers and the unswapped tail
  size_t swapped_bytes() const;   // in the swap file (the state's own bytes, without padding)
  size_t buffer_bytes() const;    // the stream buffers alone
  // Swapped: the bytes a stream reads ahead for the next one at its end (they load while forward
  // and backward run); the rest of each stream's reads run beside its updates.
  size_t read_ahead_bytes() const { return std::min(groups_, lookahead_) * stride_; }

  // What the swap file did since the last call (nothing when in memory).
  SwapFile::Stats take_io() { return file_ ? file_->take_stats() : SwapFile::Stats{}; }

 private:
  struct Ahead {  // a read issued ahead of its update
    size_t group;
    int buf;
    SwapFile::Ticket ticket;
  };
  int fields() const { return with_master_ ? 3 : 2; }
  int slot(Field f) const { return with_master_ ? static_cast<int>(f) : static_cast<int>(f) - 1; }
  uint64_t record_offset(size_t k) const { return uint64_t(k) * stride_; }
  size_t group_size(size_t k) const { return std::min(group_, swapped_n_ - k * group_); }
  void issue_read(size_t k);
  void drop_ahead();                       // wait for and forget the reads issued ahead
  void wait_writes(size_t k0, size_t k1);  // sub-groups [k0, k1) written back
  char* record(size_t k);                  // sub-group k's record, read and verified into bufs_[0]
  void flush();                            // write back a record that read()/write() changed
  uint64_t checksum(const char* rec) const;      // of a record (swap_checksum)
  void verify(size_t k, const char* rec) const;  // the record as written, or the job ends (exit 8)
  void copy(Field f, size_t at, size_t n, float* host, bool into_state);  // read() and write()
  float* resident(Field f) { return arrays_[slot(f)].data(); }

  Backend& be_;
  size_t n_;
  bool with_master_;
  // In memory: the whole state (not swapped), or the tail past the swapped sub-groups.
  std::vector<DeviceBuffer<float>> arrays_;
  // Swapped: [0, swapped_n_) in the file, in groups_ sub-groups of group_ elements.
  std::unique_ptr<SwapFile> file_;
  size_t swapped_n_ = 0, group_ = 0, groups_ = 0, stride_ = 0;
  size_t chunk_ = 1;  // the part in memory streams in spans of this many elements
  std::vector<DeviceBuffer<char>> bufs_;  // in be_, which is host memory where the state is swapped
  std::vector<SwapFile::Ticket> buf_write_;    // per buffer: the write of what it held last
  std::vector<SwapFile::Ticket> group_write_;  // per sub-group: its last write
  std::vector<uint64_t> sums_;                 // per sub-group: the checksum of its record as written
  std::vector<bool> fresh_;                    // per sub-group: never written (reads as zeros without I/O)
  static constexpr size_t kNone = ~size_t{0};
  size_t cached_ = kNone;  // the record read()/write() hold in bufs_[0]
  bool dirty_ = false;
  std::deque<Ahead> ahead_;
  size_t next_read_ = 0;  // the next sub-group to read ahead
  int next_buf_ = 0;
  size_t lookahead_ = 1;
};

}  // namespace zero3d
