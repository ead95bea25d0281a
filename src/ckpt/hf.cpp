#include "ckpt/hf.h"

#include "core/check.h"
#include "model/gpt.h"

namespace zero3d {

namespace {

bool gpt2_family(const ModelConfig& m) {
  return !m.rmsnorm() && !m.rope() && !m.swiglu() && m.bias && m.tie_word_embeddings && m.kv_heads() == m.n_head;
}
bool llama_family(const ModelConfig& m) { return m.rmsnorm() && m.rope() && m.swiglu(); }

}  // namespace

std::vector<int64_t> HfTensor::shape() const {
  if (vector) return {rows};
  return transpose ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
}

std::vector<HfTensor> hf_tensor_table(const ModelConfig& m, bool gpt2) {
  const int64_t hd = m.head_dim(), Q = int64_t{m.n_head} * hd, KV = int64_t{m.kv_heads()} * hd, F = m.ffn_hidden();
  std::vector<HfTensor> out;
  for (const ParamInfo& p : gpt_param_table(m)) {
    const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
    const bool vec = p.shape.size() == 1;
    auto whole = [&](std::string name, bool transpose = false) {
      out.push_back({std::move(name), p.name, 0, rows, cols, transpose, vec});
    };
    auto part = [&](std::string name, int64_t r0, int64_t n) { out.push_back({std::move(name), p.name, r0, n, cols, false, vec}); };
    const std::string& n = p.name;
    if (n == "wte" || n == "lm_head.weight") {  // the tokenizer's rows: padding stays behind
      const char* hf = n == "lm_head.weight" ? "lm_head.weight" : gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
      part(hf, 0, m.vocab_size);
      continue;
    }
    if (gpt2) {  // transformer.<name>; the Conv1D matrices transposed; lm_head is wte (tied)
      whole("transformer." + (n == "wpe" ? "wpe.weight" : n), p.shape.size() == 2 && n.starts_with("h."));
      continue;
    }
    if (n == "ln_f.weight") { whole("model.norm.weight"); continue; }
    const size_t dot = n.find('.', 2);
    const std::string layer = "model.layers." + n.substr(2, dot - 2) + ".", rest = n.substr(dot + 1);
    const std::string suffix = rest.ends_with(".bias") ? "bias" : "weight";
    if (rest == "ln_1.weight") whole(layer + "input_layernorm.weight");
    else if (rest == "ln_2.weight") whole(layer + "post_attention_layernorm.weight");
    else if (rest.starts_with("attn.c_attn.")) {
      part(layer + "self_attn.q_proj." + suffix, 0, Q);
      part(layer + "self_attn.k_proj." + suffix, Q, KV);
      part(layer + "self_attn.v_proj." + suffix, Q + KV, KV);
    } else if (rest.starts_with("attn.c_proj.")) whole(layer + "self_attn.o_proj." + suffix);
    else if (rest.starts_with("mlp.c_fc.")) {
      part(layer + "mlp.gate_proj." + suffix, 0, F);
      part(layer + "mlp.up_proj." + suffix, F, F);
    } else if (rest.starts_with("mlp.c_proj.")) whole(layer + "mlp.down_proj." + suffix);
    else Z3D_ASSERT(false, "no Hugging Face name for tensor " + n);
  }
  return out;
}

std::vector<HfTensor> hf_tensors(const ModelConfig& m) {
  const bool gpt2 = gpt2_family(m);
  if (!gpt2 && !llama_family(m))
    throw UserError("this model mixes the GPT-2 and Llama families (" + describe_architecture(m) +
                    "): transformers has no class for it, so it cannot be exported with --format hf "
                    "(export --format safetensors writes zero3d's own names)");
  return hf_tensor_table(m, gpt2);
}

nlohmann::ordered_json hf_config(const ModelConfig& m, const std::string& torch_dtype) {
  using J = nlohmann::ordered_json;
  if (gpt2_family(m))
    return J{{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab_size},
             {"n_positions", m.seq_len}, {"n_ctx", m.seq_len}, {"n_embd", m.d_model}, {"n_layer", m.n_layer},
             {"n_head", m.n_head}, {"n_inner", nullptr}, {"activation_function", "gelu_new"},
             {"layer_norm_epsilon", 1e-5}, {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0},
             {"scale_attn_weights", true}, {"tie_word_embeddings", true}, {"torch_dtype", torch_dtype}};
  hf_tensors(m);  // refuses a mix
  J c{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab_size},
      {"hidden_size", m.d_model}, {"intermediate_size", m.ffn_hidden()}, {"num_hidden_layers", m.n_layer},
      {"num_attention_heads", m.n_head}, {"num_key_value_heads", m.kv_heads()}, {"head_dim", m.head_dim()},
      {"max_position_embeddings", m.seq_len}, {"rms_norm_eps", m.rms_norm_eps}, {"rope_theta", m.rope_theta},
      {"hidden_act", "silu"}, {"attention_bias", m.bias}, {"mlp_bias", m.bias},
      {"tie_word_embeddings", m.tie_word_embeddings}, {"torch_dtype", torch_dtype}};
  const RopeScaling& rs = m.rope_scaling;
  if (rs.rope_type == "llama3")
    c["rope_scaling"] = J{{"rope_type", "llama3"}, {"factor", rs.factor}, {"low_freq_factor", rs.low_freq_factor},
                          {"high_freq_factor", rs.high_freq_factor},
                          {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  return c;
}

}  // namespace zero3d
