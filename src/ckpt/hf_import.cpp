// checkpoint.init_from: a Hugging Face directory as the hub ships it (or as `ckpt export --format hf`
// writes it), read into zero3d's names and layouts (ckpt/hf.h, read_hf_weights).
//   config.json: each key transformers reads, at its class's default where the file has none
//     (GPT2Config, LlamaConfig), must describe this run's model; n_positions /
//     max_position_embeddings may exceed model.seq_len (GPT-2's wpe: its first seq_len rows).
//   weights: model.safetensors, or the shards model.safetensors.index.json's weight_map names;
//     names with or without the `transformer.` / `model.` prefix; the buffers that hold no weights
//     (GPT-2's attn.bias and attn.masked_bias, rotary_emb.inv_freq) skipped; a tied model's
//     lm_head.weight accepted when it equals the token embedding. Anything else is named.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <regex>

#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "config/json_tree.h"
#include "core/check.h"
#include "core/posix_io.h"
#include "kernels/math/dtype.h"
#include "model/gpt.h"

namespace zero3d {

namespace {

using json = nlohmann::json;

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string shape_text(const std::vector<int64_t>& s) { return json(s).dump(); }

// A config.json value against the one a run's key needs: numbers by value (10000 is 10000.0),
// anything else exactly (the string "10000" is not the number).
bool same_value(const json& got, const json& want) {
  if (got.is_number() && want.is_number()) return got.get<double>() == want.get<double>();
  return got == want;
}

// config.json against the run's model, key by key: the file's value, or transformers' default
// where the file has none (or null), must be the one this run's model has.
class HubConfig {
 public:
  HubConfig(json cfg, std::string path) : cfg_(std::move(cfg)), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  bool has(const std::string& key) const { return cfg_.contains(key) && !cfg_[key].is_null(); }
  json value(const std::string& key, const json& def) const { return has(key) ? cfg_[key] : def; }
  const json& raw() const { return cfg_; }

  // `key` must equal this run's config key `run_key` (its value `want`).
  void same(const std::string& key, const json& def, const char* run_key, const json& want) const {
    const json got = value(key, def);
    if (!same_value(got, want))
      throw UserError(strprintf("checkpoint.init_from: '%s' has %s = %s%s, but this run's %s is %s: set %s=%s to "
                                "load it",
                                path_.c_str(), key.c_str(), config_json::show(got).c_str(), from_default(key).c_str(),
                                run_key, want.dump().c_str(), run_key, config_json::show(got).c_str()));
  }
  // `key` must be one of `allowed`: what zero3d computes (`why`).
  void fixed(const std::string& key, const json& def, const std::vector<json>& allowed, const char* why) const {
    const json got = value(key, def);
    for (const json& a : allowed)
      if (same_value(got, a)) return;
    throw UserError(strprintf("checkpoint.init_from: '%s' has %s = %s%s, which zero3d does not compute: %s",
                              path_.c_str(), key.c_str(), config_json::show(got).c_str(), from_default(key).c_str(),
                              why));
  }
  // The model's context (`key`) must hold this run's model.seq_len.
  int64_t context(const std::string& key, int64_t def, int seq_len) const {
    const json got = value(key, def);
    if (!got.is_number_integer() || got.get<int64_t>() < seq_len)
      throw UserError(strprintf("checkpoint.init_from: '%s' has %s = %s%s, fewer positions than this run's "
                                "model.seq_len %d: set model.seq_len to at most that",
                                path_.c_str(), key.c_str(), config_json::show(got).c_str(), from_default(key).c_str(),
                                seq_len));
    return got.get<int64_t>();
  }

