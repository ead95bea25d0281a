#include "model/param_table.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/rng.h"
#include "kernels/math/rope.h"
#include "model/module_profile.h"

namespace zero3d {

namespace {

// Local row r of a TpSplit::blocks tensor: its block's first local and logical rows, and its rows per rank.
struct BlockRow {
  size_t local0, logical0, part;
};
BlockRow block_row(const ParamInfo& p, size_t r) {
  size_t local0 = 0, logical0 = 0;
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    const size_t part = static_cast<size_t>(p.blocks[b]) / static_cast<size_t>(p.tp);
    if (r < local0 + part || b + 1 == p.blocks.size()) return {local0, logical0, part};
    local0 += part;
    logical0 += static_cast<size_t>(p.blocks[b]);
  }
  return {0, 0, 0};
}

}  // namespace

std::vector<BlockTensor> block_tensors(const ModelConfig& m) {
  const int64_t C = m.d_model, hd = m.head_dim(), Q = int64_t{m.n_head} * hd, KV = int64_t{m.kv_heads()} * hd,
                F = m.ffn_hidden();
  const bool ln = !m.rmsnorm(), b = m.bias;
  using S = TpSplit;
  const std::vector<int64_t> qkv{Q, KV, KV}, fc = m.swiglu() ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F};
  const int64_t fc_rows = m.swiglu() ? 2 * F : F;
  std::vector<BlockTensor> t;
  auto add = [&](bool present, BlockTensor bt) {
    if (present) t.push_back(std::move(bt));
  };
  add(true, {kLn1W, "ln_1.weight", {C}, false, S::none, {}});
  add(ln, {kLn1B, "ln_1.bias", {C}, false, S::none, {}});
  add(true, {kQkvW, "attn.c_attn.weight", {Q + 2 * KV, C}, true, S::blocks, qkv});  // column-parallel, whole heads
  add(b, {kQkvB, "attn.c_attn.bias", {Q + 2 * KV}, false, S::blocks, qkv});
  add(true, {kProjW, "attn.c_proj.weight", {C, Q}, true, S::cols, {}});  // row-parallel
  add(b, {kProjB, "attn.c_proj.bias", {C}, false, S::none, {}});
  add(true, {kLn2W, "ln_2.weight", {C}, false, S::none, {}});
  add(ln, {kLn2B, "ln_2.bias", {C}, false, S::none, {}});
  add(true, {kFcW, "mlp.c_fc.weight", {fc_rows, C}, true, S::blocks, fc});  // column-parallel ([gate | up])
  add(b, {kFcB, "mlp.c_fc.bias", {fc_rows}, false, S::blocks, fc});
  add(true, {kFcProjW, "mlp.c_proj.weight", {C, F}, true, S::cols, {}});  // row-parallel
  add(b, {kFcProjB, "mlp.c_proj.bias", {C}, false, S::none, {}});
  return t;
}

PipelineStage pipeline_stage(const ModelConfig& m, int pp, int pp_rank) {
  const int base = m.n_layer / pp, extra = m.n_layer % pp;
  return PipelineStage{pp_rank, pp, pp_rank * base + std::min(pp_rank, extra), base + (pp_rank < extra ? 1 : 0)};
}

std::vector<ParamInfo> gpt_param_table(const ModelConfig& m, int tp, int tp_rank, int pp, int pp_rank) {
  const int64_t V = m.padded_vocab(), T = m.seq_len, C = m.d_model;
  const PipelineStage stage = pipeline_stage(m, pp, pp_rank);
  const std::vector<BlockTensor> block = block_tensors(m);
  // Ids number the whole model's tensors in table order (the RNG streams of their initial values).
  const int emb = m.rope() ? 1 : 2, per_block = static_cast<int>(block.size()), final_id = emb + per_block * m.n_layer;
  std::vector<ParamInfo> t;
  int unit = 0;
  auto add = [&](std::string name, std::vector<int64_t> logical, bool decay, TpSplit split, int id,
                 std::vector<int64_t> blocks = {}) {
    ParamInfo p{std::move(name), logical, 0, 1, decay, unit, split, logical, tp, tp_rank, id, false, false,
                std::move(blocks)};
    if (split == TpSplit::cols) p.shape[1] /= tp;
    else if (split != TpSplit::none) p.shape[0] /= tp;
    for (auto d : p.shape) p.size *= static_cast<size_t>(d);
    p.offset = t.empty() ? 0 : t.back().offset + t.back().size;
    p.own_bucket = p.name == "wte" && pp > 1 && m.tie_word_embeddings;
    t.push_back(std::move(p));
  };
  using S = TpSplit;
  if (stage.first()) {
    add("wte", {V, C}, true, S::rows, 0);  // vocab-parallel embedding (and, tied, LM head)
    if (!m.rope()) add("wpe", {T, C}, true, S::none, 1);
    ++unit;
  }
  for (int l = stage.first_layer; l < stage.first_layer + stage.num_layers; ++l, ++unit) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (int k = 0; k < per_block; ++k) {
      add(h + block[k].name, block[k].shape, block[k].decay, block[k].split, emb + per_block * l + k, block[k].blocks);
      t.back().gemm_only = block[k].shape.size() == 2;
    }
  }
  if (stage.last()) {
    int id = final_id;
    add("ln_f.weight", {C}, false, S::none, id++);
    if (!m.rmsnorm()) add("ln_f.bias", {C}, false, S::none, id++);
    if (!m.tie_word_embeddings) {
      add("lm_head.weight", {V, C}, true, S::rows, id);  // vocab-parallel, like wte
      t.back().gemm_only = true;
    } else if (pp > 1) {  // the LM head's copy of the tied embedding, kept equal to the first stage's
      add("wte", {V, C}, true, S::rows, 0);
      t.back().tied_copy = t.back().gemm_only = true;
    }
  }
  return t;
}

