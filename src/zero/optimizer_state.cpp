#include "zero/optimizer_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace zero3d {

namespace {
constexpr size_t kGroupAlign = 1024;  // elements: records and fields start on 4 KiB boundaries (O_DIRECT)

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

void swap_failed(const std::string& what) {
  abort_job(what + ". Offloaded training state is lost on this rank; the last committed checkpoint is intact: fix "
                   "the storage and resume from it",
            kExitSwapFailed);
}

void swap_wait(SwapFile& f, SwapFile::Ticket t) {
  try {
    f.wait(t);
  } catch (const IoError& e) {
    swap_failed(e.what());
  }
}

OptimizerState::OptimizerState(Backend& be, size_t n, bool with_master, const OffloadConfig& offload,
                               int64_t sub_group_size, const SwapFile::Options& swap_options, const std::string& swap_path,
                               bool stream_in_sub_groups)
    : be_(be), n_(n), with_master_(with_master) {
  chunk_ = stream_in_sub_groups ? std::max<size_t>(static_cast<size_t>(sub_group_size), 1) : std::max<size_t>(n_, 1);
  if (offload.device == OffloadDevice::nvme && n_ > 0) {
    group_ = std::min(round_up(static_cast<size_t>(sub_group_size), kGroupAlign), round_up(n_, kGroupAlign));
    const size_t all_groups = (n_ + group_ - 1) / group_;
    groups_ = std::min(all_groups, static_cast<size_t>(std::ceil(offload.ratio * double(all_groups) - 1e-9)));
    groups_ = std::max<size_t>(groups_, 1);
    swapped_n_ = std::min(n_, groups_ * group_);
    stride_ = group_ * fields() * sizeof(float);
    file_ = std::make_unique<SwapFile>(swap_path, uint64_t(groups_) * stride_, swap_options);
    Z3D_ASSERT(be.memory_kind() == MemKind::host, "optimizer state: swapped state streams through host memory");
    const int nbuf = static_cast<int>(std::min<size_t>(offload.buffer_count, groups_));
    for (int b = 0; b < nbuf; ++b) bufs_.emplace_back(be, stride_);  // page-aligned (O_DIRECT): a stride is 4 KiB x k
    buf_write_.assign(nbuf, 0);
    group_write_.assign(groups_, 0);
    fresh_.assign(groups_, true);
    sums_.assign(groups_, 0);  // set by each record's first write; a fresh record is zeroed, not read
    // Reads ahead: all buffers but the one being updated and the one being written back.
    lookahead_ = static_cast<size_t>(std::max(1, nbuf - 2));
  }
  for (int f = 0; f < fields(); ++f) arrays_.emplace_back(be, n_ - swapped_n_);  // zeroed
}

OptimizerState::~OptimizerState() {
  if (file_) {
    flush();
    drop_ahead();
    try {
      file_->wait_all();
    } catch (const IoError&) {  // the run is ending anyway
    }
  }
}

size_t OptimizerState::resident_bytes() const {
  size_t b = buffer_bytes();
  for (const auto& a : arrays_) b += a.bytes();
  return b;
}

std::vector<ShardInfo> OptimizerState::spans() const {
  std::vector<ShardInfo> out;
  for (size_t k = 0; k < groups_; ++k) out.push_back({k * group_, group_size(k)});
  for (size_t at = swapped_n_; at < n_; at += chunk_) out.push_back({at, std::min(chunk_, n_ - at)});
  return out;
}

size_t OptimizerState::swapped_bytes() const { return swapped_n_ * fields() * sizeof(float); }

size_t OptimizerState::buffer_bytes() const { return bufs_.size() * stride_; }

void OptimizerState::issue_read(size_t k) {
  const int b = next_buf_;
  next_buf_ = (next_buf_ + 1) % static_cast<int>(bufs_.size());
  swap_wait(*file_, buf_write_[b]);    // the buffer's last sub-group is written back
  swap_wait(*file_, group_write_[k]);  // and this sub-group's own last write is on file
  if (fresh_[k]) {  // never written: the preallocated file holds zeros, no need to read them
    be_.zero(bufs_[b].data(), stride_);
    ahead_.push_back({k, b, 0});
    return;
  }
  ahead_.push_back({k, b, file_->read(record_offset(k), bufs_[b].data(), stride_)});
}

void OptimizerState::drop_ahead() {
  for (const Ahead& a : ahead_) swap_wait(*file_, a.ticket);
  ahead_.clear();
  next_read_ = 0;
}

void OptimizerState::wait_writes(size_t k0, size_t k1) {
  for (size_t k = k0; k < k1; ++k) swap_wait(*file_, group_write_[k]);
}

void OptimizerState::stream(const Update& update) {
  if (file_) flush(), cached_ = kNone;  // the stream reuses the buffers
  for (size_t k = 0; k < groups_; ++k) {
    // The reads ahead: sub-groups k .. k + lookahead - 1 (some were issued by the last stream).
    while (next_read_ < std::min(groups_, k + lookahead_)) issue_read(next_read_++);
    const Ahead a = ahead_.front();
    ahead_.pop_front();
    Z3D_ASSERT(a.group == k, "optimizer state: sub-groups read out of order");
    swap_wait(*file_, a.ticket);

    char* rec = bufs_[a.buf].data();
    if (!fresh_[k]) verify(k, rec);  // a fresh record was zeroed here, not read
    Span s;
    s.begin = k * group_, s.n = group_size(k);
    for (Field f : {master, exp_avg, exp_avg_sq})
      if (f != master || with_master_) s.field[f] = reinterpret_cast<float*>(rec + slot(f) * group_ * sizeof(float));
    update(s);
    sums_[k] = checksum(rec);
    buf_write_[a.buf] = group_write_[k] = file_->write(record_offset(k), rec, stride_);
    fresh_[k] = false;
  }
  for (size_t at = swapped_n_; at < n_; at += chunk_) {  // what stays in memory
    Span s;
    s.begin = at, s.n = std::min(chunk_, n_ - at);
    for (Field f : {master, exp_avg, exp_avg_sq})
      if (f != master || with_master_) s.field[f] = resident(f) + (at - swapped_n_);
    update(s);
  }
  if (file_) {  // the next step's first reads, behind its forward and backward
    next_read_ = 0;
    while (next_read_ < std::min(groups_, lookahead_)) issue_read(next_read_++);
  }
}

// Checkpoints and loads reach the swapped state one record at a time, through the first stream
// buffer (the reads ahead are dropped: the next stream issues them again).
char* OptimizerState::record(size_t k) {
  if (cached_ == k) return bufs_[0].data();
  flush();
  drop_ahead();
  swap_wait(*file_, buf_write_[0]);
  wait_writes(k, k + 1);
  if (fresh_[k]) {
    be_.zero(bufs_[0].data(), stride_);
  } else {
    swap_wait(*file_, file_->read(record_offset(k), bufs_[0].data(), stride_));
    verify(k, bufs_[0].data());
  }
  cached_ = k;
  return bufs_[0].data();
}

void OptimizerState::flush() {
  if (!dirty_) return;
  sums_[cached_] = checksum(bufs_[0].data());
  swap_wait(*file_, group_write_[cached_] = file_->write(record_offset(cached_), bufs_[0].data(), stride_));
  fresh_[cached_] = false;
  dirty_ = false;
}

uint64_t OptimizerState::checksum(const char* rec) const {
  return file_->sizing() ? 0 : swap_checksum(rec, stride_);  // sizing: the record is not memory to read
}

void OptimizerState::verify(size_t k, const char* rec) const {
  if (checksum(rec) != sums_[k])
    swap_failed(strprintf("swap file '%s': sub-group %zu (%zu bytes at offset %llu) does not read back what was "
                          "written (checksum mismatch: the file was changed under the run)",
                          file_->path().c_str(), k, stride_, static_cast<unsigned long long>(record_offset(k))));
}

void OptimizerState::read(Field f, size_t at, size_t n, float* out) { copy(f, at, n, out, false); }

void OptimizerState::write(Field f, size_t at, size_t n, const float* in) {
  copy(f, at, n, const_cast<float*>(in), true);
}

// Elements [at, at + n) of field f and host memory, either way: record by record where swapped,
// in one piece where in memory.
void OptimizerState::copy(Field f, size_t at, size_t n, float* host, bool into_state) {
  Z3D_ASSERT(at + n <= n_ && (f != master || with_master_), "optimizer state: access outside the state");
  for (size_t end = at + n; at < end;) {
    if (at >= swapped_n_) {
      float* mem = resident(f) + (at - swapped_n_);
      const size_t bytes = (end - at) * sizeof(float);
      if (into_state) be_.copy_from_host(mem, host, bytes);
      else be_.copy_to_host(host, mem, bytes);
      return;
    }
    const size_t k = at / group_, take = std::min(end, (k + 1) * group_) - at;
    float* field = reinterpret_cast<float*>(record(k)) + slot(f) * group_ + (at - k * group_);
    if (into_state) std::copy_n(host, take, field), dirty_ = true;
    else std::copy_n(field, take, host);
    at += take, host += take;
  }
}

}  // namespace zero3d
