// model/param_table.h: the model's tensors as data, apart from the model that computes with them:
// each tensor's name, shape and tensor-parallel split (gpt_param_table), how a rank's elements map
// to the whole tensor, the pipeline stages, the initialisation and the FLOP count. The checkpoint
// format, the Hugging Face export and the planner read these without linking the model itself
// (model/gpt.h), as the fuzz harnesses in tests/fuzz do.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/param_info.h"

namespace zero3d {

// A transformer block's tensors in table order; a model without biases (or with RMSNorm) leaves
// some out. The model finds each role's tensor by it.
enum LayerParam { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kNumLayerParams };

struct BlockTensor {
  LayerParam role;
  const char* name;
  std::vector<int64_t> shape;
  bool decay;
  TpSplit split;
  std::vector<int64_t> blocks;  // TpSplit::blocks: logical rows of each block
};

// The tensors of one transformer block of model m, in table order.
std::vector<BlockTensor> block_tensors(const ModelConfig& m);

// Which layers a pipeline stage runs: contiguous ranges, the first n_layer % pp stages one layer
// more than the others. The first stage owns the embeddings, the last the final LayerNorm and the
// LM head (with pp > 1 a copy of the tied token embedding).
struct PipelineStage {
  int rank = 0, size = 1, first_layer = 0, num_layers = 0;
  bool first() const { return rank == 0; }
  bool last() const { return rank == size - 1; }
};
PipelineStage pipeline_stage(const ModelConfig& m, int pp, int pp_rank);

// This rank's tensors in flat order, packed without padding (model/flat_layout.h adds padding):
// its tensor-parallel share of its pipeline stage's tensors.
std::vector<ParamInfo> gpt_param_table(const ModelConfig& m, int tp = 1, int tp_rank = 0, int pp = 1, int pp_rank = 0);

// Index in the logical (whole, row-major) tensor of this rank's element `local`.
size_t logical_index(const ParamInfo& p, size_t local);
// How many local elements from `local` on map to consecutive logical indices (the run ends at a
// local row for `cols`, at a block for `blocks`, at the tensor's end otherwise). Logical
// indices increase with local ones, so a rank's piece is a sorted list of logical runs.
size_t logical_run(const ParamInfo& p, size_t local);
// Local elements [begin, begin + size) of p as rectangles of the logical tensor (a 1-D tensor is a
// column): at most three rectangles per block. Listed in local order, which is also logical
// row-major order, so a contiguous buffer of the piece matches the union of the rectangles as
// HDF5 transfers it (ckpt/checkpoint.cpp's hyperslabs).
struct LogicalRect {
  size_t r0, c0, rows, cols;
};
std::vector<LogicalRect> logical_rects(const ParamInfo& p, size_t begin, size_t size);

// GPT-2 initialisation of elements [begin, end) of tensor `index` of the table, from the
// counter-based RNG keyed by the logical element, so any rank (any tp rank, any ZeRO slice)
// initialises exactly what it owns and every layout starts from the same model: N(0, 0.02) for weights
// and embeddings, residual projections scaled by 1/sqrt(2 n_layer), zero biases, LayerNorm weight 1.
void gpt_init_tensor(const std::vector<ParamInfo>& table, size_t index, int n_layer, uint64_t seed, size_t begin,
                     size_t end, float* out);

// The architecture in words, for the dry run: "llama: 12 layers, d_model 768, 12 heads (4
// key/value heads) of 64, RMSNorm, RoPE (theta 500000), SwiGLU 2048, no biases, untied LM head".
std::string describe_architecture(const ModelConfig& m);

// RoPE's (cos, sin) table for positions [0, T) of m's heads (math::rope_table): rope_theta and
// rope_scaling, the same numbers for training and for the decoder.
std::vector<float> gpt_rope_table(const ModelConfig& m, int T);

// Model FLOPs per token of one training step (forward + backward): 6 per parameter that takes part
// in a matrix multiply (everything but the position embedding; the tied token embedding counts
// once, as the LM head), plus causal attention: 6 * n_layer * d_model * (seq_len + 1).
double gpt_flops_per_token(const ModelConfig& m);

}  // namespace zero3d
