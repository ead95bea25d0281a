// zero/host_link.h: offload on a device backend (the CUDA backend; the walled test backend). The
// optimizer state lives in host memory and AdamW runs on the CPU (a host backend of the rank's
// own: vectorized, all its threads); this link moves what the update needs between the two.
//
// Per span of the optimizer state (a sub-group): its gradient comes down into a pinned buffer,
// the CPU updates master, m and v, and the new weights (rounded to 16 bits in mixed precision)
// go up from another pinned buffer. The copies run on one background thread in the order they
// were queued, so while the CPU updates span k the gradient of span k + 1 comes down and the
// weights of span k - 1 go up (ZeRO-Offload's pipeline). `depth` buffers each way.
//
// Invariant: a buffer is refilled only after every copy that read or wrote it has completed, and
// finish() returns only when every queued copy has: the device weights are then final.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/flat_layout.h"  // ShardInfo

namespace zero3d {

// Page-locked host memory from the device backend (pageable where it has none), freed with it.
class PinnedBuffer {
 public:
  PinnedBuffer(Backend& device, size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : dm_(o.dm_), p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(PinnedBuffer&&) = delete;
  char* data() { return static_cast<char*>(p_); }
  size_t bytes() const { return n_; }

 private:
  DeviceMemory* dm_;
  void* p_ = nullptr;
  size_t n_;
};

class HostLink {
 public:
  struct Grads {  // owned-state elements [state_offset, + n) have their gradient at `device`
    size_t state_offset = 0, n = 0;
    const float* device = nullptr;
  };

  explicit HostLink(Backend& device);

  ~HostLink();
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  Backend& cpu() { return *cpu_; }  // the host backend the state lives in and the update runs on
  // The spans (owned-state offset and size) every pass updates, in order, and buffers for the
  // largest, `depth` each way (at least 1, at most one per span); once.
  void reserve(std::vector<ShardInfo> spans, int depth);
  void set_gradients(std::vector<Grads> grads);  // in state order, once the gradient buffers exist
  void begin();  // a pass: the first downloads start
  // The gradient of the pass's next span (in order), in host memory, once it is down; its
  // buffer is refilled with a later span's at the next call.
  const float* next_grads();
  // A pinned buffer of span_max floats to stage weights in, once its last uploads completed, and
  // the upload of bytes from inside it to the device.
  char* upload_buffer();
  void upload(void* device_dst, const void* staged, size_t bytes);
  void finish();  // every queued copy completed

  // Any other copy up (stage 3's offloaded slices into a slot), in order with the rest.
  using Ticket = uint64_t;  // copies complete in ticket order; 0: nothing to wait for
  Ticket copy_to_device(void* device_dst, const void* src, size_t bytes) { return queue({device_dst, src, bytes, true}); }
  void wait(Ticket t);

  size_t span_max() const { return span_max_; }
  // Since the last call: the copy thread's busy time, the time the update waited for copies, and
  // the bytes that came down and went up.
  struct Stats {
    double copy_s = 0, wait_s = 0;
    uint64_t bytes_down = 0, bytes_up = 0;
  };
  Stats take_stats();
  size_t buffer_bytes() const { return (down_.size() + up_.size()) * span_max_ * sizeof(float); }

 private:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    bool to_device;
  };
  Ticket queue(const Copy& c);
  void download(size_t span, int buf);  // span's gradient pieces into down_[buf]
  void run();                           // the copy thread

  Backend& device_;
  std::unique_ptr<Backend> cpu_;
  size_t span_max_ = 0;
  std::vector<PinnedBuffer> down_, up_;
  std::vector<Ticket> down_done_, up_done_;  // per buffer: the last copy that uses it
  std::vector<Grads> grads_;
  std::vector<ShardInfo> spans_;
  size_t next_span_ = 0;  // the next span next_grads() returns
  int next_up_ = 0, current_up_ = 0;  // the upload buffer upload_buffer() handed out next, and last

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Copy> queue_;
  Ticket queued_ = 0, completed_ = 0;
  std::exception_ptr failed_;
  Stats stats_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zero3d
