// ckpt/checkpoint.h: one parallel-HDF5 file per checkpoint, written and read collectively by every
// rank, that any layout can load.
//
// What the file holds: ckpt/format.h. How the ranks move it: ckpt/transfer.h. Which part of
// every dataset a rank moves: the engine's checkpoint pieces (zero/shard_view.h), precomputed
// from the layout; this file only iterates them.
//
// Invariant: a rank writes exactly its hyperslab of every dataset (its dp slice of each bucket of
// its tp share of its pp stage; tp replicas and the tied embedding's copy are written once), so
// the ranks of the grid together write every element exactly once; loading reads the hyperslabs
// the loading layout owns, whatever layout saved them, and verifies each dataset's checksum from
// what it read.
//
// Commit protocol: DIR/step_XXXXXXXX.h5.tmp is written, flushed and closed collectively; every rank
// votes that its part succeeded; rank 0 fsyncs it, renames it to step_XXXXXXXX.h5, fsyncs DIR, and
// replaces DIR/latest (one line, the file name) by write-temp + fsync + rename. Old checkpoints are
// pruned to keep_last only after that. A crash at any moment leaves the previous checkpoint and a
// `latest` that names it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "ckpt/dir.h"     // checkpoint_file, list_checkpoints
#include "ckpt/format.h"  // the format, shared with zero3d ckpt
#include "data/loader.h"  // DataOrder
#include "parallel/groups.h"
#include "zero/engine.h"
#include "zero/loss_scaler.h"

namespace zero3d {

// Everything besides the tensors that a resumed run continues from. The RNG is counter-based
// (core/rng.h): the seed is its whole state, and the data order is a function of (seed, sample).
struct TrainingState {
  int64_t step = 0;             // global steps taken (skipped fp16 steps included)
  int64_t optimizer_steps = 0;  // updates applied: Adam's t and the LR schedule's position
  uint64_t data_cursor = 0;     // global samples consumed
  std::string loss_scaler;      // LossScaler::save_state(): the scaler's own description
  std::string lr_scheduler;     // optim/lr_schedule.h schedule_state(): the schedule's position (JSON)
  std::optional<DataOrder> data_order;  // what the cursor counts in (none in checkpoints from before it)
};

// What one save or load moved and cost.
struct CheckpointIO {
  std::string file;
  uint64_t bytes = 0;      // tensor bytes (the file's datasets, whole)
  double seconds = 0;      // wall time of the whole save (to commit) or load (to verified)
  // Where the time went, on the slowest rank: copying from/to the engine and checksumming, the
  // HDF5 transfers (dataset creation and collective writes/reads), and (save) flush, close, fsync
  // and rename.
  double stage_s = 0, transfer_s = 0, commit_s = 0;
  int64_t independent = 0; // datasets read through HDF5, not by offset (a file another tool rewrote; else 0)
};

// The run whose state is saved or loaded.
struct CheckpointRun {
  const Config& config;
  ProcessGroups& groups;
  ZeroEngine& engine;
  std::string tokenizer = {};  // the "tokenizer" attribute: ckpt/tokenizer_record.h
};

// Saves: ckpt/writer.h. What a save writes, shared with it:
// the root attributes of a save of `st` by this run,
CheckpointHeader checkpoint_header(const CheckpointRun& run, const TrainingState& st);
// the engine state a dataset holds,
ZeroEngine::State engine_state(StateKind kind);
// and what this rank adds to a dataset's checksum, from its piece's values.
uint64_t checksum_piece(const CheckpointPiece& p, const float* x);
uint64_t checksum_piece(const CheckpointPiece& p, const uint16_t* x);

// Loads: ckpt/reader.h (load_checkpoint), which returns
struct LoadedCheckpoint {
  TrainingState state;
  CheckpointIO io;
  std::string saved_layout;  // "world 8 = tp 1 x pp 1 x dp 8, ZeRO-3, fp32"
  std::string tokenizer;     // its tokenizer record (ckpt/tokenizer_record.h), "" when unknown
};

}  // namespace zero3d
