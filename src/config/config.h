// config/config.h: one run's configuration, resolved from a JSON file (+ a DeepSpeed config
// overlay, + --set overrides) into typed values. DeepSpeed's key names and code defaults wherever
// DeepSpeed has the concept; our own sections are model, data, checkpoint, compute, run.
// Invariant: a member's initializer here is its key's default, and the key's one schema entry
// (config/schema.cpp) holds everything else (path, range, doc, where it applies, this member).
// Every DeepSpeed key is in the schema: honoured, accepted at the one value we implement, accepted
// without effect (listed at start), or refused naming what to use; an unknown key is an error
// naming the nearest valid key. Nothing is silently ignored.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero3d {

// RoPE's frequency scaling (model.rope_scaling.*, transformers' rope_scaling): "default" turns pair i
// by f_i = theta^(-2i/hd); Llama 3.1's "llama3" stretches the long wavelengths by `factor` and blends
// the middle band (kernels/math/rope.h). The numbers apply to "llama3" only; their defaults are
// Llama 3.1's.
struct RopeScaling {
  std::string rope_type = "default";  // "default" | "llama3"
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// The architecture as data: GPT-2 (LayerNorm, learned positions, GELU MLP, biases, tied LM head)
// and the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases, untied head)
// are two settings of the same keys; model.arch picks their defaults.
struct ModelConfig {
  int vocab_size = 0;  // the tokenizer's: token ids are below it
  int seq_len = 0;
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;
  int make_vocab_size_divisible_by = 1;  // embedding rows: vocab_size rounded up to a multiple of it
  std::string arch = "gpt2";         // "gpt2" | "llama": the defaults of the keys below
  std::string norm = "layernorm";    // "layernorm" (eps 1e-5, with bias) | "rmsnorm"
  double rms_norm_eps = 1e-5;
  std::string position = "learned";  // "learned" (wpe) | "rope"
  double rope_theta = 500000.0;
  RopeScaling rope_scaling{};
  std::string mlp = "gelu";          // "gelu" (tanh approximation) | "swiglu"
  int intermediate_size = 0;         // the MLP's hidden width; 0: gelu 4 d_model, swiglu Meta's rule
  int num_key_value_heads = 0;       // 0: n_head (multi-head attention)
  bool bias = true;                  // biases on the linear layers
  bool tie_word_embeddings = true;   // the LM head is the token embedding

  // Rows of the embedding (and LM head); rows >= vocab_size are padding that no logit comes from.
  int padded_vocab() const {
    return (vocab_size + make_vocab_size_divisible_by - 1) / make_vocab_size_divisible_by * make_vocab_size_divisible_by;
  }
  int head_dim() const { return d_model / n_head; }
  int kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : n_head; }
  int ffn_hidden() const;  // intermediate_size, or its default for this MLP
  bool rmsnorm() const { return norm == "rmsnorm"; }
  bool rope() const { return position == "rope"; }
  bool swiglu() const { return mlp == "swiglu"; }
};
// Meta's Llama rule for the SwiGLU width: 2/3 of 4 d_model, rounded up to a multiple of 256.
int swiglu_default_width(int d_model);
// The architecture keys (all but the shape) as a JSON object, and back: what a checkpoint records
// beside the shape. A missing key keeps m's value (a checkpoint older than these keys is GPT-2's).
nlohmann::json architecture_of(const ModelConfig& m);
void set_architecture(ModelConfig& m, const nlohmann::json& arch);

struct DataConfig {
  std::string train;      // llm.c token file
  std::string val;        // optional ("" = no validation)
  int val_interval = 0;   // steps between validation passes; 0 = only at step 0 and the last step
  int val_batches = 8;    // micro-batches per validation pass
  std::string tokenizer;  // "byte", a tokenizer file, or "" (unknown): recorded with checkpoints
};

enum class Precision { fp32, fp16, bf16 };
enum class OptimizerType { AdamW, Adam };  // Adam: decoupled decay unless adam_w_mode=false
enum class SchedulerType { none, WarmupLR, WarmupDecayLR, WarmupCosineLR };
enum class WarmupType { log, linear };
enum class LoadMode { none, latest, path };  // checkpoint.load: "none", "auto", a file or directory

const char* name_of(Precision p);
const char* name_of(OptimizerType t);
const char* name_of(SchedulerType t);  // "" for none

