#include "ckpt/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ckpt/safetensors.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "core/posix_io.h"
#include "kernels/math/dtype.h"
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

std::vector<HfTensor> hf_tensors(const ModelConfig& m) {
  const bool gpt2 = gpt2_family(m);
  if (!gpt2 && !llama_family(m))
    throw UserError("this model mixes the GPT-2 and Llama families (" + describe_architecture(m) +
                    "): transformers has no class for it, so it cannot be exported with --format hf "
                    "(export --format safetensors writes zero3d's own names)");
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
      const char* hf = gpt2 ? "transformer.wte.weight" : n == "wte" ? "model.embed_tokens.weight" : "lm_head.weight";
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

nlohmann::ordered_json hf_config(const ModelConfig& m, const std::string& torch_dtype) {
  using J = nlohmann::ordered_json;
  if (gpt2_family(m))
    return J{{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab_size},
             {"n_positions", m.seq_len}, {"n_ctx", m.seq_len}, {"n_embd", m.d_model}, {"n_layer", m.n_layer},
             {"n_head", m.n_head}, {"n_inner", nullptr}, {"activation_function", "gelu_new"},
             {"layer_norm_epsilon", 1e-5}, {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0},
             {"scale_attn_weights", true}, {"tie_word_embeddings", true}, {"torch_dtype", torch_dtype}};
  hf_tensors(m);  // refuses a mix
  return J{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab_size},
           {"hidden_size", m.d_model}, {"intermediate_size", m.ffn_hidden()}, {"num_hidden_layers", m.n_layer},
           {"num_attention_heads", m.n_head}, {"num_key_value_heads", m.kv_heads()}, {"head_dim", m.head_dim()},
           {"max_position_embeddings", m.seq_len}, {"rms_norm_eps", m.rms_norm_eps}, {"rope_theta", m.rope_theta},
           {"hidden_act", "silu"}, {"attention_bias", m.bias}, {"mlp_bias", m.bias},
           {"tie_word_embeddings", m.tie_word_embeddings}, {"torch_dtype", torch_dtype}};
}

std::shared_ptr<InitialWeights> read_hf_weights(const std::string& dir, const ModelConfig& m) {
  // config.json must describe this run's model: every key hf_config writes (but torch_dtype).
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/model.safetensors";
  const nlohmann::json have = config_json::read_file(cfg_path, "checkpoint.init_from's config");
  const nlohmann::ordered_json expected = hf_config(m, "float32");
  for (const auto& [key, want] : expected.items()) {
    if (key == "torch_dtype" || key == "n_inner" || key == "resid_pdrop" || key == "embd_pdrop" || key == "attn_pdrop")
      continue;  // not part of the weights' meaning
    const nlohmann::json got = have.contains(key) ? have[key] : nlohmann::json();
    const bool same = got.is_number() && want.is_number() ? got.get<double>() == want.get<double>() : got == nlohmann::json(want);
    if (!same)
      throw UserError(strprintf("checkpoint.init_from: '%s' has %s = %s, but this run's model needs %s (set the "
                                "model keys to the checkpoint's)",
                                cfg_path.c_str(), key.c_str(), config_json::show(got).c_str(), want.dump().c_str()));
  }
  const std::string file = read_text_file(st_path, "checkpoint.init_from's weights"), where = "checkpoint.init_from: '" + st_path + "'";
  const Safetensors st = parse_safetensors(file, where);
  const nlohmann::json& header = st.header;
  const char* data = st.data;
  const size_t data_bytes = st.data_bytes;
  auto w = std::make_shared<InitialWeights>();
  for (const ParamInfo& p : gpt_param_table(m))
    if (!p.tied_copy) w->tensors[p.name].assign(p.size, 0.0f);
  for (const HfTensor& t : hf_tensors(m)) {
    const StEntry e = st_entry(header, t.name, where, data_bytes);
    const size_t count = static_cast<size_t>(t.rows * t.cols), es = e.elem;
    if (es == 0 || e.shape != t.shape())
      throw UserError(strprintf("%s: tensor '%s' is %s %s; this model needs F32, BF16 or F16 of shape %s", where.c_str(),
                                t.name.c_str(), e.dtype.c_str(), nlohmann::json(e.shape).dump().c_str(),
                                nlohmann::json(t.shape()).dump().c_str()));
    if (e.end - e.begin != count * es)
      throw UserError(strprintf("%s: tensor '%s' (%s %s) spans %llu bytes, where its shape needs %zu: the header is "
                                "corrupt",
                                where.c_str(), t.name.c_str(), e.dtype.c_str(), nlohmann::json(e.shape).dump().c_str(),
                                (unsigned long long)(e.end - e.begin), count * es));
    auto value = [&](size_t i) {
      const char* q = data + e.begin + i * es;
      if (es == 4) {
        float f;
        std::memcpy(&f, q, 4);
        return f;
      }
      uint16_t u;
      std::memcpy(&u, q, 2);
      return e.dtype == "BF16" ? math::float_from_bf16(u) : math::float_from_fp16(u);
    };
    float* dst = w->tensors.at(t.source).data() + static_cast<size_t>(t.row0 * t.cols);
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c) {
        const size_t i = t.transpose ? static_cast<size_t>(c * t.rows + r) : static_cast<size_t>(r * t.cols + c);
        const float v = value(i);
        if (!std::isfinite(v))  // a weight that is NaN or infinite trains nothing: say so now, not as a divergence
          throw UserError(strprintf("%s: tensor '%s' holds %g at element %zu: initial weights must be finite",
                                    where.c_str(), t.name.c_str(), v, i));
        dst[r * t.cols + c] = v;
      }
  }
  return w;
}

}  // namespace zero3d
