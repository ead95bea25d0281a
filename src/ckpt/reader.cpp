#include "ckpt/reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <utility>

#include "ckpt/tokenizer_record.h"
#include "ckpt/transfer.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/posix_io.h"
#include "data/loader.h"
#include "parallel/watchdog.h"
#include "storage/hdf5_posix.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kNoOffset = ~uint64_t{0};

// This rank's piece of each logical tensor, indexed by logical id (null: none on this rank).
std::vector<const CheckpointPiece*> by_tensor(const std::vector<CheckpointPiece>& pieces, size_t n_tensors) {
  std::vector<const CheckpointPiece*> out(n_tensors, nullptr);
  for (const CheckpointPiece& p : pieces) {
    Z3D_ASSERT(!out[p.tensor], "two checkpoint pieces of one tensor on one rank");
    out[p.tensor] = &p;
  }
  return out;
}

// The header's state besides the tensors; each owner's part checked by its owner.
TrainingState state_of(const CheckpointHeader& h, const std::string& path) {
  TrainingState st;
  st.step = h.step;
  st.optimizer_steps = h.optimizer_steps;
  st.data_cursor = h.data_cursor;
  st.loss_scaler = h.loss_scaler;
  st.lr_scheduler = h.lr_scheduler;
  try {
    LossScaler::check_state(h.loss_scaler);
  } catch (const UserError& e) {
    throw UserError(strprintf("checkpoint '%s': attribute 'loss_scaler' is not valid (%s)", path.c_str(), e.what()));
  }
  try {
    if (!h.data.empty()) st.data_order = DataOrder::from_json(h.data);
  } catch (const UserError& e) {
    throw UserError(strprintf("checkpoint '%s': attribute 'data' is not valid (%s)", path.c_str(), e.what()));
  }
  return st;
}

std::string show_dims(const std::vector<hsize_t>& d) {
  std::string s;
  for (hsize_t x : d) s += (s.empty() ? "" : " x ") + std::to_string(x);
  return s;
}

}  // namespace

CheckpointReader::CheckpointReader(const CheckpointRun& run, std::string path, double timeout_s)
    : run_(run), path_(std::move(path)), timeout_s_(timeout_s) {}

LoadedCheckpoint CheckpointReader::load() {
  const auto t0 = Clock::now();
  // A rank stuck in a load (a hung file system, or waiting for the others) is the watchdog's to report.
  std::error_code size_ec;
  const double bytes = static_cast<double>(fs::file_size(path_, size_ec));
  Watchdog::Phase phase("checkpoint load of " + path_,
                        timeout_s_ > 0 ? timeout_s_ : std::max(comm_context().timeout_s, 3.0 * bytes / 100e6));
  QuietHdf5 quiet;
  std::error_code ec;
  if (!fs::is_regular_file(path_, ec))
    throw UserError(strprintf("checkpoint '%s' %s", path_.c_str(),
                              fs::exists(path_, ec) ? "is not a file (a directory?)" : "does not exist"));
  open();
  read();
  verify();
  ProcessGroup& world = *run_.groups.world;
  out_.io.file = path_;
  out_.io.stage_s = world.all_reduce_max(out_.io.stage_s);
  out_.io.transfer_s = world.all_reduce_max(out_.io.transfer_s);
  out_.io.independent = static_cast<int64_t>(world.all_reduce_sum(static_cast<double>(out_.io.independent)));
  out_.io.seconds = world.all_reduce_max(seconds_since(t0));
  return out_;
}

// Every rank reads the metadata itself, through zero3d's POSIX driver: a failed read is named by
// its errno, after retries, and is never taken for a corrupt file. The ranks agree on the metadata
// before any reads its data.
void CheckpointReader::open() {
  run_.groups.world->agree([&] {
    clear_io_error();
    try {
      read_metadata();
    } catch (const UserError&) {
      std::error_code gone;
      if (!fs::exists(path_, gone))  // pruned by a run writing there: load_checkpoint reads `latest` again
        throw UserError(strprintf("checkpoint '%s' was removed while it was read", path_.c_str()));
      if (io_error().empty()) throw;
      io_failed_ = true;  // what looked like a bad file was a failed read
      throw UserError(strprintf("checkpoint '%s' could not be read: %s", path_.c_str(), io_error().c_str()));
    }
  });
}