 private:
  std::string from_default(const std::string& key) const {
    return has(key) ? "" : " (transformers' default: the file does not set it)";
  }
  json cfg_;
  std::string path_;
};

// The RoPE keys of a Llama config: rope_theta and rope_scaling, or transformers 5's rope_parameters
// holding both. A type other than "default" and "llama3" is refused by name.
void check_rope(const HubConfig& c, const ModelConfig& m) {
  const bool v5 = c.has("rope_parameters") && c.raw()["rope_parameters"].is_object();
  const json scaling = v5 ? c.raw()["rope_parameters"] : c.value("rope_scaling", nullptr);
  const std::string key = v5 ? "rope_parameters" : "rope_scaling";
  if (v5) {
    const json theta = scaling.contains("rope_theta") ? scaling["rope_theta"] : json(10000.0);
    if (!same_value(theta, m.rope_theta))
      throw UserError(strprintf("checkpoint.init_from: '%s' has rope_parameters.rope_theta = %s, but this run's "
                                "model.rope_theta is %s: set model.rope_theta=%s to load it",
                                c.path().c_str(), config_json::show(theta).c_str(), config_json::fmt_num(m.rope_theta).c_str(),
                                config_json::show(theta).c_str()));
  } else {
    c.same("rope_theta", 10000.0, "model.rope_theta", m.rope_theta);
  }
  if (!scaling.is_null() && !scaling.is_object())
    throw UserError(strprintf("checkpoint.init_from: '%s' has %s = %s, where transformers takes an object or null",
                              c.path().c_str(), key.c_str(), config_json::show(scaling).c_str()));
  // transformers' name is rope_type; its older files say type.
  json type = "default";
  if (scaling.is_object()) type = scaling.contains("rope_type") ? scaling["rope_type"] : scaling.value("type", json("default"));
  if (type != "default" && type != "llama3")
    throw UserError(strprintf("checkpoint.init_from: '%s' has %s of type %s, which zero3d does not implement (it "
                              "implements \"llama3\", and \"default\": none): its positions would be turned wrongly",
                              c.path().c_str(), key.c_str(), config_json::show(type).c_str()));
  const RopeScaling& rs = m.rope_scaling;
  if (type.get<std::string>() != rs.rope_type)
    throw UserError(strprintf("checkpoint.init_from: '%s' has %s of type %s, but this run's "
                              "model.rope_scaling.rope_type is \"%s\": set model.rope_scaling.rope_type=%s (and, for "
                              "llama3, its numbers) to load it",
                              c.path().c_str(), key.c_str(), type.dump().c_str(), rs.rope_type.c_str(),
                              type.get<std::string>().c_str()));
  if (type != "llama3") return;
  const std::pair<const char*, double> numbers[] = {
      {"factor", rs.factor},
      {"low_freq_factor", rs.low_freq_factor},
      {"high_freq_factor", rs.high_freq_factor},
      {"original_max_position_embeddings", static_cast<double>(rs.original_max_position_embeddings)}};
  for (const auto& [k, want] : numbers) {
    if (!scaling.contains(k))  // transformers requires each of them for llama3
      throw UserError(strprintf("checkpoint.init_from: '%s' has %s of type \"llama3\" without %s, which transformers "
                                "requires",
                                c.path().c_str(), key.c_str(), k));
    const json& got = scaling[k];
    if (!same_value(got, want))
      throw UserError(strprintf("checkpoint.init_from: '%s' has %s.%s = %s, but this run's model.rope_scaling.%s is "
                                "%s: set model.rope_scaling.%s=%s to load it",
                                c.path().c_str(), key.c_str(), k, config_json::show(got).c_str(), k,
                                config_json::fmt_num(want).c_str(), k, config_json::show(got).c_str()));
  }
}

// Which transformers class config.json describes: GPT-2 (true) or Llama (false); anything else is
// named and refused.
bool gpt2_config(const HubConfig& c) {
  const json type = c.value("model_type", nullptr);
  const json archs = c.value("architectures", json::array());
  const std::string arch = archs.is_array() && !archs.empty() && archs[0].is_string() ? archs[0].get<std::string>() : "";
  if (type == "gpt2" || (type.is_null() && arch.starts_with("GPT2"))) return true;
  if (type == "llama" || (type.is_null() && arch.starts_with("Llama"))) return false;
  throw UserError(strprintf("checkpoint.init_from: '%s' describes model_type %s (architectures %s); zero3d reads "
                            "GPT2LMHeadModel (model_type \"gpt2\") and LlamaForCausalLM (model_type \"llama\")",
                            c.path().c_str(), config_json::show(type).c_str(), config_json::show(archs).c_str()));
}

// The run's model must be of the family the file describes.
void check_family(const HubConfig& c, const ModelConfig& m, bool gpt2) {
  const bool ok = gpt2 ? !m.rmsnorm() && !m.rope() && !m.swiglu() && m.bias && m.kv_heads() == m.n_head
                       : m.rmsnorm() && m.rope() && m.swiglu();
  if (!ok)
    throw UserError(strprintf("checkpoint.init_from: '%s' describes a %s, but this run's model is %s: set "
                              "model.arch=%s and leave model.norm, position and mlp at its defaults",
                              c.path().c_str(), gpt2 ? "GPT-2 model (GPT2LMHeadModel)" : "Llama model (LlamaForCausalLM)",
                              describe_architecture(m).c_str(), gpt2 ? "gpt2" : "llama"));
}

// GPT2Config's keys (transformers' defaults) against m; the model's context n_positions.
int64_t check_gpt2(const HubConfig& c, const ModelConfig& m) {
  c.same("vocab_size", 50257, "model.vocab_size", m.vocab_size);
  c.same("n_embd", 768, "model.d_model", m.d_model);
  c.same("n_layer", 12, "model.n_layer", m.n_layer);
  c.same("n_head", 12, "model.n_head", m.n_head);
  c.same("n_inner", 4 * c.value("n_embd", 768).get<int64_t>(), "model.intermediate_size", m.ffn_hidden());
  c.same("tie_word_embeddings", true, "model.tie_word_embeddings", m.tie_word_embeddings);
  c.fixed("activation_function", "gelu_new", {"gelu_new", "gelu_pytorch_tanh"},
          "zero3d's GPT-2 MLP is GELU's tanh approximation (gelu_new)");
  c.fixed("layer_norm_epsilon", 1e-5, {1e-5}, "zero3d's LayerNorm has epsilon 1e-5");
  c.fixed("scale_attn_weights", true, {true}, "zero3d scales attention by 1/sqrt(head width)");
  c.fixed("scale_attn_by_inverse_layer_idx", false, {false}, "zero3d scales every layer's attention alike");
  return c.context("n_positions", 1024, m.seq_len);
}

// LlamaConfig's keys (transformers' defaults) against m.
void check_llama(const HubConfig& c, const ModelConfig& m) {
  c.same("vocab_size", 32000, "model.vocab_size", m.vocab_size);
  c.same("hidden_size", 4096, "model.d_model", m.d_model);
  c.same("intermediate_size", 11008, "model.intermediate_size", m.ffn_hidden());
  c.same("num_hidden_layers", 32, "model.n_layer", m.n_layer);
  c.same("num_attention_heads", 32, "model.n_head", m.n_head);
  c.same("num_key_value_heads", c.value("num_attention_heads", 32), "model.num_key_value_heads", m.kv_heads());
  const json heads = c.value("num_attention_heads", 32), hidden = c.value("hidden_size", 4096);
  const json width = heads.is_number_integer() && hidden.is_number_integer() && heads.get<int64_t>() > 0
                         ? json(hidden.get<int64_t>() / heads.get<int64_t>())
                         : json(nullptr);
  c.fixed("head_dim", width, {m.head_dim()},
          strprintf("zero3d's heads are hidden_size / num_attention_heads = %d wide", m.head_dim()).c_str());
  c.same("rms_norm_eps", 1e-6, "model.rms_norm_eps", m.rms_norm_eps);
  c.same("tie_word_embeddings", false, "model.tie_word_embeddings", m.tie_word_embeddings);
  c.same("attention_bias", false, "model.bias", m.bias);
  c.same("mlp_bias", false, "model.bias", m.bias);
  c.fixed("hidden_act", "silu", {"silu"}, "zero3d's SwiGLU gates with silu");
  c.context("max_position_embeddings", 2048, m.seq_len);
  check_rope(c, m);
}

// The weight files: model.safetensors, or the shards the index names (in their order there), and
// the index's tensor -> shard map. PyTorch's pickles are refused by name.
struct WeightFiles {
  std::vector<std::string> files;
  std::string index;           // "" for one file
  std::map<std::string, std::string> shard_of;  // tensor name -> its file, from the index
};

WeightFiles weight_files(const std::string& dir) {
  WeightFiles w;
  const std::string index = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
  if (exists(index)) {
    w.index = index;
    const json idx = config_json::read_file(index, "checkpoint.init_from's shard index");
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object() || idx["weight_map"].empty())
      throw UserError(strprintf("checkpoint.init_from: '%s' has no weight_map (an object: tensor name -> shard file)",
                                index.c_str()));
    for (const auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos)
        throw UserError(strprintf("checkpoint.init_from: '%s' puts tensor '%s' in %s, not a file name of the directory",
                                  index.c_str(), name.c_str(), config_json::show(file).c_str()));
      const std::string path = dir + "/" + file.get<std::string>();
      if (std::find(w.files.begin(), w.files.end(), path) == w.files.end()) {
        if (!exists(path))
          throw UserError(strprintf("checkpoint.init_from: '%s' names shard '%s', which is not there (%s)", index.c_str(),
                                    path.c_str(), std::strerror(errno)));
        w.files.push_back(path);
      }
      w.shard_of[name] = path;
    }
    return w;
  }
  if (exists(single)) {
    w.files.push_back(single);
    return w;
  }
  for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
    if (exists(dir + "/" + pickle))
      throw UserError(strprintf("checkpoint.init_from: '%s' holds %s, PyTorch's pickle format, which zero3d does not "
                                "read: convert it to safetensors first (transformers: "
                                "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(OUT, safe_serialization=True))",
                                dir.c_str(), pickle));
  throw UserError(strprintf("checkpoint.init_from: '%s' has no model.safetensors (nor model.safetensors.index.json "
                            "naming shards)",
                            dir.c_str()));
}