struct OptimizerConfig {
  OptimizerType type = OptimizerType::AdamW;
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool adam_w_mode = true;
  bool bias_correction = true;
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;  // none: constant lr
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  int total_num_steps = 0;          // WarmupDecayLR, WarmupCosineLR
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 0.0001;    // WarmupCosineLR
};

// zero_optimization.offload_optimizer / offload_param (DeepSpeed's runtime/zero/offload_config.py):
// where the optimizer state, or stage 3's parameter shards, live between uses (zero/offload.h).
enum class OffloadDevice { none, cpu, nvme };
std::string offload_device_name(OffloadDevice d);  // as a config spells it: "none", "cpu", "nvme"
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;       // nvme: the directory for this run's swap files (one per rank)
  int buffer_count = 4;        // optimizer on nvme: sub-groups in memory at once
  double ratio = 1.0;          // optimizer: the fraction of the state offloaded (the rest stays)
};

struct ZeroConfig {  // zero_optimization.*, DeepSpeed's names and defaults
  int stage = 0;
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  bool reduce_scatter = true;  // false: all-reduce, then keep the shard
  int consistency_check_interval = 0;  // ours: steps between replica hash checks; 0 = off
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t sub_group_size = 1000000000;  // offloaded optimizer state streams through memory this much at a time
  OffloadConfig offload_optimizer, offload_param;
};

// aio.*: DeepSpeed's asynchronous I/O settings (swap_tensor/aio_config.py), used by NVMe offload.
struct AioConfig {
  int64_t block_size = 1048576;  // bytes per request: transfers are split into blocks of this size
  int thread_count = 1;          // I/O threads per swap file
};

// fp16.*: DeepSpeed's names and defaults (deepspeed/runtime/precision_config.py DeepSpeedFP16Config).
// loss_scale > 0: static scale; 0: dynamic, starting at 2^initial_scale_power. See zero/loss_scaler.h.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;            // 0 = dynamic loss scaling
  int initial_scale_power = 16;     // dynamic: initial scale 2^power
  int loss_scale_window = 1000;     // dynamic: clean steps before the scale is doubled
  int hysteresis = 2;               // dynamic: overflows absorbed before the scale is halved
  bool consecutive_hysteresis = false;  // refill hysteresis on every clean step, not only on growth
  double min_loss_scale = 1;        // dynamic: floor of the scale
  bool continue_at_min_scale = false;  // ours; parsed in config.cpp by the lead. true: an overflow at
                                       // min_loss_scale skips the step instead of stopping the run
};

struct CheckpointConfig {
  std::string dir;  // "" = <run dir>/checkpoints
  int save_interval = 0;
  int keep_last = 0;
  LoadMode load = LoadMode::none;
  std::string load_path;  // LoadMode::path: a checkpoint file, or a directory meaning its 'latest' 
  std::string init_from;  // a Hugging Face directory to start from instead of the seeded draw ("" = none)
  bool async = true;             // write in the background (ckpt/writer.h), where MPI allows threads
  std::string on_failure = "stop";  // a save that fails (disk full, I/O error): "stop" or "continue"
  double timeout_s = 0;          // a save or load longer than this aborts (exit 3); 0 = from size and bandwidth
};

// compute.*: how the host computes (ours).
struct ComputeConfig {
  std::string gemm = "auto";       // "auto", "onednn", "cblas" (kernels/host/gemm.h)
  std::string bf16_gemm = "auto";  // with bf16: "auto", "on", "off"
  std::string activations = "auto";  // with bf16: "auto", "fp32", "bf16" (model/gpt.h gpt_options)
  std::string isa = "auto";        // the host loops' level: "auto" (ZERO3D_ISA, else the best), "avx512", ...
  std::string backend = "auto";    // "auto", "host", "cuda", "kokkos" (kernels/make_backend.cpp); --backend wins
  int lm_head_block_mib = 0;       // the LM head's logits per row block, MiB; 0: auto (model/gpt.h gpt_options)

  // The backend a command builds: its --backend (`flag`) when given, else compute.backend.
  std::string backend_for(const std::string& flag) const { return flag.empty() ? backend : flag; }
};

