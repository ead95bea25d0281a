// storage/swap_file.h: one file of swapped training state (NVMe offload), read and written in the
// background. Plain POSIX and threads, unit-tested without MPI.
//
// The file is created and preallocated (posix_fallocate) at construction: a disk too small for
// it fails there, before training, and a disk that others fill later cannot fail a write to it.
// Unwritten ranges read as zeros.
//
// Each file is flock'ed by the process that made it, so a file whose lock is free belongs to a run
// that died: remove_dead_swap_files() clears those at the next start, and the destructor removes
// the file at the end of a run.
//
// A transfer is split into blocks of aio.block_size bytes, run by aio.thread_count threads with
// pread/pwrite. Blocks whose offset, length and address are 4 KiB-aligned go through O_DIRECT
// (no page cache: swapped state does not compete with training for memory, and nothing is
// written twice); the others, and file systems without O_DIRECT (tmpfs), go through the page cache.
// A short transfer goes on where it stopped. One that makes no progress (end of file, an I/O
// error) is retried, then its wait throws IoError naming the file, the offset and the errno
// text: never a silent wrong value.
//
// A sizing file (Options::sizing, for zero3d plan) makes no file and touches no buffer: its
// transfers complete at once and are only counted in its stats, so the engine's swapping code can be
// sized and its I/O counted without a disk.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace zero3d {

struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A checksum of `bytes` (a multiple of 8) for what goes to a swap file and comes back: four lanes
// of 64-bit multiply-xor, several GB/s on one core. Swapped state is checked on every read, so a
// file changed under the run (truncated and re-extended with holes, overwritten) is an error.
uint64_t swap_checksum(const void* data, size_t bytes);

// The run-scoped swap directory under an nvme_path: <nvme_path>/zero3d-<hash of the run dir>.
std::string swap_dir(const std::string& nvme_path, const std::string& run_dir);
// Removes the swap files under nvme_path (in any run's zero3d-* directory) that no live process
// holds: a killed run's. Empty directories go too. Returns how many, with their bytes in *bytes.
int remove_dead_swap_files(const std::string& nvme_path, uint64_t* bytes);

class SwapFile {
 public:
  struct Options {
    size_t block_size = size_t(1) << 20;  // aio.block_size
    int threads = 1;                      // aio.thread_count
    bool sizing = false;                  // no file: transfers are counted, not made
  };
  // Creates (or truncates) path and preallocates `bytes`; throws IoError with what failed.
  SwapFile(std::string path, uint64_t bytes, Options options);
  ~SwapFile();  // finishes the transfers in flight, closes and removes the file
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  using Ticket = uint64_t;
  // Start a transfer; buf must stay valid (and, for a write, unchanged) until wait(ticket).
  Ticket read(uint64_t offset, void* buf, size_t n);
  Ticket write(uint64_t offset, const void* buf, size_t n);
  void wait(Ticket t);  // throws IoError when the transfer failed; a ticket waited for twice returns at once
  void wait_all();

  const std::string& path() const { return path_; }
  bool sizing() const { return opt_.sizing; }

  struct Stats {
    uint64_t bytes_read = 0, bytes_written = 0;
    double read_s = 0, write_s = 0;  // time the I/O threads spent in each (busy)
    double wait_s = 0;               // time callers spent blocked in wait() (exposed)
  };
  Stats take_stats();  // since the last call

 private:
  struct Block {
    Ticket ticket;
    bool write;
    uint64_t offset;
    char* buf;
    size_t n;
  };
  struct Pending {
    size_t blocks = 0;
    std::string error;  // the first failure
  };
  Ticket submit(bool write, uint64_t offset, char* buf, size_t n);
  void worker();
  std::string transfer(const Block& b);  // "" or what failed
  void remove_file() const;              // and its directory, if that leaves it empty

  std::string path_;
  uint64_t bytes_ = 0;
  Options opt_;
  int fd_ = -1, fd_direct_ = -1;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Block> queue_;
  std::map<Ticket, Pending> pending_;
  Ticket next_ = 1;
  size_t blocks_left_ = 0;  // queued or running
  bool stop_ = false;
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace zero3d
