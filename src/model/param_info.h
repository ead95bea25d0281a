// model/param_info.h: one parameter tensor as the flat buffers hold it (ParamInfo): its name,
// this rank's and the whole tensor's shape, where it sits and how tensor parallelism splits it.
// gpt_param_table (model/gpt.h) makes the table; the flat layout (model/flat_layout.h), ZeRO and
// checkpoints read it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero3d {

// How a tensor is split across the tensor-parallel ranks (Megatron): `rows` splits dim 0
// (column-parallel weights and their biases, the vocab-parallel embedding), `blocks` splits each
// of the row blocks of a packed weight ([q | k | v] of the attention, so a rank holds whole query
// and key/value heads; [gate | up] of SwiGLU), `cols` splits dim 1 (row-parallel weights); `none`
// is replicated.
enum class TpSplit { none, rows, blocks, cols };

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;  // this rank's shape
  size_t offset = 0;  // into the flat parameter (and gradient) buffer, in elements
  size_t size = 0;
  bool decay = true;  // weight decay applies (matrices and embeddings, not biases or LayerNorm)
  int unit = 0;       // 0 embeddings, 1 + l block l, n_layer + 1 final LayerNorm
  TpSplit split = TpSplit::none;
  std::vector<int64_t> logical_shape;  // the whole tensor's shape
  int tp = 1, tp_rank = 0;
  int id = 0;               // index in the whole model's table (the RNG stream of its initial values)
  bool tied_copy = false;   // the last pipeline stage's copy of wte (its gradient is summed with the first's)
  bool own_bucket = false;  // kept in a bucket of its own (wte with pp > 1, so both copies shard alike)
  std::vector<int64_t> blocks;  // TpSplit::blocks: the logical rows of each block
  // Read only as a GEMM's weight (the blocks' matrices, the LM head's own weight or copy): where the
  // GEMMs run in bf16 on bf16 weights they read its bf16 copy, and it is never widened to fp32.
  bool gemm_only = false;
};

}  // namespace zero3d
