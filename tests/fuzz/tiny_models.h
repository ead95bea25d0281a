// tests/fuzz/tiny_models.h: the two model families at a size a fuzzer can afford (a few KB of
// weights): what the HF and checkpoint harnesses compare a file against.
#pragma once
#include "config/config.h"

namespace zero3d::fuzz {

inline ModelConfig tiny_gpt2() {
  ModelConfig m;
  m.vocab_size = 20, m.seq_len = 8, m.n_layer = 1, m.n_head = 2, m.d_model = 8;
  return m;
}

inline ModelConfig tiny_llama() {
  ModelConfig m = tiny_gpt2();
  m.arch = "llama", m.norm = "rmsnorm", m.position = "rope", m.mlp = "swiglu";
  m.num_key_value_heads = 1, m.intermediate_size = 12, m.bias = false, m.tie_word_embeddings = false;
  m.rope_theta = 10000.0;
  return m;
}

}  // namespace zero3d::fuzz
