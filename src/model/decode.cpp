#include "model/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "kernels/math/attention.h"
#include "model/gpt.h"

namespace zero3d {

Decoder::Decoder(Backend& be, const ModelConfig& m, const std::vector<std::vector<float>>& tensors)
    : be_(be), m_(m), C_(m.d_model), hd_(m.head_dim()), H_(m.n_head), Hkv_(m.kv_heads()),
      QKV_(m.d_model + 2 * m.kv_heads() * m.head_dim()), F_(m.ffn_hidden()), F2_(m.swiglu() ? 2 * F_ : F_) {
  Z3D_ASSERT(be.memory_kind() == MemKind::host, "the decoder runs on the host backend");
  const std::vector<ParamInfo> table = gpt_param_table(m);
  Z3D_ASSERT(table.size() == tensors.size(), "decoder: the tensors do not match the model");
  size_t total = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    Z3D_ASSERT(tensors[i].size() == table[i].size, "decoder: tensor " + table[i].name + " has the wrong size");
    offsets_.push_back({table[i].name, total});
    total += table[i].size;
  }
  params_ = DeviceBuffer<float>(be, total);
  for (size_t i = 0; i < table.size(); ++i)
    be.copy_from_host(params_.data() + offsets_[i].second, tensors[i].data(), tensors[i].size() * sizeof(float));
  for (int l = 0; l < m.n_layer; ++l) cache_.emplace_back(be, static_cast<size_t>(m.seq_len) * QKV_);
  x_ = DeviceBuffer<float>(be, C_), x2_ = DeviceBuffer<float>(be, C_), h_ = DeviceBuffer<float>(be, C_);
  att_ = DeviceBuffer<float>(be, C_), fc_ = DeviceBuffer<float>(be, F2_), act_ = DeviceBuffer<float>(be, F_);
  stats_ = DeviceBuffer<float>(be, 2), logits_dev_ = DeviceBuffer<float>(be, m.vocab_size);
  logits_.resize(m.vocab_size);
  if (m.rope()) {
    const std::vector<float> cs = gpt_rope_table(m, m.seq_len);
    rope_cs_ = DeviceBuffer<float>(be, cs.size());
    be.copy_from_host(rope_cs_.data(), cs.data(), rope_cs_.bytes());
  }
}

const float* Decoder::tensor(const std::string& name) const {
  for (const auto& [n, off] : offsets_)
    if (n == name) return params_.data() + off;
  return nullptr;
}

const std::vector<float>& Decoder::step(int32_t token) {
  if (pos_ >= m_.seq_len)
    throw UserError(strprintf("the context is full: the model's seq_len is %d tokens", m_.seq_len));
  if (token < 0 || token >= m_.vocab_size)
    throw UserError(strprintf("token %d is outside the vocabulary (0-%d)", token, m_.vocab_size - 1));
  const int t = pos_++;
  float *x = x_.data(), *x2 = x2_.data(), *h = h_.data(), *mean = stats_.data(), *rstd = mean + 1;
  // The host backend's memory is host memory: the lookup and the attention row read it directly.
  std::memcpy(x, tensor("wte") + static_cast<size_t>(token) * C_, sizeof(float) * C_);
  if (const float* wpe = tensor("wpe"))
    for (int c = 0; c < C_; ++c) x[c] += wpe[static_cast<size_t>(t) * C_ + c];
  auto norm = [&](float* out, const float* in, const std::string& prefix) {
    if (m_.rmsnorm()) be_.rmsnorm_forward(out, rstd, in, tensor(prefix + ".weight"), 1, C_, static_cast<float>(m_.rms_norm_eps));
    else be_.layernorm_forward(out, mean, rstd, in, tensor(prefix + ".weight"), tensor(prefix + ".bias"), 1, C_);
  };
  const float alpha = 1.0f / std::sqrt(static_cast<float>(hd_));
  for (int l = 0; l < m_.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    float* rows = cache_[l].data();
    float* row = rows + static_cast<size_t>(t) * QKV_;
    norm(h, x, p + "ln_1");
    be_.linear_forward(row, h, tensor(p + "attn.c_attn.weight"), tensor(p + "attn.c_attn.bias"), nullptr, 1, C_, QKV_);
    if (m_.rope()) be_.rope(row, rope_cs_.data() + static_cast<size_t>(t) * hd_, 1, 1, H_ + Hkv_, hd_, QKV_, false);
    for (int hq = 0; hq < H_; ++hq) {  // row t of each head against the cached keys and values
      const int kvh = hq / (H_ / Hkv_);
      math::attention_row_forward(att_.data() + hq * hd_, rows + hq * hd_, rows + C_ + kvh * hd_,
                                  rows + C_ + (Hkv_ + kvh) * hd_, QKV_, t, hd_, alpha);
    }
    be_.linear_forward(x2, att_.data(), tensor(p + "attn.c_proj.weight"), tensor(p + "attn.c_proj.bias"), x, 1, C_, C_);
    norm(h, x2, p + "ln_2");
    if (m_.swiglu()) {
      be_.linear_forward(fc_.data(), h, tensor(p + "mlp.c_fc.weight"), tensor(p + "mlp.c_fc.bias"), nullptr, 1, C_, F2_);
      be_.swiglu_forward(act_.data(), fc_.data(), 1, F_);
    } else {
      be_.linear_gelu_forward(act_.data(), fc_.data(), h, tensor(p + "mlp.c_fc.weight"), tensor(p + "mlp.c_fc.bias"), 1,
                              C_, F_);
    }
    be_.linear_forward(x, act_.data(), tensor(p + "mlp.c_proj.weight"), tensor(p + "mlp.c_proj.bias"), x2, 1, F_, C_);
  }
  norm(h, x, "ln_f");
  const float* head = m_.tie_word_embeddings ? tensor("wte") : tensor("lm_head.weight");
  be_.gemm(false, true, 1, m_.vocab_size, C_, 1.0f, h, C_, head, C_, 0.0f, logits_dev_.data(), m_.vocab_size);
  be_.copy_to_host(logits_.data(), logits_dev_.data(), logits_.size() * sizeof(float));
  return logits_;
}

int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, double u) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const int k = top_k > 0 && top_k < V ? top_k : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> p(k);
  for (int i = 0; i < k; ++i) p[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / temperature);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  double acc = 0.0;
  for (int i = 0; i < k; ++i)
    if ((acc += p[i] / total) > u) return ids[i];
  return ids[k - 1];
}

}  // namespace zero3d
