// ckpt/hf.h: zero3d's tensors under Hugging Face transformers' names and layouts, for `zero3d ckpt
// export --format hf`: GPT2LMHeadModel for the GPT-2 family (its Conv1D weights are stored
// (in, out): transposed), LlamaForCausalLM for the Llama family (the packed [q | k | v] and
// [gate | up] weights split into q_proj, k_proj, v_proj and gate_proj, up_proj). RoPE needs no
// permutation: zero3d turns the same "rotate half" pairs as transformers' Llama.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/init_weights.h"

namespace zero3d {

// One tensor of the exported model: rows [row0, row0 + rows) of zero3d's tensor `source` (of
// `cols` columns; 1 for a vector), transposed when `transpose`.
struct HfTensor {
  std::string name, source;
  int64_t row0 = 0, rows = 0, cols = 1;
  bool transpose = false;
  bool vector = false;  // a 1-D tensor
  std::vector<int64_t> shape() const;
};

// The exported tensors in file order; a UserError when transformers has no class for this mix of
// the architecture keys (e.g. GPT-2 with rotary positions).
std::vector<HfTensor> hf_tensors(const ModelConfig& m);
// config.json for those tensors (torch_dtype: "float32", "bfloat16" or "float16").
nlohmann::ordered_json hf_config(const ModelConfig& m, const std::string& torch_dtype);

// The weights of a Hugging Face directory (config.json and model.safetensors, F32, BF16 or F16)
// under zero3d's names and layouts, for checkpoint.init_from: the inverse of hf_tensors(m). A
// UserError naming the file and what differs when config.json does not describe model m, or a
// tensor is missing or of another shape.
std::shared_ptr<InitialWeights> read_hf_weights(const std::string& dir, const ModelConfig& m);

}  // namespace zero3d