size_t logical_index(const ParamInfo& p, size_t local) {
  const size_t cols = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  const size_t i = local / cols, j = local % cols, r = static_cast<size_t>(p.tp_rank);
  switch (p.split) {
    case TpSplit::none: return local;
    case TpSplit::rows: return (r * static_cast<size_t>(p.shape[0]) + i) * cols + j;
    case TpSplit::blocks: {  // local rows: this rank's share of each block, in block order
      const BlockRow b = block_row(p, i);
      return (b.logical0 + r * b.part + (i - b.local0)) * cols + j;
    }
    case TpSplit::cols: return i * cols * p.tp + r * cols + j;
  }
  return local;
}

size_t logical_run(const ParamInfo& p, size_t local) {
  const size_t cols = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  switch (p.split) {
    case TpSplit::none:
    case TpSplit::rows: return p.size - local;
    case TpSplit::blocks: {  // to the end of the local block
      const BlockRow b = block_row(p, local / cols);
      return (b.local0 + b.part) * cols - local;
    }
    case TpSplit::cols: return cols - local % cols;
  }
  return 1;
}

std::vector<LogicalRect> logical_rects(const ParamInfo& p, size_t begin, size_t size) {
  const size_t R = static_cast<size_t>(p.shape[0]), C = p.shape.size() > 1 ? static_cast<size_t>(p.shape[1]) : 1;
  std::vector<LogicalRect> local;  // partial first row, whole rows, partial last row
  size_t i = begin;
  const size_t end = begin + size;
  if (i < end && i % C) {
    const size_t n = std::min(C - i % C, end - i);
    local.push_back({i / C, i % C, 1, n});
    i += n;
  }
  if (end - i >= C) {
    const size_t k = (end - i) / C;
    local.push_back({i / C, 0, k, C});
    i += k * C;
  }
  if (i < end) local.push_back({i / C, 0, 1, end - i});
  const size_t r = static_cast<size_t>(p.tp_rank);
  std::vector<LogicalRect> out;
  for (const LogicalRect& q : local) {
    switch (p.split) {
      case TpSplit::none: out.push_back(q); break;
      case TpSplit::rows: out.push_back({q.r0 + r * R, q.c0, q.rows, q.cols}); break;
      case TpSplit::cols: out.push_back({q.r0, q.c0 + r * C, q.rows, q.cols}); break;
      case TpSplit::blocks: {  // cut at the blocks
        for (size_t a = q.r0; a < q.r0 + q.rows;) {
          const BlockRow b = block_row(p, a);
          const size_t e = std::min(q.r0 + q.rows, b.local0 + b.part);
          out.push_back({b.logical0 + r * b.part + (a - b.local0), q.c0, e - a, q.cols});
          a = e;
        }
        break;
      }
    }
  }
  return out;
}

std::string describe_architecture(const ModelConfig& m) {
  const std::string heads = m.kv_heads() == m.n_head ? std::to_string(m.n_head) + " heads"
                                                       : strprintf("%d heads (%d key/value heads)", m.n_head, m.kv_heads());
  return strprintf("%s: %d layers, d_model %d, %s of %d, %s, %s, %s %d, %s, %s", m.arch.c_str(), m.n_layer, m.d_model,
                   heads.c_str(), m.head_dim(), m.rmsnorm() ? "RMSNorm" : "LayerNorm",
                   !m.rope() ? "learned positions"
                   : m.rope_scaling.rope_type == "llama3"
                       ? strprintf("RoPE (theta %g, llama3 scaling: factor %g, low_freq_factor %g, high_freq_factor %g, "
                                   "original_max_position_embeddings %d)",
                                   m.rope_theta, m.rope_scaling.factor, m.rope_scaling.low_freq_factor,
                                   m.rope_scaling.high_freq_factor, m.rope_scaling.original_max_position_embeddings).c_str()
                       : strprintf("RoPE (theta %g)", m.rope_theta).c_str(),
                   m.swiglu() ? "SwiGLU" : "GELU", m.ffn_hidden(), m.bias ? "biases" : "no biases",
                   m.tie_word_embeddings ? "LM head tied to wte" : "untied LM head") +
         (m.padded_vocab() > m.vocab_size ? strprintf(", vocabulary %d padded to %d rows", m.vocab_size, m.padded_vocab())
                                          : "");
}