// One tensor of this run's model as the files may hold it.
struct Wanted {
  HfTensor t;                       // t.name: transformers' name without the prefix
  std::vector<int64_t> file_shape;  // t.shape(), but GPT-2's wpe of n_positions rows
  std::string found_as, found_in;   // its name and file, once read
};

// A tensor's elements as floats, rows [0, rows) of `cols` columns (of its transpose when `transpose`:
// Conv1D's (in, out)), into dst; its dtype, shape and byte span checked first.
void copy_tensor(const Safetensors& st, const StEntry& e, const std::string& where, const std::string& name,
                 const std::vector<int64_t>& file_shape, int64_t rows, int64_t cols, bool transpose, float* dst) {
  if (e.shape != file_shape)
    throw UserError(strprintf("%s: tensor '%s' has shape %s, but this run's model needs %s", where.c_str(),
                              name.c_str(), shape_text(e.shape).c_str(), shape_text(file_shape).c_str()));
  if (e.elem == 0)
    throw UserError(strprintf("%s: tensor '%s' is %s; zero3d reads F32, BF16 and F16", where.c_str(), name.c_str(),
                              e.dtype.c_str()));
  size_t count = 1;
  for (int64_t d : file_shape) count *= static_cast<size_t>(d);
  const size_t es = e.elem;
  if (e.end - e.begin != count * es)
    throw UserError(strprintf("%s: tensor '%s' (%s %s) spans %llu bytes, where its shape needs %zu: the header is "
                              "corrupt",
                              where.c_str(), name.c_str(), e.dtype.c_str(), shape_text(e.shape).c_str(),
                              (unsigned long long)(e.end - e.begin), count * es));
  auto value = [&](size_t i) {
    const char* q = st.data + e.begin + i * es;
    if (es == 4) {
      float f;
      std::memcpy(&f, q, 4);
      return f;
    }
    uint16_t u;
    std::memcpy(&u, q, 2);
    return e.dtype == "BF16" ? math::float_from_bf16(u) : math::float_from_fp16(u);
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = transpose ? static_cast<size_t>(c * rows + r) : static_cast<size_t>(r * cols + c);
      const float v = value(i);
      if (!std::isfinite(v))  // a weight that is NaN or infinite trains nothing: say so now, not as a divergence
        throw UserError(strprintf("%s: tensor '%s' holds %g at element %zu: initial weights must be finite",
                                  where.c_str(), name.c_str(), v, i));
      dst[r * cols + c] = v;
    }
}

}  // namespace

