#include "ckpt/writer.h"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/posix_io.h"
#include "ckpt/transfer.h"
#include "storage/hdf5_posix.h"
#include "parallel/watchdog.h"

namespace zero3d {

namespace fs = std::filesystem;

struct CheckpointWriter::StagedPiece {
  size_t spec = 0;                                   // index in specs_
  const CheckpointPiece* piece = nullptr;
  size_t staged = 0;                                 // byte offset in staging_
  size_t elem = 4;                                   // bytes per element
  std::vector<std::pair<uint64_t, uint64_t>> runs;   // (first element in the dataset, elements), piece order
};

namespace {

constexpr size_t kPage = 4096;  // the alignment O_DIRECT asks for (logical block size up to 4 KiB)

// n bytes from src to offset `at` of the file: the whole pages of the range through `direct`
// (O_DIRECT, -1: none) when src and `at` are alike modulo a page, the rest through `fd`.
// Direct writes skip the page cache: no copy, and no dirty-page throttling, which on a machine
// whose memory the training fills holds buffered writers to a fraction of the disk's rate.
// Returns "" or what failed.
std::string write_run(int fd, int direct, const char* src, size_t n, uint64_t at) {
  const uint64_t head = (kPage - at % kPage) % kPage;
  const bool aligned = reinterpret_cast<uintptr_t>(src) % kPage == at % kPage;
  if (direct < 0 || !aligned || n < head + kPage) return pwrite_fully(fd, src, n, at);
  const size_t body = (n - head) / kPage * kPage;
  std::string e = pwrite_fully(fd, src, head, at);
  if (e.empty()) e = pwrite_fully(direct, src + head, body, at + head, /*rest_fd=*/fd);
  if (e.empty()) e = pwrite_fully(fd, src + head + body, n - head - body, at + head + body);
  return e;
}

// Every rank's `mine`, agreed: "" when every rank's is empty, else the lowest failing rank's text.
std::string agreed(ProcessGroup& g, const std::string& mine) {
  try {
    g.agree([&] {
      if (!mine.empty()) throw UserError(mine);
    });
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Rank 0 alone: the file with its root attributes and every dataset (contiguous, space allocated,
// checksum attribute set), and where each dataset's data starts. HDF5 writes through zero3d's
// POSIX driver (storage/hdf5_posix.h), so a failed write is named by the system and every handle
// still closes. Returns "" or what failed (HDF5's error stack, if it has one, appended to error_log).
std::string create_skeleton(const std::string& tmp, const CheckpointHeader& header,
                            const std::vector<DatasetSpec>& specs, const std::vector<uint64_t>& sums,
                            const std::string& dtype16, std::vector<uint64_t>& offsets, const std::string& error_log) {
  QuietHdf5 quiet;
  H5Eclear2(H5E_DEFAULT);
  clear_io_error();
  const char* doing = "creating";
  std::string stack;
  try {
    Hid fapl = posix_file_access();
    // Datasets of a page or more start on a page boundary: the writes below are page-aligned.
    H5Pset_alignment(fapl.get(), 4096, 4096);
    Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!file.valid()) throw Hdf5Error("creating");
    doing = "writing the metadata of";
    write_header(file.get(), header);
    for (const char* g : {"/model", "/optimizer", "/optimizer/master", "/optimizer/exp_avg", "/optimizer/exp_avg_sq"}) {
      if (!header.mixed() && std::string(g) == "/optimizer/master") continue;
      Hid grp(H5Gcreate2(file.get(), g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!grp.valid()) throw Hdf5Error(g);
    }
    Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
    if (H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0 || H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0)
      throw Hdf5Error("dataset properties");
    for (size_t k = 0; k < specs.size(); ++k) {
      const DatasetSpec& spec = specs[k];
      Hid space(H5Screate_simple(static_cast<int>(spec.dims.size()), spec.dims.data(), nullptr));
      Hid ds(H5Dcreate2(file.get(), spec.path.c_str(), spec.sixteen ? H5T_STD_U16LE : H5T_IEEE_F32LE, space.get(),
                        H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
      if (!ds.valid()) throw Hdf5Error(spec.path);
      if (spec.sixteen) write_attr(ds.get(), "dtype", dtype16);
      write_attr(ds.get(), "checksum", sums[k]);
      const haddr_t at = H5Dget_offset(ds.get());
      if (at == HADDR_UNDEF) throw Hdf5Error(spec.path + ": no contiguous storage");
      offsets[k] = at;
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Hdf5Error("flush");
    if (H5Fclose(file.release()) < 0) throw Hdf5Error("close");  // the metadata is on disk, the data space reserved
  } catch (const Hdf5Error& e) {
    stack = e.stack;
  }
  // Every handle is closed here (the driver's writes never fail HDF5). Its record of the first
  // failed system call names the cause best; HDF5's stack is for what is not a system call.
  const std::string io = io_error();
  if (io.empty() && stack.empty()) return "";
  std::error_code ec;
  fs::remove(tmp, ec);
  if (!io.empty()) return strprintf("rank 0 (%s): %s", host_name().c_str(), io.c_str());
  std::ofstream log(error_log, std::ios::app);
  const std::time_t now = std::time(nullptr);
  log << "---- " << std::ctime(&now) << "checkpoint file " << tmp << ": " << doing << " failed\n" << stack;
  const std::string cause = hdf5_system_error(stack);
  return strprintf("rank 0 (%s): %s '%s' failed: %s (HDF5's error stack is in %s)", host_name().c_str(), doing,
                   tmp.c_str(), cause.empty() ? "HDF5 error" : cause.c_str(), error_log.c_str());
}

}  // namespace

CheckpointWriter::CheckpointWriter(const CheckpointRun& run, std::string dir, const CheckpointConfig& cfg,
                                   std::string error_log)
    : run_(run), dir_(std::move(dir)), error_log_(std::move(error_log)), cfg_(cfg) {
  ProcessGroup& world = *run_.groups.world;
  group_ = ProcessGroup::split(world, 0, world.rank(), "checkpoint");
  specs_ = checkpoint_datasets(run_.config.model, run_.engine.mixed());
  std::vector<const CheckpointPiece*> piece_of(specs_.size(), nullptr);
  for (const CheckpointPiece& p : run_.engine.save_pieces()) piece_of[p.tensor] = &p;
  size_t at = 0;
  for (size_t k = 0; k < specs_.size(); ++k) {
    const DatasetSpec& spec = specs_[k];
    uint64_t elems = 1;
    for (hsize_t d : spec.dims) elems *= d;
    const size_t elem = spec.sixteen ? 2 : 4;
    file_bytes_ += elems * elem;
    const CheckpointPiece* p = piece_of[spec.tensor];
    if (!p) continue;
    StagedPiece part{k, p, 0, elem, element_runs(*p, spec.dims)};
    // Staged at the same offset modulo a page as its first run in the file (datasets start on a
    // page), so the run's whole pages can go to the disk directly (write_run).
    const size_t in_page = (part.runs.front().first * elem) % kPage;
    part.staged = (at + kPage - 1) / kPage * kPage + in_page;
    at = part.staged + p->piece.size * elem;
    parts_.push_back(std::move(part));
  }
  staging_bytes_ = at;  // allocated and touched at the first save, so a save copies at memory speed
  // With state swapped to nvme, memory is what the run is short of: the staging lives only
  // from a save's copy to the end of its write.
  keep_staging_ = run_.engine.memory().swapped == 0;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  async_ = cfg_.async && provided >= MPI_THREAD_MULTIPLE;
  mode_ = async_ ? "background (a writer thread; training waits only for a copy of its state)"
          : !cfg_.async ? "in place (checkpoint.async is false)"
                        : "in place (the MPI library does not provide MPI_THREAD_MULTIPLE)";
  if (async_) thread_ = std::thread([this] { thread_main(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (async_) {
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return !job_; });  // a save in flight finishes first (its file stays consistent)
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

double CheckpointWriter::timeout_s() const {
  if (cfg_.timeout_s > 0) return cfg_.timeout_s;
  return std::max(comm_context().timeout_s, 3.0 * static_cast<double>(file_bytes_) / bandwidth_);
}

void pause_for_fault_injection(const std::string& where) {
  std::fprintf(stderr, "zero3d: fault injection: pid %d pauses 1 s %s\n", static_cast<int>(::getpid()), where.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

void CheckpointWriter::save(const TrainingState& st, SaveFaults faults) {
  Z3D_ASSERT(!pending_, "a checkpoint save while the previous one is pending");
  const auto t0 = Clock::now();
  ZeroEngine& engine = run_.engine;
  if (staging_.size() < staging_bytes_) staging_ = HostBuffer(staging_bytes_);
  for (const StagedPiece& p : parts_) {
    const DatasetSpec& spec = specs_[p.spec];
    char* out = staging_.data() + p.staged;
    if (spec.sixteen) engine.read_weights16(p.piece->piece, reinterpret_cast<uint16_t*>(out));
    else engine.read_state(engine_state(spec.kind), p.piece->piece, reinterpret_cast<float*>(out));
  }
  staged_ = st;
  result_ = SaveResult{};
  result_.io.stage_s = seconds_since(t0);
  pending_ = true;
  if (!async_) {
    write(st.step, st, faults);
    result_.stall_s = seconds_since(t0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_);
    job_ = true, done_ = false, faults_ = faults;
  }
  cv_.notify_all();
  result_.stall_s = seconds_since(t0);
}

bool CheckpointWriter::done_here() {
  if (!pending_) return true;
  if (!async_) return true;
  std::lock_guard<std::mutex> lock(m_);
  return done_;
}

SaveResult CheckpointWriter::wait() {
  Z3D_ASSERT(pending_, "wait() without a pending checkpoint save");
  const auto t0 = Clock::now();
  if (async_) {
    Watchdog::Phase phase(strprintf("a wait for the checkpoint writer (step %lld)", (long long)staged_.step),
                          timeout_s() + 30);
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return done_; });
  }
  pending_ = false;
  if (!keep_staging_) staging_ = HostBuffer();
  SaveResult r = result_;
  r.stall_s += seconds_since(t0);
  return r;
}

void CheckpointWriter::thread_main() {
  Watchdog::set_thread_slot(Watchdog::Slot::writer);
  for (;;) {
    SaveFaults faults;
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return (job_ && !done_) || stop_; });
      if (stop_) return;
      faults = faults_;
    }
    write(staged_.step, staged_, faults);
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true, job_ = false;
    }
    cv_.notify_all();
  }
}

// The second half of a save: checksums, the file, the writes, the vote, the commit. Runs on the
// writer thread (or in place); collective over group_ only.
void CheckpointWriter::write(int64_t step, const TrainingState& st, SaveFaults faults) {
  const auto t0 = Clock::now();
  ProcessGroup& g = *group_;
  const double limit = timeout_s();
  Watchdog::Phase phase(strprintf("checkpoint save of step %lld", (long long)step), limit);
  g.set_timeout(limit);
  SaveResult& r = result_;
  r.step = step;
  const std::string final_path = dir_ + "/" + strprintf("step_%08lld.h5", (long long)step);
  const std::string tmp = final_path + ".tmp";

  if (faults.pause_start)
    pause_for_fault_injection(strprintf("before its first write of the checkpoint of step %lld", (long long)step));
  phase.progress("checksums");
  const std::vector<uint64_t> sums = staged_checksums();

  phase.progress("creating the file");
  std::vector<uint64_t> offsets(specs_.size(), 0);
  std::string mine;
  if (g.rank() == 0)
    mine = create_skeleton(tmp, checkpoint_header(run_, st), specs_, sums,
                           run_.engine.dtype16() == Dtype16::fp16 ? "float16" : "bfloat16", offsets, error_log_);
  std::string error = agreed(g, mine);

  const auto tw = Clock::now();
  if (error.empty()) {
    g.all_reduce_sum(offsets.data(), offsets.size());  // rank 0's, on every rank
    phase.progress("writing its pieces");
    error = agreed(g, write_pieces(tmp, offsets, step, faults, phase));
  }
  const auto tc = Clock::now();
  r.io.transfer_s = std::chrono::duration<double>(tc - t0).count();
  phase.progress("committing");
  if (error.empty()) {
    error = agreed(g, g.rank() == 0 ? commit_checkpoint(dir_, tmp, final_path, cfg_.keep_last) : "");
  } else if (g.rank() == 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
  }
  r.io.file = final_path;
  r.io.bytes = file_bytes_;
  r.io.commit_s = g.all_reduce_max(seconds_since(tc));
  r.io.transfer_s = g.all_reduce_max(r.io.transfer_s);
  r.io.stage_s = g.all_reduce_max(r.io.stage_s);
  r.io.seconds = g.all_reduce_max(seconds_since(t0)) + r.io.stage_s;  // staging, then the write
  if (error.empty()) {
    bandwidth_ = static_cast<double>(file_bytes_) / std::max(1e-3, g.all_reduce_max(seconds_since(tw)));
  } else {
    const std::string latest = read_latest(dir_);
    r.error = strprintf("checkpoint of step %lld failed: %s; the partial file is removed and %s", (long long)step,
                        error.c_str(),
                        latest.empty() ? "there is no committed checkpoint yet" : ("'latest' still names " + latest).c_str());
  }
}

// Every dataset's checksum: this rank's staged pieces, summed over group_ (collective).
std::vector<uint64_t> CheckpointWriter::staged_checksums() {
  std::vector<uint64_t> sums(specs_.size(), 0);
  for (const StagedPiece& p : parts_) {
    const char* x = staging_.data() + p.staged;
    sums[p.spec] = p.elem == 2 ? checksum_piece(*p.piece, reinterpret_cast<const uint16_t*>(x))
                               : checksum_piece(*p.piece, reinterpret_cast<const float*>(x));
  }
  group_->all_reduce_sum(sums.data(), sums.size());
  return sums;
}

// This rank's pieces into the file rank 0 created, at `offsets` (each dataset's first byte), then
// fsynced and closed. Local: no collective. Returns "" or this rank's first failure.
std::string CheckpointWriter::write_pieces(const std::string& tmp, const std::vector<uint64_t>& offsets, int64_t step,
                                           SaveFaults faults, Watchdog::Phase& phase) {
  std::string mine;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  const int direct = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);  // -1 where unsupported (tmpfs)
  const std::string who = strprintf("rank %d (%s)", run_.groups.world->rank(), host_name().c_str());
  if (fd < 0) mine = strprintf("%s: opening '%s': %s", who.c_str(), tmp.c_str(), strerror(errno));
  for (size_t i = 0; i < parts_.size() && mine.empty(); ++i) {
    if (faults.pause_middle && i == parts_.size() / 2)
      pause_for_fault_injection(strprintf("halfway through its writes of the checkpoint of step %lld", (long long)step));
    if (faults.stall_halfway && i == parts_.size() / 2) {
      log_warn("fault injection: rank stalls in the middle of the checkpoint save of step %lld", (long long)step);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const StagedPiece& p = parts_[i];
    const char* src = staging_.data() + p.staged;
    for (const auto& [first, n] : p.runs) {
      if (!mine.empty()) break;
      if (const std::string e = write_run(fd, direct, src, n * p.elem, offsets[p.spec] + first * p.elem); !e.empty())
        mine = strprintf("%s: writing '%s': %s", who.c_str(), tmp.c_str(), e.c_str());
      src += n * p.elem;
    }
    phase.progress(strprintf("writing its pieces: dataset %zu of %zu", p.spec + 1, specs_.size()));
  }
  if (fd >= 0 && mine.empty() && ::fsync(fd) != 0)
    mine = strprintf("%s: fsync of '%s': %s", who.c_str(), tmp.c_str(), strerror(errno));
  if (direct >= 0 && mine.empty() && ::fsync(direct) != 0)
    mine = strprintf("%s: fsync of '%s': %s", who.c_str(), tmp.c_str(), strerror(errno));
  if (direct >= 0) ::close(direct);
  if (fd >= 0 && ::close(fd) != 0 && mine.empty())
    mine = strprintf("%s: closing '%s': %s", who.c_str(), tmp.c_str(), strerror(errno));
  return mine;
}

}  // namespace zero3d
