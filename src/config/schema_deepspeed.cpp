// config/schema_deepspeed.cpp: DeepSpeed's config keys that zero3d does not honour, each with its
// verdict (see schema.h): accepted at the one behaviour zero3d has, accepted without effect here,
// or refused with what to use instead. Paths and defaults from DeepSpeed's runtime/config.py,
// runtime/constants.py, runtime/zero/config.py, runtime/zero/offload_config.py,
// runtime/precision_config.py, runtime/activation_checkpointing/config.py,
// runtime/swap_tensor/aio_config.py, monitor/config.py, nebula/config.py and the JSON reference
// (docs/_pages/config-json.md). The honoured keys are in schema.cpp.
#include "config/schema.h"

namespace zero3d::config_schema {

namespace {
const char* kPinned =
    "the host backend's memory is host memory already; offload on the CUDA backend is not built yet";
const char* kThreadIo =
    "swap files are read and written by aio.thread_count threads, each with one block request in flight (pread and "
    "pwrite in blocks of aio.block_size)";
const char* kNoGpu = "a GPU/kernel detail of DeepSpeed's implementation; zero3d's result does not depend on it";
const char* kNoPipeline =
    "zero3d's pipeline is pipeline_parallel.pp_size with 1F1B over whole transformer blocks; DeepSpeed's "
    "PipelineModule settings do not apply";
}  // namespace

std::vector<Key> deepspeed_keys() {
  return {
      // Top level (runtime/config.py, constants.py).
      inert("communication_data_type", nullptr,
            "gradients are reduced in the training precision; another type is refused"),
      inert("seq_parallel_communication_data_type", "fp32", "no sequence parallelism in zero3d"),
      only("prescale_gradients", false, "gradients are averaged over the data-parallel group after the sum"),
      only("gradient_predivide_factor", 1.0, "no pre-division: the sum is divided by the dp size once"),
      only("sparse_gradients", false, "embedding gradients are dense"),
      inert("zero_allow_untested_optimizer", false, "zero3d's ZeRO runs only its own Adam/AdamW, which are tested"),
      inert("zero_force_ds_cpu_optimizer", true, "the optimizer always runs on the host's Adam here"),
      only("dump_state", false, "use --help-config to print the resolved config"),
      only("disable_allgather", false, "ZeRO always all-gathers updated parameters"),
      inert("dataloader_drop_last", false, "zero3d's loader reads fixed-size batches from a token file"),
      only("graph_harvesting", false, "no CUDA graphs"),
      inert("use_data_before_expert_parallelism", false, "no mixture of experts in zero3d"),
      only("zero_optimization.legacy_stage1", false, "one ZeRO-1 implementation (the partitioned optimizer state)"),

      // Mixed precision (precision_config.py): the rest of fp16/bf16 is in schema.cpp.
      only("fp16.auto_cast", false, "inputs are not cast; fp16 weights and activations throughout"),
      only("fp16.fp16_master_weights_and_grads", false, "fp32 master weights and Adam state"),
      only("bf16.immediate_grad_update", false, "gradients are accumulated, then reduced once per step"),
      only("bf16.check_grad_overflow", false, "bf16 needs no loss scale: no overflow check"),
      // Megatron-DeepSpeed's configs carry bfloat16.loss_scale 1.0; DeepSpeed never read it.
      only("bf16.loss_scale", 1.0, "bf16 needs no loss scale (1.0, or 0, means none)", {0}),
      switched_off("amp", "NVIDIA apex AMP is not available: use fp16.enabled or bf16.enabled"),

      // ZeRO (zero/config.py DeepSpeedZeroConfig).
      only("zero_optimization.contiguous_gradients", true, "gradients always live in one contiguous buffer"),
      only("zero_optimization.allgather_partitions", true, "updated parameters are always all-gathered"),
      only("zero_optimization.use_multi_rank_bucket_allreduce", true, "buckets are reduced across all dp ranks"),
      only("zero_optimization.load_from_fp32_weights", true, "a resume loads the fp32 master weights"),
      inert("zero_optimization.elastic_checkpoint", false, "zero3d's checkpoints load on any layout anyway"),
      only("zero_optimization.round_robin_gradients", false, "gradients are partitioned contiguously"),
      inert("zero_optimization.ignore_unused_parameters", true, "every GPT parameter gets a gradient"),
      inert("zero_optimization.stage3_model_persistence_threshold", 9223372036854775807.0,
            "persistence is chosen per tensor (stage3_param_persistence_threshold)"),
      inert("zero_optimization.stage3_gather_16bit_weights_on_model_save", false,
            "checkpoints hold the whole model at any stage; `zero3d ckpt export` writes consolidated weights"),
      only("zero_optimization.stage3_use_all_reduce_for_fetch_params", false, "parameters are all-gathered"),
      inert("zero_optimization.module_granularity_threshold", 0, kNoGpu),
      only("zero_optimization.zero_hpz_partition_size", 1, "no hierarchical (ZeRO++ hpZ) partitioning"),
      only("zero_optimization.zero_quantized_weights", false, "no ZeRO++ weight quantization"),
      only("zero_optimization.zero_quantized_nontrainable_weights", false, "no ZeRO++ weight quantization"),
      only("zero_optimization.zero_quantized_gradients", false, "no ZeRO++ gradient quantization"),
      only("zero_optimization.zeropp_loco_param", nullptr, "no ZeRO++ LoCo"),
      only("zero_optimization.mics_shard_size", -1, "no MiCS: ZeRO shards over the whole dp group"),
      only("zero_optimization.mics_hierarchical_params_gather", false, "no MiCS"),
      inert("zero_optimization.memory_efficient_linear", true, kNoGpu),
      inert("zero_optimization.pipeline_loading_checkpoint", false, kNoGpu),
      inert("zero_optimization.override_module_apply", true, kNoGpu),
      inert("zero_optimization.log_trace_cache_warnings", false, kNoGpu),
      inert("zero_optimization.offload_optimizer.pin_memory", false, kPinned),
      inert("zero_optimization.offload_param.pin_memory", false, kPinned),
      inert("zero_optimization.offload_param.buffer_count", 5,
            "parameter shards are read straight into the gather slots the stage-3 pool already has"),
      inert("zero_optimization.offload_param.buffer_size", 100000000,
            "parameter shards are read straight into the gather slots, whatever a tensor's size"),
      inert("zero_optimization.offload_param.max_in_cpu", 1000000000,
            "with offload_param on nvme every shard element lives in the swap file (the page cache keeps what "
            "memory allows)"),
      inert("zero_optimization.offload_optimizer.pipeline_read", false,
            "offloaded state is always read ahead of the update (buffer_count buffers)"),
      inert("zero_optimization.offload_optimizer.pipeline_write", false,
            "offloaded state is always written back behind the update"),
      inert("zero_optimization.offload_optimizer.fast_init", false,
            "swap files are preallocated: unwritten state reads as zeros, so initialisation is always fast"),

      // Optimizer and scheduler params zero3d's Adam and schedules do not take.
      refuse("optimizer.params.max_grad_norm",
             "apex's in-optimizer clipping, which DeepSpeed refuses too: set the top-level gradient_clipping"),
      only("optimizer.params.amsgrad", false, "Adam without AMSGrad (DeepSpeed's FusedAdam refuses it too)"),
      inert("optimizer.params.torch_adam", false, "zero3d's own Adam kernel, bitwise the same update"),
      inert("optimizer.params.fused", true, "zero3d's own Adam kernel"),
      only("scheduler.params.last_batch_iteration", -1,
           "a resumed run's schedule position comes from the checkpoint's optimizer step"),

      // Asynchronous I/O (swap_tensor/aio_config.py): NVMe offload's engine.
      inert("aio.queue_depth", 8, kThreadIo),
      inert("aio.intra_op_parallelism", 1, kThreadIo),
      inert("aio.single_submit", false, kThreadIo),
      inert("aio.overlap_events", true, kThreadIo),
      inert("aio.use_gds", false, "no GPUDirect Storage: swap transfers go through host memory"),

      // DeepSpeed's checkpoint section, beside zero3d's own checkpoint keys.
      inert("checkpoint.tag_validation", "Warn",
            "zero3d checkpoints carry the layout and a checksum per dataset, which every load verifies"),
      inert("checkpoint.load_universal", false, "every zero3d checkpoint loads on any layout (universal)"),
      only("checkpoint.use_node_local_storage", false, "checkpoints are one parallel-HDF5 file on a shared path"),
      inert("checkpoint.parallel_write.pipeline_stage", false, "every rank writes its slice collectively anyway"),
      only("data_types.grad_accum_dtype", nullptr, "gradients accumulate in the training precision"),

      // Monitors and logging for libraries zero3d does not have.
      inert("wandb.enabled", false, "no Weights & Biases client in zero3d: use csv_monitor or metrics.jsonl"),
      inert("wandb.group", nullptr, "no Weights & Biases client"),
      inert("wandb.team", nullptr, "no Weights & Biases client"),
      inert("wandb.project", "deepspeed", "no Weights & Biases client"),
      inert("comet.enabled", false, "no Comet client in zero3d: use csv_monitor or metrics.jsonl"),
      inert("comet.samples_log_interval", 100, "no Comet client"),
      inert("comet.project", nullptr, "no Comet client"),
      inert("comet.workspace", nullptr, "no Comet client"),
      inert("comet.api_key", nullptr, "no Comet client"),
      inert("comet.experiment_name", nullptr, "no Comet client"),
      inert("comet.experiment_key", nullptr, "no Comet client"),
      inert("comet.online", nullptr, "no Comet client"),
      inert("comet.mode", nullptr, "no Comet client"),
      inert("nebula.enabled", false, "no Nebula service: zero3d writes parallel-HDF5 checkpoints"),
      inert("nebula.persistent_storage_path", nullptr, "no Nebula service"),
      inert("nebula.persistent_time_interval", 100, "no Nebula service"),
      inert("nebula.num_of_version_in_retention", 2, "no Nebula service"),
      inert("nebula.enable_nebula_load", true, "no Nebula service"),
      inert("nebula.load_path", nullptr, "no Nebula service"),

      switched_off("tensorboard",
                   "zero3d writes no TensorBoard event files: use csv_monitor (DeepSpeed's CSV layout) or "
                   "metrics.jsonl"),

      // Whole features zero3d does not have: accepted while disabled, refused when enabled.
      switched_off("elasticity", "no elastic training: fix the batch keys for the layout you run"),
      switched_off("autotuning", "no autotuner: run jobscripts/sweep.sh for a scaling study"),
      switched_off("curriculum_learning", "no curriculum learning (data_efficiency)"),
      switched_off("data_efficiency", "no data-efficiency pipeline: zero3d reads a token file in order"),
      switched_off("progressive_layer_drop", "no progressive layer drop"),
      switched_off("eigenvalue", "no Hessian eigenvalue estimation"),
      switched_off("hybrid_engine", "no RLHF hybrid engine"),
      switched_off("quantize_training", "no quantization-aware training"),
      refuse("compression_training", "no compression library (quantization, pruning, distillation)"),
      refuse("sparse_attention", "attention is dense causal attention"),
      only("pipeline.stages", "auto", kNoPipeline),
      only("pipeline.partition", "best", kNoPipeline),
      only("pipeline.seed_layers", false, kNoPipeline),
      only("pipeline.activation_checkpoint_interval", 0, kNoPipeline),
      inert("pipeline.pipe_partitioned", true, kNoPipeline),
      inert("pipeline.grad_partitioned", true, kNoPipeline),
      refuse("weight_quantization", "no weight quantization"),
  };
}

}  // namespace zero3d::config_schema
