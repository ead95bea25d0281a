#include "zero/host_link.h"

#include <algorithm>

#include "core/check.h"
#include "core/clock.h"

namespace zero3d {

PinnedBuffer::PinnedBuffer(Backend& device, size_t bytes) : dm_(device.device_memory()), n_(bytes) {
  if (n_ == 0) return;
  p_ = dm_ ? dm_->alloc_pinned(n_) : ::operator new(n_);
}

PinnedBuffer::~PinnedBuffer() {
  if (!p_) return;
  if (dm_) dm_->free_pinned(p_);
  else ::operator delete(p_);
}

HostLink::HostLink(Backend& device) : device_(device), cpu_(device.host_companion()) {
  if (!cpu_) cpu_ = make_host_backend();
  thread_ = std::thread([this] { run(); });
}

void HostLink::reserve(std::vector<ShardInfo> spans, int depth) {
  Z3D_ASSERT(down_.empty(), "host link: reserve() twice");
  spans_ = std::move(spans);
  for (const ShardInfo& s : spans_) span_max_ = std::max(span_max_, s.size);
  const size_t buffers = std::max<size_t>(1, std::min(static_cast<size_t>(std::max(depth, 1)), spans_.size()));
  for (size_t b = 0; b < buffers; ++b) {
    down_.emplace_back(device_, span_max_ * sizeof(float));
    up_.emplace_back(device_, span_max_ * sizeof(float));
  }
  down_done_.assign(down_.size(), 0);
  up_done_.assign(up_.size(), 0);
}

HostLink::~HostLink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // after the queue ran dry: no copy still reads a buffer freed below
}

void HostLink::run() {
  if (DeviceMemory* dm = device_.device_memory()) dm->use_on_this_thread();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const Copy c = queue_.front();
    lock.unlock();
    std::exception_ptr err;
    const auto t0 = Clock::now();
    try {
      if (c.to_device) device_.copy_from_host(c.dst, c.src, c.bytes);
      else device_.copy_to_host(c.dst, c.src, c.bytes);
    } catch (...) {
      err = std::current_exception();
    }
    const double took = seconds_since(t0);
    lock.lock();
    stats_.copy_s += took;
    (c.to_device ? stats_.bytes_up : stats_.bytes_down) += c.bytes;
    queue_.pop_front();
    if (err && !failed_) failed_ = err;
    ++completed_;
    cv_.notify_all();
  }
}

HostLink::Ticket HostLink::queue(const Copy& c) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(c);
  cv_.notify_all();
  return ++queued_;
}

void HostLink::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (completed_ < t && !failed_) {
    const auto t0 = Clock::now();
    cv_.wait(lock, [&] { return completed_ >= t || failed_; });
    stats_.wait_s += seconds_since(t0);
  }
  if (failed_) std::rethrow_exception(failed_);
}

HostLink::Stats HostLink::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(stats_, Stats{});
}

// MessageSlices that follow each other both in the state and on the device merge: one copy each.
void HostLink::set_gradients(std::vector<Grads> grads) {
  grads_.clear();
  for (const Grads& g : grads) {
    if (!grads_.empty()) {
      Grads& last = grads_.back();
      if (last.state_offset + last.n == g.state_offset && last.device + last.n == g.device) {
        last.n += g.n;
        continue;
      }
    }
    grads_.push_back(g);
  }
}

// The pieces of span `span` as copies into buffer `buf`, at their offsets in the span.
void HostLink::download(size_t span, int buf) {
  const size_t begin = spans_[span].offset, n = spans_[span].size;
  auto g = std::lower_bound(grads_.begin(), grads_.end(), begin,
                            [](const Grads& x, size_t at) { return x.state_offset + x.n <= at; });
  float* dst = reinterpret_cast<float*>(down_[buf].data());
  Ticket last = 0;
  for (; g != grads_.end() && g->state_offset < begin + n; ++g) {
    const size_t lo = std::max(g->state_offset, begin), hi = std::min(g->state_offset + g->n, begin + n);
    last = queue({dst + (lo - begin), g->device + (lo - g->state_offset), (hi - lo) * sizeof(float), false});
  }
  down_done_[buf] = last;
}

void HostLink::begin() {
  next_span_ = 0;
  for (size_t k = 0; k < std::min(spans_.size(), down_.size()); ++k) download(k, static_cast<int>(k));
}

const float* HostLink::next_grads() {
  const size_t k = next_span_++;
  Z3D_ASSERT(k < spans_.size(), "host link: more spans updated than reserve() announced");
  const size_t depth = down_.size();
  if (k > 0 && k - 1 + depth < spans_.size())  // span k - 1 is updated: its buffer takes a later span
    download(k - 1 + depth, static_cast<int>((k - 1) % depth));
  const int buf = static_cast<int>(k % depth);
  wait(down_done_[buf]);
  return reinterpret_cast<const float*>(down_[buf].data());
}

char* HostLink::upload_buffer() {
  const int buf = next_up_;
  next_up_ = (next_up_ + 1) % static_cast<int>(up_.size());
  wait(up_done_[buf]);
  current_up_ = buf;
  return up_[buf].data();
}

void HostLink::upload(void* device_dst, const void* staged, size_t bytes) {
  up_done_[current_up_] = queue({device_dst, staged, bytes, true});
}

void HostLink::finish() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = queued_;
  }
  wait(last);
}

}  // namespace zero3d
