// config/schema.cpp: the key table. Sections follow DeepSpeed's config documentation and code
// (deepspeed/runtime/config.py, zero/config.py, zero/offload_config.py, precision_config.py,
// profiling/config.py, monitor/config.py, comm/config.py, activation_checkpointing/config.py,
// swap_tensor/aio_config.py); defaults are DeepSpeed's code defaults.
#include "config/schema.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "config/json_tree.h"
#include "core/check.h"

namespace zero3d {

const char* name_of(Precision p) {
  static const char* n[] = {"fp32", "fp16", "bf16"};
  return n[static_cast<int>(p)];
}
const char* name_of(OptimizerType t) {
  static const char* n[] = {"AdamW", "Adam"};
  return n[static_cast<int>(t)];
}
const char* name_of(SchedulerType t) {
  static const char* n[] = {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
  return n[static_cast<int>(t)];
}

int swiglu_default_width(int d_model) { return (8 * d_model / 3 + 255) / 256 * 256; }
int ModelConfig::ffn_hidden() const {
  if (intermediate_size > 0) return intermediate_size;
  return swiglu() ? swiglu_default_width(d_model) : 4 * d_model;
}

nlohmann::json architecture_of(const ModelConfig& m) {
  return {{"arch", m.arch},
          {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
          {"norm", m.norm},
          {"rms_norm_eps", m.rms_norm_eps},
          {"position", m.position},
          {"rope_theta", m.rope_theta},
          {"rope_scaling.rope_type", m.rope_scaling.rope_type},
          {"rope_scaling.factor", m.rope_scaling.factor},
          {"rope_scaling.low_freq_factor", m.rope_scaling.low_freq_factor},
          {"rope_scaling.high_freq_factor", m.rope_scaling.high_freq_factor},
          {"rope_scaling.original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings},
          {"mlp", m.mlp},
          {"intermediate_size", m.ffn_hidden()},
          {"num_key_value_heads", m.kv_heads()},
          {"bias", m.bias},
          {"tie_word_embeddings", m.tie_word_embeddings}};
}

void set_architecture(ModelConfig& m, const nlohmann::json& a) {
  if (!a.is_object())
    throw UserError("the model's architecture record is not a JSON object: " + config_json::show(a));
  // Each value as the config key model.<k> takes it (a checkpoint's record is read like a config).
  auto get = [&](const char* k, auto& v) {
    if (!a.contains(k)) return;
    const config_schema::Key* key = config_schema::find_key(std::string("model.") + k);
    Z3D_ASSERT(key, std::string("no config key model.") + k);
    const nlohmann::json value = config_schema::normalise(*key, a.at(k));
    if (value.is_null())
      throw UserError(strprintf("the model's architecture record has %s = %s, where model.%s takes %s", k,
                                config_json::show(a.at(k)).c_str(), k, config_schema::valid_text(*key).c_str()));
    v = value.get<std::remove_reference_t<decltype(v)>>();
  };
  get("arch", m.arch), get("make_vocab_size_divisible_by", m.make_vocab_size_divisible_by), get("norm", m.norm), get("rms_norm_eps", m.rms_norm_eps), get("position", m.position);
  get("rope_theta", m.rope_theta), get("mlp", m.mlp), get("intermediate_size", m.intermediate_size);
  RopeScaling& rs = m.rope_scaling;
  get("rope_scaling.rope_type", rs.rope_type), get("rope_scaling.factor", rs.factor);
  get("rope_scaling.low_freq_factor", rs.low_freq_factor), get("rope_scaling.high_freq_factor", rs.high_freq_factor);
  get("rope_scaling.original_max_position_embeddings", rs.original_max_position_embeddings);
  get("num_key_value_heads", m.num_key_value_heads), get("bias", m.bias);
  get("tie_word_embeddings", m.tie_word_embeddings);
}

namespace config_schema {
namespace {

using config_json::fmt_num;
using config_json::quoted_list;

// Names of the values of each enum stored by a Choice key, in enum order.
std::vector<std::string> names(OptimizerType*) { return {"AdamW", "Adam"}; }
std::vector<std::string> names(SchedulerType*) { return {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}; }
std::vector<std::string> names(WarmupType*) { return {"log", "linear"}; }
std::vector<std::string> names(OffloadDevice*) { return {"none", "cpu", "nvme"}; }

template <class T>
using Ref = std::function<T&(Config&)>;
template <class T>
Ref<T> at(T Config::*m) {
  return [m](Config& c) -> T& { return c.*m; };
}
template <class S, class T>
Ref<T> at(S Config::*s, T S::*m) {
  return [s, m](Config& c) -> T& { return (c.*s).*m; };
}

template <class T>
Ref<T> rope_scaling_at(T RopeScaling::*m) {
  return [m](Config& c) -> T& { return c.model.rope_scaling.*m; };
}

template <class T>
Ref<T> offload_at(OffloadConfig ZeroConfig::*o, T OffloadConfig::*m) {
  return [o, m](Config& c) -> T& { return (c.zero.*o).*m; };
}

// An honoured key stored in the member `ref` points to; kind and default come from the member.
template <class T>
Key field(std::string path, Ref<T> ref, std::string doc) {
  Key k;
  k.path = std::move(path), k.doc = std::move(doc);
  Config defaults;
  const T& d = ref(defaults);
  if constexpr (std::is_same_v<T, bool>) {
    k.kind = Kind::Bool, k.def = d;
    k.store = [ref](Config& c, const json& v) { ref(c) = v.get<bool>(); };
  } else if constexpr (std::is_integral_v<T>) {
    k.kind = Kind::Integer, k.def = static_cast<int64_t>(d);
    k.lo = std::is_signed_v<T> ? -kInf : 0, k.hi = std::is_same_v<T, int> ? kIntMax : kInf;
    k.store = [ref](Config& c, const json& v) { ref(c) = static_cast<T>(v.get<int64_t>()); };
  } else if constexpr (std::is_same_v<T, double>) {
    k.kind = Kind::Number, k.def = d;
    k.store = [ref](Config& c, const json& v) { ref(c) = v.get<double>(); };
  } else if constexpr (std::is_same_v<T, std::string>) {
    k.kind = Kind::String, k.def = d;
    k.store = [ref](Config& c, const json& v) { ref(c) = v.get<std::string>(); };
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    k.kind = Kind::StringList, k.def = d;
    k.store = [ref](Config& c, const json& v) { ref(c) = v.get<std::vector<std::string>>(); };
  } else if constexpr (std::is_same_v<T, std::array<double, 2>>) {
    k.kind = Kind::Betas, k.def = json::array({d[0], d[1]});
    k.store = [ref](Config& c, const json& v) { ref(c) = {v[0].get<double>(), v[1].get<double>()}; };
  } else {
    static_assert(std::is_enum_v<T>);
    k.kind = Kind::Choice, k.choices = names(static_cast<T*>(nullptr));
    k.def = k.choices[static_cast<size_t>(d)];
    k.store = [ref, choices = k.choices](Config& c, const json& v) {
      ref(c) = static_cast<T>(std::find(choices.begin(), choices.end(), v.get<std::string>()) - choices.begin());
    };
  }
  return k;
}

// A string member restricted to a closed set (kept a string: passed through to the backend).
Key choice(std::string path, Ref<std::string> ref, std::vector<std::string> choices, std::string doc) {
  Key k = field(std::move(path), std::move(ref), std::move(doc));
  k.kind = Kind::Choice, k.choices = std::move(choices);
  return k;
}

const std::vector<std::string> kWarmupSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};

int64_t d_model_of(const Lookup& get) { return get("model.d_model").get<int64_t>(); }

std::vector<Key> build() {
  using OC = OptimizerConfig;
  using SC = SchedulerConfig;
  using ZC = ZeroConfig;
  using FC = Fp16Config;
  using MC = ModelConfig;
  using DC = DataConfig;
  using CC = CheckpointConfig;
  using XC = ComputeConfig;
  using CM = CommConfig;
  using OFC = OffloadConfig;
  std::vector<Key> keys = {
      // Batch (DeepSpeed rule: any two determine the third; train = micro * gas * dp).
      field("train_batch_size", at(&Config::train_batch_size), "sequences per optimizer step over all data-parallel ranks")
          .range(1, kIntMax).no_default(),
      field("train_micro_batch_size_per_gpu", at(&Config::train_micro_batch_size_per_gpu),
            "sequences per rank per forward/backward").range(1, kIntMax).no_default(),
      field("gradient_accumulation_steps", at(&Config::gradient_accumulation_steps),
            "micro-batches accumulated per optimizer step").range(1, kIntMax).no_default(),
      field("steps_per_print", at(&Config::steps_per_print), "optimizer steps between progress lines").range(1, kIntMax),
      field("gradient_clipping", at(&Config::gradient_clipping), "max global gradient norm; 0 disables clipping")
          .range(0, kInf),
      field("max_nonfinite_steps", at(&Config::max_nonfinite_steps),
            "ours: stop the run (exit code 9) after this many steps in a row whose loss or gradient norm is not "
            "finite (with fp16 loss scaling only the loss counts: overflows are the scaler's); 0 = never stop")
          .range(0, kIntMax),
      field("comm_timeout_s", at(&Config::comm_timeout_s),
            "ours: watchdog: abort when a collective has not completed after this many seconds").range(0, kInf, true),
      field("wall_clock_breakdown", at(&Config::wall_clock_breakdown),
            "forward/backward/step timings in the step records, and a per-op profile"),
      field("train_steps", at(&Config::train_steps), "ours: optimizer steps to run").range(1, kIntMax).need(),
      field("seed", at(&Config::seed), "ours: seed for parameter init and data order"),

      // Optimizer (DeepSpeed "optimizer" section; FusedAdam defaults). DeepSpeed matches the type
      // ignoring case.
      field("optimizer.type", at(&Config::optimizer, &OC::type),
            "AdamW, or Adam (decoupled decay unless adam_w_mode=false)").ignore_case()
          .refuse_values({"Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion", "MuAdam", "MuAdamW",
                          "MuSGD", "Muon"},
                         "zero3d implements Adam and AdamW (DeepSpeed's FusedAdam)"),
      field("optimizer.params.lr", at(&Config::optimizer, &OC::lr), "base learning rate").range(0, kInf),
      field("optimizer.params.betas", at(&Config::optimizer, &OC::betas), "Adam moment decay rates [beta1, beta2]"),
      field("optimizer.params.eps", at(&Config::optimizer, &OC::eps), "Adam denominator epsilon").range(0, kInf, true),
      field("optimizer.params.weight_decay", at(&Config::optimizer, &OC::weight_decay),
            "weight decay (decoupled in AdamW mode)").range(0, kInf),
      field("optimizer.params.adam_w_mode", at(&Config::optimizer, &OC::adam_w_mode),
            "Adam only: true = decoupled decay (AdamW), false = L2 in the gradient"),
      field("optimizer.params.bias_correction", at(&Config::optimizer, &OC::bias_correction),
            "Adam bias correction of the moments"),

      // Scheduler (deepspeed/runtime/lr_schedules.py; params belong to the chosen type).
      field("scheduler.type", at(&Config::scheduler, &SC::type), "LR schedule; \"\" = constant lr").ignore_case()
          .refuse_values({"LRRangeTest", "OneCycle"}, "zero3d implements WarmupLR, WarmupDecayLR and WarmupCosineLR"),
      field("scheduler.params.warmup_min_lr", at(&Config::scheduler, &SC::warmup_min_lr), "lr at the start of warmup")
          .range(0, kInf).only_when("scheduler.type", {"WarmupLR", "WarmupDecayLR"}),
      field("scheduler.params.warmup_max_lr", at(&Config::scheduler, &SC::warmup_max_lr), "lr at the end of warmup")
          .range(0, kInf).only_when("scheduler.type", {"WarmupLR", "WarmupDecayLR"})
          .auto_from("optimizer.params.lr", [](const Lookup& get) { return get("optimizer.params.lr"); }),
      field("scheduler.params.warmup_num_steps", at(&Config::scheduler, &SC::warmup_num_steps),
            "warmup length in optimizer steps").range(0, kIntMax).only_when("scheduler.type", kWarmupSchedulers),
      field("scheduler.params.warmup_type", at(&Config::scheduler, &SC::warmup_type), "warmup curve")
          .only_when("scheduler.type", kWarmupSchedulers),
      field("scheduler.params.total_num_steps", at(&Config::scheduler, &SC::total_num_steps),
            "schedule length in optimizer steps").range(1, kIntMax).no_default().need()
          .only_when("scheduler.type", {"WarmupDecayLR", "WarmupCosineLR"})
          .auto_from("train_steps", [](const Lookup& get) { return get("train_steps"); }),
      field("scheduler.params.warmup_min_ratio", at(&Config::scheduler, &SC::warmup_min_ratio),
            "lr ratio at the start of warmup").range(0, 1).only_when("scheduler.type", {"WarmupCosineLR"}),
      field("scheduler.params.cos_min_ratio", at(&Config::scheduler, &SC::cos_min_ratio),
            "lr ratio at the end of the cosine decay").range(0, 1).only_when("scheduler.type", {"WarmupCosineLR"}),

      // Mixed precision (deepspeed/runtime/precision_config.py).
      field("fp16.enabled", at(&Config::fp16, &FC::enabled),
            "fp16 mixed precision (16-bit weights and gradients, fp32 master and Adam)"),
      field("fp16.loss_scale", at(&Config::fp16, &FC::loss_scale), "static loss scale; 0 = dynamic").range(0, kInf),
      field("fp16.initial_scale_power", at(&Config::fp16, &FC::initial_scale_power), "initial dynamic scale 2^power")
          .range(0, 1000),
      field("fp16.loss_scale_window", at(&Config::fp16, &FC::loss_scale_window),
            "steps without overflow before raising the scale").range(1, kIntMax),
      field("fp16.hysteresis", at(&Config::fp16, &FC::hysteresis), "overflows tolerated before lowering the scale")
          .range(1, kIntMax),
      field("fp16.consecutive_hysteresis", at(&Config::fp16, &FC::consecutive_hysteresis),
            "refill hysteresis after a good step"),
      field("fp16.min_loss_scale", at(&Config::fp16, &FC::min_loss_scale), "lower bound of the dynamic scale")
          .range(0, kInf, true),
      field("fp16.continue_at_min_scale", at(&Config::fp16, &FC::continue_at_min_scale),
            "ours: on an overflow at min_loss_scale skip the step and go on instead of stopping (DeepSpeed stops)"),
      field("bf16.enabled", at(&Config::bf16_enabled),
            "bf16 mixed precision (16-bit weights and gradients, fp32 master and Adam)"),

      // ZeRO (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig).
      field("zero_optimization.stage", at(&Config::zero, &ZC::stage),
            "0 off, 1 optimizer states, 2 +gradients, 3 +parameters").range(0, 3),
      field("zero_optimization.overlap_comm", at(&Config::zero, &ZC::overlap_comm),
            "overlap gradient reduction with backward; default: stage == 3 (DeepSpeed's rule)")
          .derived_default([](const Lookup& get) { return json(get("zero_optimization.stage") == 3); }),
      field("zero_optimization.reduce_bucket_size", at(&Config::zero, &ZC::reduce_bucket_size),
            "elements per gradient reduction (a message); parameters are sharded in buckets of the smaller of "
            "this and allgather_bucket_size; 0: one tensor at a time").range(0, kInf)
          .auto_from("model.d_model^2 (as the Hugging Face integration)",
                     [](const Lookup& get) { return json(d_model_of(get) * d_model_of(get)); }),
      field("zero_optimization.allgather_bucket_size", at(&Config::zero, &ZC::allgather_bucket_size),
            "elements per parameter all-gather after the step (stages 1-2; a message); 0: one tensor at a time")
          .range(0, kInf),
      field("zero_optimization.reduce_scatter", at(&Config::zero, &ZC::reduce_scatter),
            "reduce-scatter instead of allreduce for gradients"),
      field("zero_optimization.consistency_check_interval", at(&Config::zero, &ZC::consistency_check_interval),
            "ours: every N steps compare a hash of every replicated parameter across the dp group; 0 = off")
          .range(0, kIntMax),
      field("zero_optimization.stage3_prefetch_bucket_size", at(&Config::zero, &ZC::stage3_prefetch_bucket_size),
            "parameter elements gathered ahead of use (the next unit, when it fits)").range(0, kInf)
          .auto_from("0.9 * model.d_model^2 (as the Hugging Face integration)",
                     [](const Lookup& get) {
                       return json(static_cast<int64_t>(0.9 * double(d_model_of(get)) * double(d_model_of(get))));
                     }),
      field("zero_optimization.stage3_max_live_parameters", at(&Config::zero, &ZC::stage3_max_live_parameters),
            "gathered parameter elements kept at once (at least what one step needs)").range(0, kInf),
      field("zero_optimization.stage3_max_reuse_distance", at(&Config::zero, &ZC::stage3_max_reuse_distance),
            "keep a gathered unit if its next use is fewer than this many elements away").range(0, kInf),
      field("zero_optimization.stage3_param_persistence_threshold",
            at(&Config::zero, &ZC::stage3_param_persistence_threshold),
            "tensors smaller than this stay whole on every rank").range(0, kInf)
          .auto_from("10 * model.d_model (as the Hugging Face integration)",
                     [](const Lookup& get) { return json(10 * d_model_of(get)); }),

      // Offload (runtime/zero/offload_config.py; zero/offload.h): the optimizer state of stages 1-3, and
      // stage 3's parameter shards, in host memory or in swap files on NVMe.
      field("zero_optimization.offload_optimizer.device", offload_at(&ZC::offload_optimizer, &OFC::device),
            "where the fp32 master, exp_avg and exp_avg_sq of this rank's shard live: none (in the compute "
            "backend's memory), cpu (host memory; the host backend's state is there already), nvme (swap files "
            "under nvme_path, streamed through memory sub_group_size elements at a time); stages 1-3"),
      field("zero_optimization.offload_optimizer.nvme_path", offload_at(&ZC::offload_optimizer, &OFC::nvme_path),
            "device nvme: directory for the swap files (node-local NVMe; a run-scoped subdirectory is made and "
            "removed)"),
      field("zero_optimization.offload_optimizer.buffer_count", offload_at(&ZC::offload_optimizer, &OFC::buffer_count),
            "device nvme: sub-groups in memory at once (read ahead, being updated, being written back)")
          .range(2, 64),
      field("zero_optimization.offload_optimizer.ratio", offload_at(&ZC::offload_optimizer, &OFC::ratio),
            "the fraction of the optimizer state offloaded, in whole sub-groups from the start; the rest stays")
          .range(0, 1, true),
      field("zero_optimization.offload_param.device", offload_at(&ZC::offload_param, &OFC::device),
            "stage 3: where this rank's parameter shards live between gathers: none, cpu (host memory), nvme "
            "(a swap file under nvme_path, read ahead of each gather)"),
      field("zero_optimization.offload_param.nvme_path", offload_at(&ZC::offload_param, &OFC::nvme_path),
            "device nvme: directory for the parameter swap files"),
      field("zero_optimization.sub_group_size", at(&Config::zero, &ZC::sub_group_size),
            "offloaded optimizer state is read, updated and written back this many elements at a time")
          .range(1, kInf),
      field("aio.block_size", at(&Config::aio, &AioConfig::block_size),
            "bytes per swap-file request (transfers are split into blocks)").range(4096, kInf),
      field("aio.thread_count", at(&Config::aio, &AioConfig::thread_count), "I/O threads per swap file")
          .range(1, 64),

      // Activation checkpointing: DeepSpeed's section (deepspeed/runtime/activation_checkpointing/
      // config.py); `enabled` is ours (in DeepSpeed the model calls checkpoint() itself).
      field("activation_checkpointing.enabled", at(&Config::activation_checkpointing),
            "ours: recompute each block's forward in backward"),

      // Layout: dp = world_size / (tp_size * pp_size).
      field("tensor_parallel.tp_size", at(&Config::tp_size), "tensor-parallel group size (Megatron-style)")
          .range(1, kIntMax),
      field("pipeline_parallel.pp_size", at(&Config::pp_size), "pipeline stages (1F1B schedule)").range(1, kIntMax),

      // zero3d's own sections.
      field("model.vocab_size", at(&Config::model, &MC::vocab_size), "vocabulary size (token ids are below it)")
          .range(1, kIntMax).no_default().need(),
      field("model.make_vocab_size_divisible_by", at(&Config::model, &MC::make_vocab_size_divisible_by),
            "pad the embedding and LM head to a multiple of this many rows (Megatron's name; llm.c's 50304 is "
            "GPT-2's 50257 padded to 128); padded rows get no logit, and an export leaves them out")
          .range(1, kIntMax),
      field("model.seq_len", at(&Config::model, &MC::seq_len), "context length in tokens").range(1, kIntMax)
          .no_default().need(),
      field("model.n_layer", at(&Config::model, &MC::n_layer), "transformer blocks").range(1, kIntMax)
          .no_default().need(),
      field("model.n_head", at(&Config::model, &MC::n_head), "attention heads (must divide d_model)")
          .range(1, kIntMax).no_default().need(),
      field("model.d_model", at(&Config::model, &MC::d_model), "residual stream width").range(1, kIntMax)
          .no_default().need(),
      choice("model.arch", at(&Config::model, &MC::arch), {"gpt2", "llama"},
             "architecture preset: the defaults of model.norm, position, mlp, bias and tie_word_embeddings (gpt2: "
             "layernorm, learned, gelu, true, true; llama: rmsnorm, rope, swiglu, false, false)"),
      choice("model.norm", at(&Config::model, &MC::norm), {"layernorm", "rmsnorm"},
             "normalization: LayerNorm with bias (eps 1e-5) or RMSNorm (eps model.rms_norm_eps)")
          .derived_default([](const Lookup& get) { return json(get("model.arch") == "llama" ? "rmsnorm" : "layernorm"); }),
      field("model.rms_norm_eps", at(&Config::model, &MC::rms_norm_eps), "RMSNorm's epsilon (Hugging Face's name)")
          .range(0, kInf, true).only_when("model.norm", {"rmsnorm"}),
      choice("model.position", at(&Config::model, &MC::position), {"learned", "rope"},
             "positions: a learned embedding (wpe) or rotary embeddings on queries and keys")
          .derived_default([](const Lookup& get) { return json(get("model.arch") == "llama" ? "rope" : "learned"); }),
      field("model.rope_theta", at(&Config::model, &MC::rope_theta), "RoPE's base (Llama 3: 500000, Llama 2: 10000)")
          .range(0, kInf, true).only_when("model.position", {"rope"}),
      choice("model.rope_scaling.rope_type", rope_scaling_at(&RopeScaling::rope_type), {"default", "llama3"},
             "RoPE's frequency scaling (transformers' rope_scaling): default (none) or Llama 3.1's llama3 (the long "
             "wavelengths stretched by factor, the middle band blended); transformers' other types (linear, dynamic, "
             "yarn, longrope) are not implemented")
          .only_when("model.position", {"rope"}),
      field("model.rope_scaling.factor", rope_scaling_at(&RopeScaling::factor),
            "llama3: how much the long wavelengths are stretched")
          .range(0, kInf, true).only_when("model.rope_scaling.rope_type", {"llama3"}),
      field("model.rope_scaling.low_freq_factor", rope_scaling_at(&RopeScaling::low_freq_factor),
            "llama3: wavelengths above original_max_position_embeddings / low_freq_factor are stretched")
          .range(0, kInf, true).only_when("model.rope_scaling.rope_type", {"llama3"}),
      field("model.rope_scaling.high_freq_factor", rope_scaling_at(&RopeScaling::high_freq_factor),
            "llama3: wavelengths below original_max_position_embeddings / high_freq_factor are kept (must exceed "
            "low_freq_factor; between the two the frequency is blended)")
          .range(0, kInf, true).only_when("model.rope_scaling.rope_type", {"llama3"}),
      field("model.rope_scaling.original_max_position_embeddings",
            rope_scaling_at(&RopeScaling::original_max_position_embeddings),
            "llama3: the context the model was pretrained at, before the scaling")
          .range(1, kIntMax).only_when("model.rope_scaling.rope_type", {"llama3"}),
      choice("model.mlp", at(&Config::model, &MC::mlp), {"gelu", "swiglu"},
             "MLP: GELU (tanh approximation) or SwiGLU (silu(gate) * up, three matrices)")
          .derived_default([](const Lookup& get) { return json(get("model.arch") == "llama" ? "swiglu" : "gelu"); }),
      field("model.intermediate_size", at(&Config::model, &MC::intermediate_size),
            "the MLP's hidden width (Hugging Face's name)").range(1, kIntMax)
          .derived_default([](const Lookup& get) {
            const int d = static_cast<int>(get("model.d_model").get<int64_t>());
            return json(get("model.mlp") == "swiglu" ? swiglu_default_width(d) : 4 * d);
          }),
      field("model.num_key_value_heads", at(&Config::model, &MC::num_key_value_heads),
            "key/value heads (grouped-query attention; must divide n_head; n_head: multi-head, 1: multi-query)")
          .range(1, kIntMax).derived_default([](const Lookup& get) { return get("model.n_head"); }),
      field("model.bias", at(&Config::model, &MC::bias), "biases on the linear layers")
          .derived_default([](const Lookup& get) { return json(get("model.arch") == "gpt2"); }),
      field("model.tie_word_embeddings", at(&Config::model, &MC::tie_word_embeddings),
            "the LM head is the token embedding (else a matrix of its own, lm_head.weight)")
          .derived_default([](const Lookup& get) { return json(get("model.arch") == "gpt2"); }),
      field("data.train", at(&Config::data, &DC::train),
            "llm.c token files for training (uint16 or uint32 tokens): a file, a glob (\"data/train_*.bin\": its matches "
            "sorted) or a comma-separated list of files and globs, read as one set of sequences in that order")
          .non_empty().no_default().need().reads_files(Key::Files::list),
      field("data.val", at(&Config::data, &DC::val), "llm.c token files for validation, given as data.train; \"\" = none")
          .reads_files(Key::Files::list),
      field("data.val_interval", at(&Config::data, &DC::val_interval),
            "steps between validation passes; 0 = only at step 0 and at the last step").range(0, kIntMax),
      field("data.val_batches", at(&Config::data, &DC::val_batches), "micro-batches per validation pass")
          .range(1, kIntMax),
      field("data.tokenizer", at(&Config::data, &DC::tokenizer),
            "the tokenizer that made the token files: \"byte\", a Hugging Face tokenizer.json or a SentencePiece "
            "tokenizer.model (or a directory holding one); recorded in every checkpoint (the file copied beside it) for generate, eval and "
            "export; \"\" = unknown (generate then takes only --prompt-ids)")
          .reads_files(Key::Files::one, {"byte"}),
      field("run.max_minutes", at(&Config::max_minutes),
            "wall-time budget from start: checkpoint and exit 6 at the last step boundary where another step and "
            "a checkpoint still fit; 0 = none (under Slurm the job's end time is a budget too)").range(0, kInf),
      field("checkpoint.dir", at(&Config::checkpoint, &CC::dir), "checkpoint directory; \"\" = <run dir>/checkpoints"),
      field("checkpoint.init_from", at(&Config::checkpoint, &CC::init_from),
            "start from these weights instead of the seeded draw: a Hugging Face directory of a GPT2LMHeadModel or "
            "LlamaForCausalLM (config.json and model.safetensors or its shards, as the hub ships them or `zero3d ckpt "
            "export --format hf` writes them; config.json must describe this run's model), on any layout; a "
            "checkpoint that checkpoint.load resumes replaces them; \"\" = none")
          .reads_files(Key::Files::one),
      field("checkpoint.save_interval", at(&Config::checkpoint, &CC::save_interval),
            "steps between checkpoints (and one at the last step); 0 = none").range(0, kIntMax),
      field("checkpoint.keep_last", at(&Config::checkpoint, &CC::keep_last), "newest checkpoints kept; 0 = all")
          .range(0, kIntMax),
      field("checkpoint.async", at(&Config::checkpoint, &CC::async),
            "write checkpoints in the background: training waits only for a copy of this rank's state (needs "
            "MPI_THREAD_MULTIPLE; the run record says when it falls back to writing in place)"),
      choice("checkpoint.on_failure", at(&Config::checkpoint, &CC::on_failure), {"stop", "continue"},
             "a save that fails (disk full, I/O error, storage gone): stop the run (exit 7; the last committed "
             "checkpoint stays 'latest') or continue and try again at the next interval"),
      field("checkpoint.timeout_s", at(&Config::checkpoint, &CC::timeout_s),
            "a checkpoint save or load still running after this many seconds aborts the job (exit 3) naming where "
            "every rank is; 0 = derived: 3x its bytes at the last measured bandwidth, at least comm_timeout_s")
          .range(0, kInf),
      choice("comm.collectives", at(&Config::comm, &CM::collectives), {"auto", "mpi", "shm"},
             "ours: how all-reduce, reduce-scatter and all-gather on host memory move: through the node's shared "
             "memory (shm; groups whose ranks share a node, others use MPI), MPI's own collectives (mpi), or auto "
             "(shared memory from comm.shm_min_bytes up, MPI below; `zero3d bench comm` measures both)"),
      field("comm.shm_min_bytes", at(&Config::comm, &CM::shm_min_bytes),
            "ours: with comm.collectives auto, messages from this many bytes up go through shared memory")
          .range(0, kInf),
      field("comm.shm_chunk_bytes", at(&Config::comm, &CM::shm_chunk_bytes),
            "ours: shared-memory collectives move this many bytes per rank and round (the pipelining grain; each "
            "group maps 4 such slots per rank)")
          .range(4096, 1 << 30),
      field("comm.send_thread", at(&Config::comm, &CM::send_thread),
            "ours: point-to-point sends on host memory (the pipeline's activations and gradients) are polled by a "
            "thread of their own, so they advance while the sender computes (needs MPI_THREAD_MULTIPLE; OpenMPI "
            "moves a large message only inside MPI calls unless its shared-memory transport can read the sender's "
            "memory itself, CMA)"),
      choice("comm.device_collectives", at(&Config::comm, &CM::device_collectives), {"auto", "mpi"},
             "ours: how collectives, sends and receives on device memory (the CUDA backend) move: the device's own "
             "library, NCCL, where the build has it (auto), or MPI (mpi: handed to a CUDA-aware MPI, else staged "
             "through pinned host buffers). The run record's comm_device_buffers says which"),
      choice("compute.gemm", at(&Config::compute, &XC::gemm), {"auto", "onednn", "cblas"},
             "host GEMM library: oneDNN (ISA picked at run time), the CBLAS linked in (a site's tuned BLAS), or "
             "auto (oneDNN; weight gradients on OpenBLAS, made to run the kernels of the ISA level the host loops run)"),
      choice("compute.bf16_gemm", at(&Config::compute, &XC::bf16_gemm), {"auto", "on", "off"},
             "with bf16.enabled: GEMMs in bf16 with fp32 accumulation (on), in fp32 on the 16-bit weights "
             "widened (off), or auto (bf16 on a GPU, on its tensor cores, and on a CPU where oneDNN runs bf16 natively "
             "and faster than fp32: AMX, or AMD's avx512_bf16)"),
      choice("compute.activations", at(&Config::compute, &XC::activations), {"auto", "fp32", "bf16"},
             "ours: with bf16.enabled, the element type the activations and their gradients are stored in: bf16 "
             "(half the memory and bytes moved, the logits too; fp32 math and norm statistics, as DeepSpeed's bf16 "
             "and llm.c), fp32, or auto (bf16 on a GPU, fp32 on the host, whose loops are fp32)"),
      choice("compute.backend", at(&Config::compute, &XC::backend), {"auto", "host", "cuda", "kokkos"},
             "ours: the backend that runs the ops and GEMMs: host, cuda, kokkos (Kokkos's default execution space, "
             "GEMMs through Kokkos Kernels; in builds with Kokkos), or auto (cuda where it is built and a GPU is "
             "visible, else host). A command's --backend overrides it"),
      field("compute.lm_head_block_mib", at(&Config::compute, &XC::lm_head_block_mib),
            "ours: the LM head makes its logits (and the loss and dlogits from them) in row blocks of at most this "
            "many MiB, or 0: auto (a micro-batch's rows in one GEMM on a GPU, as llm.c and Megatron-LM; blocks of "
            "128 MiB on the host, whose memory is the run's). At least 256 rows a block")
          .range(0, kIntMax),
      choice("compute.isa", at(&Config::compute, &XC::isa), {"auto", "avx512", "avx2", "sse2", "generic"},
             "ours: the ISA level the host loops run at, and the most oneDNN's GEMMs use: auto (the ZERO3D_ISA "
             "environment variable when set, else the best level this CPU runs), or a level at or below it, to "
             "measure or test a lower level's machine on this one; a level the CPU does not run is refused"),
  };

  using MO = MonitorConfig;
  using CL = CommsLoggerConfig;
  using FP = FlopsProfilerConfig;
  for (Key k : {
           // DeepSpeed's flops profiler (profiling/config.py), measured per module (train/flops_profiler.h).
           field("flops_profiler.enabled", at(&Config::flops_profiler, &FP::enabled),
                 "at profile_step print params, MACs, FLOPs and measured latencies per module (DeepSpeed's "
                 "profile summary), and write them as \"profile\" records"),
           field("flops_profiler.profile_step", at(&Config::flops_profiler, &FP::profile_step),
                 "the step profiled, counted as DeepSpeed counts it: steps already done (1 profiles the second "
                 "step); -1 none").range(-1, kIntMax),
           field("flops_profiler.module_depth", at(&Config::flops_profiler, &FP::module_depth),
                 "deepest level of the module tree shown (0 model, 1 embedding/h/ln_f/lm_head, 2 blocks, 3 "
                 "ln_1/attn/ln_2/mlp); -1 all").range(-1, kIntMax),
           field("flops_profiler.top_modules", at(&Config::flops_profiler, &FP::top_modules),
                 "modules per depth in the aggregated profile").range(1, kIntMax),
           field("flops_profiler.detailed", at(&Config::flops_profiler, &FP::detailed), "print the per-module tree"),
           field("flops_profiler.output_file", at(&Config::flops_profiler, &FP::output_file),
                 "also write the profile to this file (rank 0); \"\" = printed only"),
           field("flops_profiler.recompute_fwd_factor", at(&Config::flops_profiler, &FP::recompute_fwd_factor),
                 "forwards recomputed per backward, counted in fwd+bwd FLOPS (1 with activation checkpointing)")
               .range(0, kInf),

           // Monitors and logs (DeepSpeed's monitor/config.py, comm/config.py, runtime/config.py).
           field("csv_monitor.enabled", at(&Config::csv_monitor, &MO::enabled),
                 "one CSV per metric (step,value) under output_path/job_name/, as DeepSpeed's csv_monitor"),
           field("csv_monitor.output_path", at(&Config::csv_monitor, &MO::output_path),
                 "directory of the CSV files; \"\" = the run dir"),
           field("csv_monitor.job_name", at(&Config::csv_monitor, &MO::job_name), "subdirectory of output_path"),
           field("comms_logger.enabled", at(&Config::comms_logger, &CL::enabled),
                 "per group and collective: calls, bytes, latency, algorithmic and bus bandwidth, printed at the end "
                 "and as \"comms\" records"),
           field("comms_logger.verbose", at(&Config::comms_logger, &CL::verbose),
                 "print every collective of rank 0 as it completes"),
           field("comms_logger.prof_all", at(&Config::comms_logger, &CL::prof_all),
                 "log every collective; false: only those in prof_ops"),
           field("comms_logger.prof_ops", at(&Config::comms_logger, &CL::prof_ops),
                 "collectives logged when prof_all is false: all_reduce, reduce_scatter, all_gather, broadcast, "
                 "send, recv"),
           field("comms_logger.debug", at(&Config::comms_logger, &CL::debug),
                 "DeepSpeed: the caller's name with each op; no effect here"),
           field("memory_breakdown", at(&Config::memory_breakdown),
                 "every steps_per_print: each rank's model states, buffers, activations and resident memory"),
       })
    keys.push_back(k);

  // checkpoint.load: one string, two members (the mode and the path).
  Key load;
  load.path = "checkpoint.load", load.kind = Kind::String, load.def = "none", load.nonempty = true;
  load.auto_is_value = true;
  load.doc = "\"none\", \"auto\" (the directory's latest, falling back to older valid ones) or a checkpoint file "
             "or directory";
  load.store = [](Config& c, const json& v) {
    const std::string s = v.get<std::string>();
    c.checkpoint.load = s == "none" ? LoadMode::none : s == "auto" ? LoadMode::latest : LoadMode::path;
    c.checkpoint.load_path = c.checkpoint.load == LoadMode::path ? s : "";
  };
  keys.push_back(load);

  Key provenance;  // config.json read back as a run config: its provenance is not an input
  provenance.path = "provenance", provenance.kind = Kind::Object, provenance.status = Status::no_effect;
  provenance.doc = "written by zero3d into config.json: where each value came from; ignored when read";
  keys.push_back(provenance);
  for (Key& k : deepspeed_keys()) keys.push_back(std::move(k));

  // DeepSpeed's activation-checkpointing knobs place checkpoints, never change a result: no effect here.
  for (Key k : {inert("activation_checkpointing.partition_activations", false,
                      "checkpointed activations are not sharded across tp (memory only)"),
                inert("activation_checkpointing.cpu_checkpointing", false, "checkpointed activations stay in memory"),
                inert("activation_checkpointing.contiguous_memory_optimization", false,
                      "checkpointed activations are kept per block"),
                inert("activation_checkpointing.number_checkpoints", nullptr,
                      "one checkpoint per transformer block (activation_checkpointing.enabled)"),
                inert("activation_checkpointing.synchronize_checkpoint_boundary", false,
                      "no synchronisation at checkpoints"),
                inert("activation_checkpointing.profile", false, "use wall_clock_breakdown for recompute timings")})
    keys.push_back(k);
  return keys;
}

Kind kind_of(const json& def) {
  if (def.is_boolean()) return Kind::Bool;
  if (def.is_number_integer()) return Kind::Integer;
  if (def.is_number()) return Kind::Number;
  if (def.is_string()) return Kind::String;
  if (def.is_object()) return Kind::Object;
  return Kind::Any;
}

}  // namespace

// A DeepSpeed key zero3d accepts only at `def` (and `also`): the one behaviour it has.
Key only(std::string path, json def, std::string instead, std::vector<json> also) {
  Key k;
  k.path = std::move(path), k.kind = kind_of(def), k.def = std::move(def), k.status = Status::fixed;
  k.instead = std::move(instead), k.accepted = std::move(also);
  return k;
}
// A DeepSpeed key that cannot change the result here: accepted at any value of its type.
Key inert(std::string path, json def, std::string why) {
  Key k;
  k.path = std::move(path), k.kind = kind_of(def), k.def = std::move(def), k.status = Status::no_effect;
  k.instead = std::move(why);
  if (k.kind == Kind::Integer) k.kind = Kind::Number;  // DeepSpeed takes 1e6 for sizes
  return k;
}
// A DeepSpeed key or section zero3d does not implement: present at all is an error.
Key refuse(std::string path, std::string instead) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Any, k.status = Status::refused, k.instead = std::move(instead);
  return k;
}

Key switched_off(std::string path, std::string instead) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Object, k.status = Status::fixed, k.instead = std::move(instead);
  return k;
}

Key Key::range(double l, double h, bool open) const {
  Key k = *this;
  k.lo = l, k.hi = h, k.lo_open = open;
  return k;
}
Key Key::need() const {
  Key k = *this;
  k.required = true;
  return k;
}
Key Key::no_default() const {
  Key k = *this;
  k.def = nullptr;
  return k;
}
Key Key::only_when(std::string key, std::vector<std::string> values) const {
  Key k = *this;
  k.when_key = std::move(key), k.when_values = std::move(values);
  return k;
}
Key Key::ignore_case() const {
  Key k = *this;
  k.nocase = true;
  return k;
}
Key Key::non_empty() const {
  Key k = *this;
  k.nonempty = true;
  return k;
}
Key Key::reads_files(Files f, std::vector<std::string> not_files) const {
  Key k = *this;
  k.files = f;
  k.words = std::move(not_files);
  return k;
}
Key Key::derived_default(std::function<json(const Lookup&)> f) const {
  Key k = *this;
  k.def = nullptr, k.def_fn = std::move(f);
  return k;
}
Key Key::auto_from(std::string how, std::function<json(const Lookup&)> f) const {
  Key k = *this;
  k.auto_doc = std::move(how), k.auto_fn = std::move(f);
  return k;
}
Key Key::also_accept(std::vector<json> values) const {
  Key k = *this;
  k.accepted.insert(k.accepted.end(), values.begin(), values.end());
  return k;
}

Key Key::refuse_values(std::vector<std::string> values, std::string what_instead) const {
  Key k = *this;
  k.refused_choices = std::move(values), k.instead = std::move(what_instead);
  return k;
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = build();
  return keys;
}

const Key* find_key(const std::string& path) {
  for (const Key& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

const std::set<std::string>& sections() {
  static const std::set<std::string> s = [] {
    std::set<std::string> out;
    for (const Key& k : schema())
      for (size_t i = k.path.find('.'); i != std::string::npos; i = k.path.find('.', i + 1))
        out.insert(k.path.substr(0, i));
    return out;
  }();
  return s;
}

const std::vector<std::string>& all_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out(sections().begin(), sections().end());
    for (const Key& k : schema()) out.push_back(k.path);
    return out;
  }();
  return names;
}

// zero/config.py: the deprecated booleans become offload devices; the stage-3 fields are named
// without "stage3_" in DeepSpeed's model and with it in its JSON aliases (both are accepted there).
const std::vector<Alias>& aliases() {
  auto same = [](const json& v) { return v; };
  auto cpu_if_true = [](const json& v) { return v == true ? json("cpu") : json(nullptr); };
  static const std::vector<Alias> a = {
      {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device", cpu_if_true},
      {"zero_optimization.cpu_offload_params", "zero_optimization.offload_param.device", cpu_if_true},
      {"zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.offload_optimizer.pin_memory", same},
      {"zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.offload_param.pin_memory", same},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save", same},
      {"zero_optimization.gather_16bit_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save", same},
      {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size", same},
      {"zero_optimization.param_persistence_threshold", "zero_optimization.stage3_param_persistence_threshold", same},
      {"zero_optimization.model_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold", same},
      {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters", same},
      {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance", same},
      {"zero_optimization.use_all_reduce_for_fetch_params", "zero_optimization.stage3_use_all_reduce_for_fetch_params",
       same},
      {"zero_optimization.offload_optimizer.pipeline", "zero_optimization.offload_optimizer.pipeline_read", same},
      {"zero_optimization.offload_optimizer.pipeline", "zero_optimization.offload_optimizer.pipeline_write", same},
      {"bfloat16", "bf16", same},
      // runtime/zero/config.py read_zero_config_deprecated: a boolean means stage 1 (true) or 0
      {"zero_optimization", "zero_optimization.stage", [](const json& v) { return json(v == true ? 1 : 0); }},
  };
  return a;
}

namespace {
// Integer value of a JSON number that is mathematically an integer (5e8 counts, as in pydantic).
bool as_integer(const json& v, int64_t& out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return out = v.get<int64_t>(), true;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    return out = static_cast<int64_t>(u), true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) >= 9.2e18) return false;
    return out = static_cast<int64_t>(d), true;
  }
  return false;
}

bool same_nocase(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}
}  // namespace

json normalise(const Key& k, const json& v) {
  switch (k.kind) {
    case Kind::Integer: {
      int64_t i = 0;
      if (!as_integer(v, i) || double(i) < k.lo || double(i) > k.hi) return nullptr;
      return i;
    }
    case Kind::Number: {
      if (!v.is_number()) return nullptr;
      double d = v.get<double>();
      if (!std::isfinite(d) || d < k.lo || (k.lo_open && d == k.lo) || d > k.hi) return nullptr;
      return d;
    }
    case Kind::Bool:
      return v.is_boolean() ? v : json(nullptr);
    case Kind::String:
      if (!v.is_string() || (k.nonempty && v.get<std::string>().empty())) return nullptr;
      return v;
    case Kind::Choice:
      if (!v.is_string()) return nullptr;
      for (const std::string& c : k.choices)
        if (c == v.get<std::string>() || (k.nocase && same_nocase(c, v.get<std::string>()))) return c;
      return nullptr;
    case Kind::Betas: {
      if (!v.is_array() || v.size() != 2) return nullptr;
      json out = json::array();
      for (const json& b : v) {
        if (!b.is_number()) return nullptr;
        double d = b.get<double>();
        if (!(d >= 0.0 && d < 1.0)) return nullptr;
        out.push_back(d);
      }
      return out;
    }
    case Kind::StringList:
      if (!v.is_array()) return nullptr;
      for (const json& s : v)
        if (!s.is_string()) return nullptr;
      return v;
    case Kind::Object:
      return v.is_object() ? v : json(nullptr);
    case Kind::Any:
      return v;
  }
  return nullptr;
}

std::string valid_text(const Key& k) {
  switch (k.kind) {
    case Kind::Integer:
      if (k.lo == 1 && (k.hi == kIntMax || k.hi == kInf)) return "a positive integer";
      if (k.lo == 0 && (k.hi == kIntMax || k.hi == kInf)) return "a non-negative integer";
      if (k.lo == -kInf && k.hi == kInf) return "an integer";
      return strprintf("an integer in [%s, %s]", fmt_num(k.lo).c_str(), fmt_num(k.hi).c_str());
    case Kind::Number:
      if (k.lo == -kInf && k.hi == kInf) return "a number";
      if (k.lo == 0 && k.hi == kInf) return k.lo_open ? "a number > 0" : "a number >= 0";
      return strprintf("a number in %s%s, %s]", k.lo_open ? "(" : "[", fmt_num(k.lo).c_str(), fmt_num(k.hi).c_str());
    case Kind::Bool:
      return "true or false";
    case Kind::String:
      return k.nonempty ? "a non-empty string" : "a string";
    case Kind::Choice: {
      std::vector<std::string> named;
      bool empty_ok = false;
      for (const auto& c : k.choices) {
        if (c.empty())
          empty_ok = true;
        else
          named.push_back(c);
      }
      std::string s = "one of " + quoted_list(named);
      if (empty_ok) s += " (or \"\" for none)";
      return s;
    }
    case Kind::Betas:
      return "a pair of numbers [beta1, beta2], each in [0, 1)";
    case Kind::StringList:
      return "a list of strings";
    case Kind::Object:
      return "an object {...}";
    case Kind::Any:
      return "any value";
  }
  return "?";
}

const char* status_text(Status s) {
  switch (s) {
    case Status::honoured:
      return "honoured";
    case Status::fixed:
      return "only the value zero3d implements";
    case Status::no_effect:
      return "accepted, no effect here";
    case Status::refused:
      return "refused";
  }
  return "?";
}

}  // namespace config_schema

std::string offload_device_name(OffloadDevice d) {
  return config_schema::names(static_cast<OffloadDevice*>(nullptr)).at(static_cast<size_t>(d));
}

}  // namespace zero3d