std::vector<float> gpt_rope_table(const ModelConfig& m, int T) {
  const RopeScaling& s = m.rope_scaling;
  const math::RopeLlama3 llama3{s.factor, s.low_freq_factor, s.high_freq_factor,
                                static_cast<double>(s.original_max_position_embeddings)};
  return math::rope_table(T, m.head_dim(), m.rope_theta, s.rope_type == "llama3" ? &llama3 : nullptr);
}

double gpt_flops_per_token(const ModelConfig& m) {  // the whole model's, whatever the layout
  double n = 0;
  for (const auto& p : gpt_param_table(m))  // a lookup is no matrix multiply: wpe, and wte when untied
    if (p.name != "wpe" && (p.name != "wte" || m.tie_word_embeddings))  // no padding row makes a logit
      n += static_cast<double>(p.name == "wte" || p.name == "lm_head.weight" ? p.size / m.padded_vocab() * m.vocab_size : p.size);
  return 6.0 * n + 6.0 * m.n_layer * static_cast<double>(m.d_model) * (m.seq_len + 1);
}

std::vector<ModuleStat> gpt_modules(const ModelConfig& m, int micro_batch, int tp, int tp_rank, int pp, int pp_rank) {
  const PipelineStage stage = pipeline_stage(m, pp, pp_rank);
  const double N = static_cast<double>(micro_batch) * m.seq_len, C = m.d_model, T = m.seq_len;
  std::vector<ModuleStat> mods;
  if (stage.first()) mods.push_back({"embedding"});
  for (int l = stage.first_layer; l < stage.first_layer + stage.num_layers; ++l)
    for (const char* part : {"ln_1", "attn", "ln_2", "mlp"}) mods.push_back({"h." + std::to_string(l) + "." + part});
  if (stage.last()) mods.push_back({"ln_f"}), mods.push_back({"lm_head"});
  auto module_of = [&](const ParamInfo& p) -> ModuleStat& {
    if (p.tied_copy) return mods.back();  // the last stage's copy of wte serves the LM head
    if (p.name == "wte" || p.name == "wpe") return mods.front();
    const std::string name = p.name.substr(0, p.name.rfind('.'));  // "h.3.attn.c_attn" or "ln_f"
    for (ModuleStat& s : mods)
      if (name == s.name || name.starts_with(s.name + ".")) return s;
    Z3D_ASSERT(false, "tensor " + p.name + " belongs to no module");
    return mods.front();
  };
  for (const ParamInfo& p : gpt_param_table(m, tp, tp_rank, pp, pp_rank)) {
    ModuleStat& s = module_of(p);
    s.params += static_cast<double>(p.size);
    if (p.name != "wte" && p.name != "wpe") s.macs += N * static_cast<double>(p.size);
  }
  for (ModuleStat& s : mods) {
    if (s.name.ends_with(".attn")) s.macs += micro_batch * (C / tp) * T * (T + 1);  // QK^T and AV, causal
    if (s.name == "lm_head") s.macs = N * static_cast<double>(m.vocab_size) / tp * C;  // logits = x wte^T
  }
  return mods;
}

void gpt_init_tensor(const std::vector<ParamInfo>& table, size_t index, int n_layer, uint64_t seed, size_t begin,
                     size_t end, float* out) {
  const ParamInfo& p = table[index];
  const bool is_ln_weight = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
  if (is_ln_weight) {
    for (size_t k = begin; k < end; ++k) out[k - begin] = 1.0f;
  } else if (p.shape.size() == 1) {
    for (size_t k = begin; k < end; ++k) out[k - begin] = 0.0f;
  } else {
    const bool residual = p.name.ends_with("c_proj.weight");
    const double std = 0.02 * (residual ? 1.0 / std::sqrt(2.0 * n_layer) : 1.0);
    for (size_t k = begin; k < end; ++k)
      out[k - begin] = static_cast<float>(std * normal_at(seed, static_cast<uint64_t>(p.id), logical_index(p, k)));
  }
}

}  // namespace zero3d
