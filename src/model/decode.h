// model/decode.h: inference one token at a time with a KV cache (zero3d generate), and the loss of
// whole sequences (zero3d eval), on one process and the host backend.
//
// Decoder feeds tokens one at a time at positions 0, 1, ...: each layer keeps every position's
// packed [q | k | v] row (the keys and values after RoPE: the cache), so a new token costs one row
// of every GEMM and one row of attention (kernels/math/attention.h's reference row, the math the
// fused kernels run), not a forward over the whole prefix. The context ends at seq_len.
#pragma once
#include <cstdint>
#include <vector>

#include "config/config.h"
#include "kernels/backend.h"

namespace zero3d {

class Decoder {
 public:
  // tensors: gpt_param_table(m) (tp 1, pp 1), in table order, fp32; copied. be: a host backend.
  Decoder(Backend& be, const ModelConfig& m, const std::vector<std::vector<float>>& tensors);
  // Feeds `token` at the next position; returns the logits (vocab_size) of the token after it.
  const std::vector<float>& step(int32_t token);
  int position() const { return pos_; }  // tokens fed so far
  void reset() { pos_ = 0; }

 private:
  const float* tensor(const std::string& name) const;  // nullptr when the model has none
  Backend& be_;
  ModelConfig m_;
  int C_, hd_, H_, Hkv_, QKV_, F_, F2_, pos_ = 0;
  DeviceBuffer<float> params_;
  std::vector<std::pair<std::string, size_t>> offsets_;  // tensor name -> offset in params_
  std::vector<DeviceBuffer<float>> cache_;                // per layer: seq_len rows of QKV_
  DeviceBuffer<float> x_, x2_, h_, att_, fc_, act_, stats_, logits_dev_, rope_cs_;
  std::vector<float> logits_;
};

// One token sampled from logits: the most likely when temperature is 0, else from
// softmax(logits / temperature) over the top_k most likely (0: all), with u in [0, 1) the draw.
int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, double u);

}  // namespace zero3d
