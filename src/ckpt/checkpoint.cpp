#include "ckpt/checkpoint.h"

#include <cstdint>

#include "config/json_tree.h"
#include "core/check.h"

namespace zero3d {

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
  h.config = config_json::to_text(c.resolved);
  h.loss_scaler = st.loss_scaler;  // each owner describes its own state
  h.lr_scheduler = st.lr_scheduler;
  h.data = st.data_order ? st.data_order->to_json() : "";
  h.rng = strprintf("counter-based splitmix64 keyed by seed %llu: the seed is the whole state",
                    static_cast<unsigned long long>(c.seed));
  h.checksum_algorithm = kChecksumAlgorithm;
  h.tokenizer = run.tokenizer;
  return h;
}

}  // namespace zero3d