void CheckpointReader::read_metadata() {
  file_ = Hid(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, posix_file_access().get()));
  if (!file_.valid())
    throw UserError(strprintf("checkpoint '%s' is not a readable HDF5 file (truncated or corrupt?)", path_.c_str()));
  const hid_t f = file_.get();
  const CheckpointHeader h = read_header(f, path_);
  check_saved_model(h, run_.config.model, path_);
  check_same_tokenizer(run_.tokenizer, h.tokenizer, path_);
  out_.state = state_of(h, path_);
  out_.saved_layout = h.layout();
  out_.tokenizer = h.tokenizer;
  specs_ = optimizer_datasets(run_.config.model, h.mixed());
  stored_.assign(specs_.size(), 0);
  offsets_.assign(specs_.size(), kNoOffset);
  datasets_.clear();
  for (size_t k = 0; k < specs_.size(); ++k) {
    const DatasetSpec& spec = specs_[k];
    Hid ds = open_checkpoint_dataset(f, path_, spec.path);
    Hid space(H5Dget_space(ds.get()));
    Hid type(H5Dget_type(ds.get()));
    const int nd = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(std::max(nd, 0));
    if (nd > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (dims != spec.dims || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4)
      throw UserError(strprintf("checkpoint '%s': dataset '%s' is %s%s, this model expects float32 %s", path_.c_str(),
                                spec.path.c_str(), H5Tget_class(type.get()) == H5T_FLOAT ? "" : "not float, ",
                                show_dims(dims).c_str(), show_dims(spec.dims).c_str()));
    if (!read_attr(ds.get(), "checksum", stored_[k]))
      throw UserError(strprintf("checkpoint '%s': dataset '%s' has no checksum attribute", path_.c_str(),
                                spec.path.c_str()));
    // Contiguous little-endian float32 (every file zero3d writes): read by offset, not by HDF5.
    // Every rank reads the same metadata, so every rank takes the same path for each dataset.
    const haddr_t at = H5Dget_offset(ds.get());
    offsets_[k] = at != HADDR_UNDEF && H5Tequal(type.get(), H5T_IEEE_F32LE) > 0 ? at : kNoOffset;
    datasets_.push_back(std::move(ds));
  }
}

// Every rank reads its pieces itself, in the same dataset order; a failure is recorded and the
// rank goes on, so the ranks agree on it at the end. The data comes through the descriptor HDF5
// opened: a file pruned (unlinked) from here on is still read whole.
void CheckpointReader::read() {
  void* handle = nullptr;
  H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle);
  const int fd = handle ? *static_cast<int*>(handle) : -1;
  struct stat st {};
  const uint64_t file_size = fd >= 0 && ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;

  ZeroEngine& engine = run_.engine;
  const std::vector<const CheckpointPiece*> piece_of = by_tensor(engine.load_pieces(), specs_.size());
  sums_.assign(specs_.size(), 0);
  std::string error;
  std::vector<float> buf;
  for (size_t k = 0; k < specs_.size(); ++k) {
    const DatasetSpec& spec = specs_[k];
    const CheckpointPiece* p = piece_of[spec.tensor];
    buf.resize(p ? p->piece.size : 0);
    const auto tr = Clock::now();
    std::string failed;      // the file's fault
    std::string io_failure;  // the storage's
    if (!p) {
    } else if (offsets_[k] != kNoOffset) {  // this rank's runs, straight from the file
      char* dst = reinterpret_cast<char*>(buf.data());
      for (const auto& [first, n] : element_runs(*p, spec.dims)) {
        const uint64_t at = offsets_[k] + first * sizeof(float);
        if (fd < 0) failed = "no file descriptor for it";
        else if (at + n * sizeof(float) > file_size) failed = "the file ends early (truncated)";
        else if (std::string e = pread_fully(fd, dst, n * sizeof(float), at); !e.empty())
          (e.find("truncated") != std::string::npos ? failed : io_failure) = e;
        if (!failed.empty() || !io_failure.empty()) break;
        dst += n * sizeof(float);
      }
    } else if (read_blocks(datasets_[k].get(), p->blocks, buf.data(), buf.size()) < 0) {  // another layout: HDF5
      if (!io_error().empty()) io_failure = io_error();
      else failed = "HDF5 could not read it";
      ++out_.io.independent;
    }
    const auto ts = Clock::now();
    out_.io.transfer_s += std::chrono::duration<double>(ts - tr).count();
    if (!io_failure.empty()) {
      if (error.empty() || !io_failed_)
        error = strprintf("checkpoint '%s': reading dataset '%s' failed: %s", path_.c_str(), spec.path.c_str(),
                          io_failure.c_str());
      io_failed_ = true;
      continue;
    }
    if (!failed.empty()) {
      if (error.empty())
        error = strprintf("checkpoint '%s': reading dataset '%s' failed (%s): corrupt or truncated file",
                          path_.c_str(), spec.path.c_str(), failed.c_str());
      continue;
    }
    if (!p) continue;
    sums_[k] = checksum_piece(*p, buf.data());
    engine.write_state(engine_state(spec.kind), p->piece, buf.data());
    out_.io.stage_s += seconds_since(ts);
  }
  for (const DatasetSpec& spec : specs_) {
    size_t elems = 1;
    for (hsize_t d : spec.dims) elems *= d;
    out_.io.bytes += elems * 4;
  }
  run_.groups.world->agree([&] {  // the lowest failing rank's message on every rank
    if (!error.empty()) throw UserError(error);
  });
}

