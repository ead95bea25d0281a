#include "ckpt/checkpoint.h"

#include <cstdint>
#include <filesystem>

#include "ckpt/dir.h"
#include "ckpt/reader.h"
#include "ckpt/transfer.h"
#include "core/check.h"
#include "core/log.h"
#include "optim/lr_schedule.h"

namespace zero3d {

namespace fs = std::filesystem;

ZeroEngine::State engine_state(StateKind k) {
  return k == StateKind::exp_avg ? ZeroEngine::State::exp_avg
         : k == StateKind::exp_avg_sq ? ZeroEngine::State::exp_avg_sq
                                      : ZeroEngine::State::master;
}


template <typename T>
static uint64_t checksum_runs(const CheckpointPiece& p, const T* x) {
  uint64_t sum = 0;
  for (const LogicalRun& r : p.counted) sum += checksum_run(r.first, x + r.offset, r.n);
  return sum;
}
uint64_t checksum_piece(const CheckpointPiece& p, const float* x) { return checksum_runs(p, x); }
uint64_t checksum_piece(const CheckpointPiece& p, const uint16_t* x) { return checksum_runs(p, x); }

CheckpointHeader checkpoint_header(const CheckpointRun& run, const TrainingState& st) {
  const Config& c = run.config;
  const Topology& topo = run.groups.topo;
  CheckpointHeader h;
  h.format = kCheckpointFormat;
  h.format_version = kCheckpointFormatVersion;
  h.zero3d_version = ZERO3D_VERSION;
  h.step = st.step;
  h.optimizer_steps = st.optimizer_steps;
  h.data_cursor = st.data_cursor;
  h.seed = c.seed;
  h.world_size = topo.world, h.tp = topo.tp, h.pp = topo.pp, h.dp = topo.dp;
  h.zero_stage = run.engine.stage();
  h.precision = name_of(c.precision);
  h.n_layer = c.model.n_layer, h.n_head = c.model.n_head, h.d_model = c.model.d_model;
  h.vocab_size = c.model.vocab_size, h.seq_len = c.model.seq_len;
  h.architecture = architecture_of(c.model).dump();
  h.config = c.resolved.dump();
  h.loss_scaler = st.loss_scaler;  // each owner describes its own state
  h.lr_scheduler = schedule_state(c.scheduler, c.optimizer.lr, st.optimizer_steps);
  h.rng = strprintf("counter-based splitmix64 keyed by seed %llu: the seed is the whole state",
                    static_cast<unsigned long long>(c.seed));
  h.checksum_algorithm = kChecksumAlgorithm;
  return h;
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
      auto loaded = try_load(run, c, timeout_s, error);
      if (loaded) {
        if (!errors.empty() && root) log_warn("checkpoint: fell back to '%s'", c.c_str());
        return loaded;
      }
      std::error_code ec;
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