std::shared_ptr<InitialWeights> read_hf_weights(const std::string& dir, const ModelConfig& m) {
  const std::string cfg_path = dir + "/config.json";
  const HubConfig cfg(config_json::read_file(cfg_path, "checkpoint.init_from's config"), cfg_path);
  const bool gpt2 = gpt2_config(cfg);
  check_family(cfg, m, gpt2);
  int64_t positions = 0;  // GPT-2's n_positions: the rows of its wpe
  if (gpt2) positions = check_gpt2(cfg, m);
  else check_llama(cfg, m);
  const std::string prefix = gpt2 ? "transformer." : "model.";
  const std::regex buffer = gpt2 ? std::regex(R"(h\.\d+\.attn\.(bias|masked_bias))")
                                 : std::regex(R"(layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");

  std::map<std::string, Wanted> wanted;  // by the name without the prefix
  for (HfTensor& t : hf_tensor_table(m, gpt2)) {
    if (t.name.starts_with(prefix)) t.name = t.name.substr(prefix.size());
    std::vector<int64_t> shape = t.shape();
    if (t.source == "wpe") shape[0] = positions;  // the model's context: its first seq_len rows are read
    wanted[t.name] = Wanted{t, shape, "", ""};
  }
  auto w = std::make_shared<InitialWeights>();
  for (const ParamInfo& p : gpt_param_table(m))
    if (!p.tied_copy) w->tensors[p.name].assign(p.size, 0.0f);

  const WeightFiles files = weight_files(dir);
  std::vector<float> head;  // a tied model's lm_head.weight, compared with the embedding at the end
  std::string head_in;
  for (const std::string& path : files.files) {
    const std::string file = read_text_file(path, "checkpoint.init_from's weights"),
                      where = "checkpoint.init_from: '" + path + "'";
    const Safetensors st = parse_safetensors(file, where);
    for (const auto& [name, file_of] : files.shard_of)
      if (file_of == path && !st.header.contains(name))
        throw UserError(strprintf("checkpoint.init_from: '%s' puts tensor '%s' in '%s', which does not hold it",
                                  files.index.c_str(), name.c_str(), path.c_str()));
    for (const auto& [name, entry] : st.header.items()) {
      if (name == "__metadata__") continue;
      const std::string base = name.starts_with(prefix) ? name.substr(prefix.size()) : name;
      if (std::regex_match(base, buffer)) continue;  // a buffer transformers recomputes: no weights
      if (base == "lm_head.weight" && m.tie_word_embeddings) {
        const StEntry e = st_entry(st.header, name, where, st.data_bytes);
        head.assign(static_cast<size_t>(m.vocab_size) * m.d_model, 0.0f);
        copy_tensor(st, e, where, name, {m.vocab_size, m.d_model}, m.vocab_size, m.d_model, false, head.data());
        head_in = path;
        continue;
      }
      auto it = wanted.find(base);
      if (it == wanted.end())
        throw UserError(strprintf("%s holds tensor '%s', which %s of this run's model does not have (%s)", where.c_str(),
                                  name.c_str(), gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM",
                                  describe_architecture(m).c_str()));
      Wanted& x = it->second;
      if (!x.found_as.empty())
        throw UserError(strprintf("%s holds tensor '%s', which '%s' holds already as '%s'", where.c_str(), name.c_str(),
                                  x.found_in.c_str(), x.found_as.c_str()));
      const StEntry e = st_entry(st.header, name, where, st.data_bytes);
      float* dst = w->tensors.at(x.t.source).data() + static_cast<size_t>(x.t.row0 * x.t.cols);
      copy_tensor(st, e, where, name, x.file_shape, x.t.rows, x.t.cols, x.t.transpose, dst);
      x.found_as = name, x.found_in = path;
    }
  }
  const std::string searched = files.index.empty() ? "'" + files.files[0] + "'" : "the shards of '" + files.index + "'";
  for (const auto& [base, x] : wanted)
    if (x.found_as.empty()) {
      const bool head_missing = base == "lm_head.weight";
      throw UserError(strprintf("checkpoint.init_from: %s hold%s no tensor '%s'%s%s", searched.c_str(),
                                files.index.empty() ? "s" : "", base.c_str(),
                                base.starts_with("lm_head") ? "" : (" (nor '" + prefix + base + "')").c_str(),
                                head_missing ? ": the model's LM head, untied (tie_word_embeddings is false)" : ""));
    }
  if (!head.empty()) {  // tied: lm_head.weight must be the embedding itself
    const std::vector<float>& wte = w->tensors.at("wte");
    for (size_t i = 0; i < head.size(); ++i)
      if (std::memcmp(&head[i], &wte[i], sizeof(float)) != 0)
        throw UserError(strprintf("checkpoint.init_from: '%s' holds lm_head.weight, which differs from the token "
                                  "embedding (row %zu, column %zu: %g vs %g) although tie_word_embeddings is true: its "
                                  "head is not tied; set tie_word_embeddings false in '%s' and model.tie_word_embeddings"
                                  "=false",
                                  head_in.c_str(), i / m.d_model, i % m.d_model, head[i], wte[i], cfg_path.c_str()));
  }
  return w;
}

}  // namespace zero3d