// comm.*: how data collectives move (ours; parallel/comm.h CollectiveImpl, shm_collectives.h).
struct CommConfig {
  std::string collectives = "auto";   // "auto", "mpi", "shm"
  int64_t shm_min_bytes = 65536;      // auto: shared memory from this message size up
  int64_t shm_chunk_bytes = 262144;   // shared memory: bytes a rank publishes per round
  bool send_thread = true;            // point-to-point sends progress on a thread of their own
  std::string device_collectives = "auto";  // device buffers: "auto" (NCCL where built) or "mpi"
};

// DeepSpeed's monitors and logs (monitor/config.py, comm/config.py).
struct MonitorConfig {  // csv_monitor.*: one CSV per metric under output_path/job_name/
  bool enabled = false;
  std::string output_path;  // "" = the run dir
  std::string job_name = "DeepSpeedJobName";
};
struct FlopsProfilerConfig {  // flops_profiler.* (profiling/config.py), DeepSpeed's defaults
  bool enabled = false;
  int profile_step = 1;               // steps done before the profiled one (DeepSpeed's count); -1 none
  int module_depth = -1;              // deepest module level shown; -1: all
  int top_modules = 1;                // modules per depth in the aggregated profile
  bool detailed = true;               // the per-module tree
  std::string output_file;            // "" = printed only
  double recompute_fwd_factor = 0.0;  // forwards recomputed in backward (activation checkpointing: 1)
};
struct CommsLoggerConfig {  // comms_logger.*
  bool enabled = false;
  bool verbose = false;  // print every collective as it completes
  bool prof_all = true;  // every collective; false: only prof_ops
  bool debug = false;    // DeepSpeed: the caller's name with each op (no effect here)
  std::vector<std::string> prof_ops;
};

struct Config {
  // batch: train_batch_size = micro * gradient_accumulation_steps * dp (validated)
  int train_batch_size = 0;
  int train_micro_batch_size_per_gpu = 0;
  int gradient_accumulation_steps = 0;
  int steps_per_print = 10;
  double gradient_clipping = 0.0;
  int max_nonfinite_steps = 3;  // ours: consecutive non-finite steps before a stop (exit 9); 0 = never
  bool wall_clock_breakdown = false;
  int train_steps = 0;
  uint64_t seed = 1234;
  int tp_size = 1;
  int pp_size = 1;
  ZeroConfig zero;
  AioConfig aio;
  double comm_timeout_s = 600;  // ours: the collective watchdog's deadline
  double max_minutes = 0;       // ours (run.max_minutes): wall-time budget; 0 = none
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  Fp16Config fp16;
  bool bf16_enabled = false;
  bool activation_checkpointing = false;  // activation_checkpointing.enabled (ours)
  Precision precision = Precision::fp32;  // from fp16.enabled / bf16.enabled
  CheckpointConfig checkpoint;
  ComputeConfig compute;
  CommConfig comm;
  MonitorConfig csv_monitor;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  bool memory_breakdown = false;  // per-rank memory every steps_per_print

  nlohmann::json resolved;    // every key with its value after defaults: written to the run dir
  nlohmann::json provenance;  // key -> where its value came from (a file, --set, default, derived, auto)
  std::vector<std::string> notices;  // one line each, printed at start (keys accepted without effect)

  // Whether the CUDA backend's GEMMs run in bf16 (tensor cores, fp32 accumulation): bf16 mixed
  // precision unless compute.bf16_gemm is "off". The host's rule differs (app/train.cpp).
  bool cuda_bf16_gemm() const { return precision == Precision::bf16 && compute.bf16_gemm != "off"; }
};

struct ConfigSources {
  std::string config_file;               // the run config (required)
  std::string deepspeed_file;            // optional DeepSpeed config overlaid on it
  std::vector<std::string> overrides;    // "a.b=value", applied last, in order
  std::string preset_root = "";          // a preset's tree (config/presets.h): the run config's relative
                                         // file paths are taken from it; "" = the working directory
                                         // (initialized: `{file, ds, overrides}` leaves it out)
};

// Read, overlay, override, validate and resolve. `world_size` is the number of ranks, for the
// batch-size and layout checks. Throws UserError with one line naming the file/key and what is valid.
Config load_config(const ConfigSources& sources, int world_size);

// The schema as text, one key a line: key, what it accepts, default, its status (honoured, only
// one value, no effect here, refused) and meaning. For `--help-config`.
std::string describe_config_keys();

// A resolved config as text, one key a line: key = value (where it came from). For
// `zero3d train CONFIG --help-config`.
std::string describe_resolved(const Config& c);

}  // namespace zero3d
