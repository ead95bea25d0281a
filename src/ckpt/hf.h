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
// hf_tensors' table without the family check: GPT2LMHeadModel's names (`gpt2`; an untied head as
// lm_head.weight) or LlamaForCausalLM's.
std::vector<HfTensor> hf_tensor_table(const ModelConfig& m, bool gpt2);
// config.json for those tensors (torch_dtype: "float32", "bfloat16" or "float16").
nlohmann::ordered_json hf_config(const ModelConfig& m, const std::string& torch_dtype);

// The weights of a Hugging Face directory under zero3d's names and layouts, for
// checkpoint.init_from (ckpt/hf_import.cpp): the directory as the hub ships a GPT2LMHeadModel or a
// LlamaForCausalLM, or as `ckpt export --format hf` writes it. config.json's keys, at transformers'
// defaults where absent, must describe model m; the weights are model.safetensors or the shards of
// model.safetensors.index.json (F32, BF16 or F16). A UserError names the file and what differs: the
// config key and both values, the tensor and both shapes, a tensor missing or unknown, a shard that
// is not there, PyTorch's pickles (pytorch_model.bin).
std::shared_ptr<InitialWeights> read_hf_weights(const std::string& dir, const ModelConfig& m);

}  // namespace zero3d