void CheckpointReader::verify() {
  run_.groups.world->all_reduce_sum(sums_.data(), sums_.size());
  for (size_t k = 0; k < specs_.size(); ++k)
    if (sums_[k] != stored_[k])
      throw UserError(strprintf("checkpoint '%s': dataset '%s' fails its checksum (stored %016llx, data gives "
                                "%016llx): the file is corrupt",
                                path_.c_str(), specs_[k].path.c_str(), (unsigned long long)stored_[k],
                                (unsigned long long)sums_[k]));
  run_.engine.finish_load(out_.state.optimizer_steps);
}

namespace {

// CheckpointReader::load on every rank; a UserError on any rank becomes the same UserError on every rank.
// An I/O error on any rank is not a verdict on the file: it ends the load with kExitReadFailed,
// without falling back to an older checkpoint (the newer one may be good once the storage is).
std::optional<LoadedCheckpoint> try_load(const CheckpointRun& run, const std::string& path, double timeout_s,
                                         std::string& error) {
  std::optional<LoadedCheckpoint> out;
  error.clear();
  bool io_failed = false;
  try {
    CheckpointReader reader(run, path, timeout_s);
    run.groups.world->agree([&] {
      try {
        out = reader.load();
      } catch (...) {
        io_failed = reader.io_failed();
        throw;
      }
    });
  } catch (const UserError& e) {  // the lowest failing rank's message, on every rank
    error = e.what();
  }
  if (run.groups.world->all_reduce_max(static_cast<int64_t>(io_failed)) != 0)
    throw RunError(error + "; the storage failed (after retries), the file is not known to be bad, and no older "
                           "checkpoint was tried: run again with the same checkpoint.load when the storage reads",
                   kExitReadFailed);
  return out;
}

}  // namespace

std::optional<LoadedCheckpoint> load_checkpoint(const CheckpointRun& run, LoadMode mode, const std::string& path,
                                                const std::string& dir, double timeout_s) {
  if (mode == LoadMode::none) return std::nullopt;
  std::string error;
  if (mode == LoadMode::path) {
    auto loaded = try_load(run, checkpoint_file(path), timeout_s, error);
    if (!loaded) throw UserError(error);
    return loaded;
  }
  // auto: latest first, then the committed checkpoints older than it, newest first. A candidate
  // that is gone when its load fails was pruned by the run writing there meanwhile: the list is
  // made again from `latest` (a few times), and the pruned file is not called bad.
  ProcessGroup& world = *run.groups.world;
  const bool root = world.rank() == 0;
  constexpr int kPrunedTries = 10;
  std::string errors;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::string> candidates;
    int64_t newest = INT64_MAX;
    if (const std::string name = read_latest(dir); step_of(name) >= 0 && name.find('/') == std::string::npos) {
      candidates.push_back(dir + "/" + name);
      newest = step_of(name);
    } else if (!name.empty() && root && attempt == 0) {
      log_warn("checkpoint: '%s/latest' holds '%s', not a checkpoint's name: trying the checkpoints there, newest first",
               dir.c_str(), printable(name).c_str());
    }
    for (const std::string& c : list_checkpoints(dir))
      if (step_of(c) < newest) candidates.push_back(c);
    if (candidates.empty()) return std::nullopt;
    bool pruned = false;
    for (const std::string& c : candidates) {
      std::error_code ec;
      if (world.all_reduce_max(static_cast<int64_t>(fs::exists(c, ec))) == 0) {
        // Not there before it was read: pruned after `latest` was read (latest has moved on: read
        // it again), or a `latest` that names a file nobody wrote (a stale or hand-edited one).
        if (c == candidates.front() && newest != INT64_MAX && read_latest(dir) != fs::path(c).filename().string() &&
            attempt < kPrunedTries) {
          pruned = true;
          break;
        }
        if (root) log_warn("checkpoint: '%s' is not there%s; trying an older one", c.c_str(),
                           c == candidates.front() && newest != INT64_MAX ? " (its name is in 'latest')" : "");
        errors += "\n  " + c + " is not there";
        continue;
      }
      auto loaded = try_load(run, c, timeout_s, error);
      if (loaded) {
        if (!errors.empty() && root) log_warn("checkpoint: fell back to '%s'", c.c_str());
        return loaded;
      }
      pruned = world.all_reduce_max(static_cast<int64_t>(!fs::exists(c, ec))) != 0;
      if (pruned && attempt < kPrunedTries) {
        if (root) log_warn("checkpoint: '%s' was removed while it was read (another run prunes '%s'); reading 'latest' again",
                           c.c_str(), dir.c_str());
        break;
      }
      if (root) log_warn("checkpoint: %s; trying an older one", error.c_str());
      errors += "\n  " + error;
    }
    if (!pruned || attempt >= kPrunedTries) break;
  }
  throw UserError(strprintf("checkpoint.load = auto: no checkpoint in '%s' loads:%s", dir.c_str(), errors.c_str()));
}

}  // namespace zero3d
