// Config loading: defaults, DeepSpeed batch arithmetic, --set overrides, the DeepSpeed overlay,
// and the one-line errors (unknown key with suggestion, not-yet-supported key, bad JSON position,
// missing file, wrong type); the shipped input/*.json must load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "config/config.h"
#include "core/check.h"

using namespace zero3d;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zero3d_config_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::string file = path + "/" + name;
    std::ofstream(file) << text;
    return file;
  }
};

// The smallest valid run config, with room for extra top-level members.
std::string minimal(const std::string& extra = "") {
  return R"({
  "train_micro_batch_size_per_gpu": 4,
  "train_steps": 10,
  "model": {"vocab_size": 256, "seq_len": 32, "n_layer": 2, "n_head": 4, "d_model": 64},
  "data": {"train": "input/data/train.bin"})" +
         (extra.empty() ? "" : ",\n  " + extra) + "\n}\n";
}

// The UserError text thrown by `f`, or "" when it does not throw.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "error is not one line: " << what;
    return what;
  }
  return "";
}

std::string load_error(const std::string& file, std::vector<std::string> overrides = {}, int world = 1,
                       const std::string& ds = "") {
  return error_of([&] { load_config({file, ds, std::move(overrides)}, world); });
}

// A preset found by name (config/presets.h): the file paths it sets itself are its tree's; what
// --set gives, absolute paths and the tokenizer's "byte" stay as written; a user's file is as written.
TEST(Config, PresetPathsAreItsTrees) {
  TempDir dir;
  ConfigSources src;
  src.config_file = dir.write("preset.json", R"({
  "train_micro_batch_size_per_gpu": 4, "train_steps": 10,
  "model": {"vocab_size": 256, "seq_len": 32, "n_layer": 2, "n_head": 4, "d_model": 64},
  "data": {"train": "input/a.bin, /abs/b.bin,input/c_*.bin", "tokenizer": "byte"},
  "checkpoint": {"init_from": "hf/gpt2"}
})");
  src.preset_root = "/tree";
  src.overrides = {"data.val=input/val.bin"};
  const Config c = load_config(src, 1);
  EXPECT_EQ(c.data.train, "/tree/input/a.bin, /abs/b.bin,/tree/input/c_*.bin");
  EXPECT_EQ(c.data.val, "input/val.bin");
  EXPECT_EQ(c.data.tokenizer, "byte");
  EXPECT_EQ(c.checkpoint.init_from, "/tree/hf/gpt2");
  src.preset_root = "";
  EXPECT_EQ(load_config(src, 1).data.train, "input/a.bin, /abs/b.bin,input/c_*.bin");
}

TEST(Config, DefaultsFollowDeepSpeed) {
  TempDir dir;
  Config c = load_config({dir.write("run.json", minimal()), "", {}}, 1);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.optimizer.type, OptimizerType::AdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_TRUE(c.optimizer.bias_correction);
  EXPECT_EQ(c.scheduler.type, SchedulerType::none);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_EQ(c.tp_size, 1);
  EXPECT_EQ(c.pp_size, 1);
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.data.val_interval, 0);
  EXPECT_EQ(c.data.val_batches, 8);
  EXPECT_EQ(c.checkpoint.dir, "");
  EXPECT_EQ(c.checkpoint.load, LoadMode::none);

  // The resolved JSON holds every key with its value, derived batch values included.
  const nlohmann::json& r = c.resolved;
  EXPECT_EQ(r["train_batch_size"], 4);
  EXPECT_EQ(r["gradient_accumulation_steps"], 1);
  EXPECT_EQ(r["fp16"]["enabled"], false);
  EXPECT_EQ(r["fp16"]["initial_scale_power"], 16);
  EXPECT_EQ(r["fp16"]["loss_scale_window"], 1000);
  EXPECT_EQ(r["fp16"]["hysteresis"], 2);
  EXPECT_EQ(r["bf16"]["enabled"], false);
  EXPECT_EQ(r["zero_optimization"]["stage"], 0);
  EXPECT_EQ(r["zero_optimization"]["reduce_bucket_size"], 500000000);
  EXPECT_EQ(r["zero_optimization"]["allgather_bucket_size"], 500000000);
  EXPECT_EQ(r["zero_optimization"]["stage3_prefetch_bucket_size"], 50000000);
  EXPECT_EQ(r["zero_optimization"]["stage3_max_live_parameters"], 1000000000);
  EXPECT_EQ(r["zero_optimization"]["stage3_max_reuse_distance"], 1000000000);
  EXPECT_EQ(r["zero_optimization"]["stage3_param_persistence_threshold"], 100000);
  EXPECT_EQ(r["zero_optimization"]["overlap_comm"], false);  // DeepSpeed: true only for stage 3
  EXPECT_FALSE(r["zero_optimization"].contains("contiguous_gradients"));  // DeepSpeed keys we only accept: when given
  EXPECT_EQ(r["tensor_parallel"]["tp_size"], 1);
  EXPECT_EQ(r["model"]["d_model"], 64);
  EXPECT_EQ(r["optimizer"]["params"]["betas"], nlohmann::json::array({0.9, 0.999}));
  EXPECT_EQ(r["scheduler"]["type"], "");
  EXPECT_FALSE(r["scheduler"].contains("params"));  // no scheduler: no scheduler params
  EXPECT_EQ(r["checkpoint"]["dir"], "");
}

TEST(Config, ResolvedConfigLoadsBackToItself) {
  TempDir dir;
  Config a = load_config(
      {dir.write("run.json", minimal()), "", {"scheduler.type=WarmupDecayLR", "scheduler.params.total_num_steps=10"}},
      1);
  Config b = load_config({dir.write("resolved.json", a.resolved.dump(2)), "", {}}, 1);
  EXPECT_EQ(a.resolved, b.resolved);
}

TEST(Config, BatchArithmeticFollowsDeepSpeed) {
  TempDir dir;
  auto load = [&](const std::string& batch, int world) {
    std::string text = R"({"train_steps": 1, "model": {"vocab_size": 8, "seq_len": 8, "n_layer": 1, "n_head": 1,
      "d_model": 8}, "data": {"train": "t.bin"})" +
                       batch + "}";
    return load_config({dir.write("b.json", text), "", {}}, world);
  };
  // micro only: gas = 1, train = micro * dp
  Config c = load(R"(, "train_micro_batch_size_per_gpu": 4)", 2);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  // train only: gas = 1, micro = train / dp
  c = load(R"(, "train_batch_size": 12)", 3);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  // train + micro -> gas
  c = load(R"(, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  // train + gas -> micro
  c = load(R"(, "train_batch_size": 32, "gradient_accumulation_steps": 2)", 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  // micro + gas -> train
  c = load(R"(, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3)", 1);
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_EQ(c.resolved["train_batch_size"], 6);
  // all three, consistent
  c = load(R"(, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4)", 2);
  EXPECT_EQ(c.train_batch_size, 16);

  // all three, inconsistent: the message shows the product
  std::string e = error_of([&] {
    load(R"(, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2)", 1);
  });
  EXPECT_THAT(e, HasSubstr("b.json: train_batch_size 64 != train_micro_batch_size_per_gpu 8 * "
                           "gradient_accumulation_steps 2 * data-parallel size 1 = 16"));
  // not divisible
  e = error_of([&] { load(R"(, "train_batch_size": 30, "train_micro_batch_size_per_gpu": 8)", 1); });
  EXPECT_THAT(e, HasSubstr("train_batch_size 30 is not a multiple of train_micro_batch_size_per_gpu 8"));
  // neither train nor micro
  e = error_of([&] { load(R"(, "gradient_accumulation_steps": 2)", 1); });
  EXPECT_THAT(e, HasSubstr("set train_batch_size or train_micro_batch_size_per_gpu"));
  e = error_of([&] { load("", 1); });
  EXPECT_THAT(e, HasSubstr("set train_batch_size or train_micro_batch_size_per_gpu"));
}

TEST(Config, OverridesSetNumbersBoolsStringsArrays) {
  TempDir dir;
  std::string file = dir.write("run.json", minimal());
  Config c = load_config(
      {file,
       "",
       {"optimizer.params.lr=3e-4", "train_steps=77", "wall_clock_breakdown=true", "optimizer.params.betas=[0.8, 0.9]",
        "data.val=input/data/val.bin", "scheduler.type=WarmupCosineLR", "scheduler.params.total_num_steps=77",
        "scheduler.params.warmup_type=\"linear\"", "optimizer.type=Adam", "optimizer.params.adam_w_mode=false",
        "seed=7", "fp16.enabled=false", "optimizer.params.lr=5e-4"}},
      1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 5e-4);  // applied in order: the last one wins
  EXPECT_EQ(c.train_steps, 77);
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.betas[1], 0.9);
  EXPECT_EQ(c.data.val, "input/data/val.bin");  // not JSON: taken as a raw string
  EXPECT_EQ(c.scheduler.type, SchedulerType::WarmupCosineLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 77);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::linear);  // quoted JSON string
  EXPECT_EQ(c.optimizer.type, OptimizerType::Adam);
  EXPECT_FALSE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.resolved["optimizer"]["params"]["lr"], 5e-4);

  // a whole section can be set too
  c = load_config({file, "", {R"(model={"vocab_size": 16, "seq_len": 8, "n_layer": 1, "n_head": 2, "d_model": 8})"}},
                  1);
  EXPECT_EQ(c.model.vocab_size, 16);

  EXPECT_THAT(load_error(file, {"optimizer.params.lr"}), HasSubstr("malformed override '--set optimizer.params.lr'"));
  EXPECT_THAT(load_error(file, {"=3"}), HasSubstr("malformed override"));
  EXPECT_THAT(load_error(file, {"optimizer.params.betaz=[0.9,0.9]"}),
              HasSubstr("--set optimizer.params.betaz=[0.9,0.9]: unknown config key 'optimizer.params.betaz' "
                        "(did you mean 'optimizer.params.betas'?)"));
  EXPECT_THAT(load_error(file, {"model.n_head=four"}),
              HasSubstr("--set model.n_head=four: model.n_head must be a positive integer, got \"four\""));
  EXPECT_THAT(load_error(file, {"wall_clock_breakdown=yes"}),
              HasSubstr("wall_clock_breakdown must be true or false, got \"yes\""));
}

TEST(Config, DeepSpeedFileOverlaysRunConfig) {
  TempDir dir;
  std::string run =
      dir.write("run.json", minimal(R"("optimizer": {"type": "AdamW", "params": {"lr": 0.1, "eps": 1e-6}})"));
  std::string ds = dir.write("ds.json", R"({
    "train_batch_size": 16, "gradient_accumulation_steps": 4,
    "optimizer": {"params": {"lr": 2e-4, "weight_decay": 0.0}},
    "fp16": {"enabled": false}, "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e8}
  })");
  Config c = load_config({run, ds, {}}, 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-4);   // DeepSpeed file wins
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);  // merged, not replaced
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.resolved["zero_optimization"]["reduce_bucket_size"], 500000000);  // 5e8 is an integer

  // overrides go on top of both
  c = load_config({run, ds, {"optimizer.params.lr=1e-5"}}, 1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-5);

  // errors in the overlay name the DeepSpeed file
  std::string bad = dir.write("ds_bad.json", R"({"zero_optimization": {"allgather_partitions": false}})");
  EXPECT_THAT(load_error(run, {}, 1, bad), HasSubstr("ds_bad.json: 'zero_optimization.allgather_partitions' = false is a DeepSpeed setting"));
  EXPECT_THAT(load_error(run, {}, 1, dir.path + "/nope.json"),
              HasSubstr("cannot read DeepSpeed config file '" + dir.path + "/nope.json': No such file"));
}

// The seed shapes of issue #11: DeepSpeed's older names, and a ds_config naming another type.
TEST(Config, DeepSpeedOldNamesMapToTheCurrentOnes) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal());
  std::string ds = dir.write("ds.json", R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})");
  Config c = load_config({run, ds, {}}, 2);
  EXPECT_EQ(c.zero.stage, 2);
  ds = dir.write("ds.json", R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})");
  EXPECT_EQ(load_config({run, ds, {}}, 1).zero.offload_optimizer.device, OffloadDevice::cpu);
  // both names, different values
  ds = dir.write("ds.json", R"({"zero_optimization": {"stage3_prefetch_bucket_size": 5, "prefetch_bucket_size": 6}})");
  EXPECT_THAT(load_error(run, {}, 1, ds), HasSubstr("contradicts"));
  ds = dir.write("ds.json", R"({"zero_optimization": {"stage": 3, "max_live_parameters": 1e6}})");
  c = load_config({run, ds, {}}, 1);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000);
  EXPECT_EQ(c.provenance["zero_optimization.stage3_max_live_parameters"],
            ds + " (as zero_optimization.max_live_parameters)");
  EXPECT_EQ(load_config({run, "", {"zero_optimization.cpu_offload=false"}}, 1).zero.stage, 0);
  ds = dir.write("ds.json", R"({"bfloat16": {"enabled": true}})");
  EXPECT_EQ(load_config({run, ds, {}}, 1).precision, Precision::bf16);
}

TEST(Config, OverlayReplacesSectionsOfAnotherTypeAndTheBatchGroup) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal(R"("gradient_accumulation_steps": 2,
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}})"));
  // DeepSpeed's ZeRO-1 tutorial shape: WarmupLR with its three params
  std::string ds = dir.write("ds.json", R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
    "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}}})");
  Config c = load_config({run, ds, {}}, 2);
  EXPECT_EQ(c.scheduler.type, SchedulerType::WarmupLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.train_batch_size, 8);  // the run config's micro 4 and gas 2 are replaced: gas derived as 1
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_THAT(c.provenance["gradient_accumulation_steps"].get<std::string>(), HasSubstr("derived"));
  // the same type merges key by key
  ds = dir.write("ds.json", R"({"scheduler": {"type": "warmupcosinelr", "params": {"warmup_num_steps": 5}}})");
  c = load_config({run, ds, {}}, 1);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 5);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);  // no batch key in the overlay: the run config's stay
  // Megatron-DeepSpeed's shape: train_batch_size and the micro-batch only
  ds = dir.write("ds.json", R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})");
  c = load_config({run, ds, {}}, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
}

TEST(Config, AutoTakesTheRunConfigsValueOrADerivedOne) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal(R"("gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
    "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}})"));
  // the Hugging Face integration's ZeRO-3 shape
  std::string ds = dir.write("ds.json", R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                  "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": true}
  })");
  Config c = load_config({run, ds, {}}, 2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 6e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);  // default
  EXPECT_EQ(c.precision, Precision::fp32);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 6e-4);  // from optimizer.params.lr
  EXPECT_EQ(c.scheduler.total_num_steps, 10);         // from train_steps
  EXPECT_EQ(c.zero.reduce_bucket_size, 64 * 64);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, static_cast<int64_t>(0.9 * 64 * 64));
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 640);
  EXPECT_EQ(c.provenance["optimizer.params.lr"], "auto: the value in " + run);
  EXPECT_EQ(c.provenance["scheduler.params.total_num_steps"], "auto: train_steps");
  EXPECT_THAT(c.provenance["zero_optimization.reduce_bucket_size"].get<std::string>(), HasSubstr("d_model^2"));
  EXPECT_EQ(c.provenance["optimizer.params.eps"], "auto: the default");
  EXPECT_EQ(c.provenance["zero_optimization.stage"], ds);
  EXPECT_EQ(c.provenance["model.d_model"], run);
  EXPECT_EQ(c.provenance["seed"], "default");
  EXPECT_THAT(describe_resolved(c), HasSubstr("auto: the value in"));
  // "auto" where a key has no value to take
  std::string no_data = dir.write("r2.json", R"({"train_micro_batch_size_per_gpu": 4, "train_steps": 1,
    "model": {"vocab_size": 256, "seq_len": 32, "n_layer": 2, "n_head": 4, "d_model": 64}, "data": {"train": "auto"}})");
  EXPECT_THAT(load_error(no_data), HasSubstr("r2.json: data.train is \"auto\" but the run config has no value for it"));
  // a real value named "auto" is not the placeholder
  EXPECT_EQ(load_config({run, "", {"checkpoint.load=auto"}}, 1).checkpoint.load, LoadMode::latest);
}

// Offload (issue #14): DeepSpeed's keys stored, its rules enforced with one line each.
TEST(Config, OffloadKeysAndRules) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal());
  std::string ds = dir.write("ds.json", R"({"zero_optimization": {"stage": 3, "sub_group_size": 1e7,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 6, "ratio": 0.5},
    "offload_param": {"device": "nvme", "nvme_path": "/p", "buffer_size": 1e8, "max_in_cpu": 1e9}},
    "aio": {"block_size": 262144, "thread_count": 2}})");
  Config c = load_config({run, ds, {}}, 1);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::nvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/local_nvme");
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 6);
  EXPECT_EQ(c.zero.offload_optimizer.ratio, 0.5);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::nvme);
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/p");
  EXPECT_EQ(c.zero.sub_group_size, 10000000);
  EXPECT_EQ(c.aio.block_size, 262144);
  EXPECT_EQ(c.aio.thread_count, 2);
  EXPECT_THAT(load_error(run, {"zero_optimization.stage=2", "zero_optimization.offload_param.device=cpu"}),
              HasSubstr("zero_optimization.offload_param.device = \"cpu\" needs zero_optimization.stage 3"));
  EXPECT_THAT(load_error(run, {"zero_optimization.offload_optimizer.device=cpu"}),
              HasSubstr("offload_optimizer.device = \"cpu\" needs zero_optimization.stage 1, 2 or 3"));
  EXPECT_THAT(load_error(run, {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=nvme"}),
              HasSubstr("needs zero_optimization.offload_optimizer.nvme_path"));
  EXPECT_THAT(load_error(run, {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=disk"}),
              HasSubstr("one of \"none\", \"cpu\", \"nvme\""));
  EXPECT_THAT(load_error(run, {"zero_optimization.offload_optimizer.buffer_count=1"}), HasSubstr("buffer_count"));
  EXPECT_THAT(load_error(run, {"zero_optimization.offload_optimizer.ratio=0"}), HasSubstr("ratio"));
}

TEST(Config, KeysWithoutEffectAreListedOnce) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal());
  std::string ds = dir.write("ds.json", R"({"wandb": {"enabled": true, "project": "x"},
    "aio": {"block_size": 1048576, "queue_depth": 8}, "elasticity": {"enabled": false, "max_train_batch_size": 8}})");
  Config c = load_config({run, ds, {}}, 1);
  ASSERT_EQ(c.notices.size(), 1u);
  EXPECT_THAT(c.notices[0], HasSubstr("wandb.enabled, wandb.project"));
  EXPECT_THAT(c.notices[0], HasSubstr("aio.queue_depth"));
  EXPECT_EQ(c.aio.block_size, 1048576);
  ds = dir.write("ds.json", R"({"elasticity": {"enabled": true}})");
  EXPECT_THAT(load_error(run, {}, 1, ds), HasSubstr("'elasticity.enabled' = true: a DeepSpeed feature zero3d does not "
                                                    "implement: no elastic training"));
  ds = dir.write("ds.json", R"({"sparse_attention": {"mode": "fixed"}})");
  EXPECT_THAT(load_error(run, {}, 1, ds), HasSubstr("'sparse_attention' is a DeepSpeed key zero3d does not implement"));
  // another optimizer: said before its params are called unknown
  ds = dir.write("ds.json", R"({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 400}}})");
  EXPECT_THAT(load_error(run, {}, 1, ds), HasSubstr("optimizer.type \"OneBitAdam\" is a DeepSpeed choice zero3d does "
                                                    "not implement: zero3d implements Adam and AdamW"));
  // DeepSpeed matches the optimizer's name ignoring case
  ds = dir.write("ds.json", R"({"optimizer": {"type": "adamw", "params": {"lr": 1e-4}}})");
  EXPECT_EQ(load_config({run, ds, {}}, 1).optimizer.type, OptimizerType::AdamW);
}

// Found by a hostile probe (issue #11): each is one line and exit 2, never a crash.
TEST(Config, HostileInputsAreOneLineErrors) {
  TempDir dir;
  std::string run = dir.write("run.json", minimal());
  EXPECT_THAT(load_error(run, {"train_steps=1e400"}), HasSubstr("--set train_steps=1e400: number overflow"));
  EXPECT_THAT(load_error(dir.write("big.json", minimal(R"("gradient_clipping": 1e400)"))),
              HasSubstr("big.json: invalid JSON: number overflow"));
  EXPECT_THAT(load_error(dir.write("dup.json", minimal(R"("optimizer": {"params": {"lr": 1, "lr": 2}})"))),
              HasSubstr("dup.json: key 'optimizer.params.lr' appears twice in one object"));
  EXPECT_THAT(load_error(dir.write("dup.json", minimal(R"("train_steps": 3)"))),
              HasSubstr("key 'train_steps' appears twice"));
  EXPECT_THAT(load_error(run, {R"(optimizer={"type": "Adam", "type": "AdamW"})"}), HasSubstr("appears twice"));
  // Found by tests/fuzz: a --set that is not UTF-8 reached the JSON writer, which threw.
  EXPECT_THAT(load_error(run, {"data.train=caf\xe9.bin"}), HasSubstr("not UTF-8 text"));
}

// A checkpoint's architecture record is read as the config reads the model keys (found by
// tests/fuzz: make_vocab_size_divisible_by 0 was taken, and padded_vocab() divided by it).
TEST(Config, ArchitectureRecordTakesWhatTheModelKeysTake) {
  ModelConfig m;
  m.arch = "llama", m.norm = "rmsnorm", m.position = "rope", m.mlp = "swiglu", m.intermediate_size = 96;
  m.num_key_value_heads = 2, m.bias = false, m.tie_word_embeddings = false, m.make_vocab_size_divisible_by = 64;
  m.rope_scaling = {"llama3", 32.0, 2.0, 8.0, 4096};
  ModelConfig back;
  set_architecture(back, architecture_of(m));
  EXPECT_EQ(architecture_of(back), architecture_of(m));
  auto refused = [](const char* record) {
    ModelConfig x;
    try {
      set_architecture(x, nlohmann::json::parse(record));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(refused(R"({"make_vocab_size_divisible_by": 0})"), HasSubstr("make_vocab_size_divisible_by = 0"));
  EXPECT_THAT(refused(R"({"arch": "bert"})"), HasSubstr("arch = \"bert\""));
  EXPECT_THAT(refused(R"({"rope_theta": -1})"), HasSubstr("rope_theta = -1"));
  EXPECT_THAT(refused(R"({"num_key_value_heads": 1.5})"), HasSubstr("num_key_value_heads = 1.5"));
  EXPECT_THAT(refused(R"({"bias": "yes"})"), HasSubstr("bias = \"yes\""));
  EXPECT_THAT(refused(R"({"rope_scaling.rope_type": "yarn"})"), HasSubstr("rope_scaling.rope_type = \"yarn\""));
}

TEST(Config, UnknownKeySuggestsNearest) {
  TempDir dir;
  std::string f = dir.write("run.json", minimal(R"("optimizer": {"params": {"betaz": [0.9, 0.95]}})"));
  EXPECT_THAT(load_error(f), HasSubstr("run.json: unknown config key 'optimizer.params.betaz' "
                                       "(did you mean 'optimizer.params.betas'?)"));
  // a key in the wrong section is found by its leaf name
  f = dir.write("run.json", minimal(R"("lr": 0.1)"));
  EXPECT_THAT(load_error(f), HasSubstr("unknown config key 'lr' (did you mean 'optimizer.params.lr'?)"));
  f = dir.write("run.json", minimal(R"("optimiser": {"type": "AdamW"})"));
  EXPECT_THAT(load_error(f), HasSubstr("unknown config key 'optimiser' (did you mean 'optimizer'?)"));
  f = dir.write("run.json", minimal(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}})"));
  EXPECT_THAT(load_error(f), HasSubstr("(did you mean 'scheduler.params.warmup_num_steps'?)"));
  // nothing close: the valid keys of that section are listed
  f = dir.write("run.json", minimal(R"("fp16": {"zzzzzzzz": 1})"));
  EXPECT_THAT(load_error(f), HasSubstr("unknown config key 'fp16.zzzzzzzz' (valid keys in 'fp16': "));
  // a section must be an object
  f = dir.write("run.json", minimal(R"("fp16": true)"));
  EXPECT_THAT(load_error(f), HasSubstr("'fp16' must be an object"));
  // ...except DeepSpeed's old boolean zero_optimization: stage 1 or 0
  EXPECT_EQ(load_config({dir.write("run.json", minimal(R"("zero_optimization": true)")), "", {}}, 1).zero.stage, 1);
}

TEST(Config, DeepSpeedSettingsZero3dDoesNotImplement) {
  TempDir dir;
  std::string f = dir.write("run.json", minimal(R"("zero_optimization": {"contiguous_gradients": false})"));
  EXPECT_THAT(load_error(f), HasSubstr("run.json: 'zero_optimization.contiguous_gradients' = false is a DeepSpeed "
                                       "setting zero3d does not implement (zero3d: gradients always live in one "
                                       "contiguous buffer); remove it or set it to true"));
  // explicit defaults are fine
  f = dir.write("run.json", minimal(R"("fp16": {"enabled": false, "loss_scale": 0}, "bf16": {"enabled": false},
    "zero_optimization": {"stage": 0, "overlap_comm": false}, "tensor_parallel": {"tp_size": 1},
    "checkpoint": {"dir": "checkpoints"})"));
  EXPECT_NO_THROW(load_config({f, "", {}}, 1));
  EXPECT_THAT(load_error(f, {"zero_optimization.allgather_partitions=false"}),
              HasSubstr("'zero_optimization.allgather_partitions' = false is a DeepSpeed setting zero3d does not"));
  EXPECT_NO_THROW(load_config({f, "", {"zero_optimization.stage=2", "zero_optimization.overlap_comm=true"}}, 1));
  EXPECT_NO_THROW(load_config({f, "", {"zero_optimization.stage=3", "zero_optimization.stage3_max_live_parameters=5"}}, 1));
  EXPECT_THAT(load_error(f, {"bf16.enabled=true", "fp16.enabled=true"}),
              HasSubstr("fp16.enabled and bf16.enabled are both true; choose one precision"));
  EXPECT_EQ(load_config({f, "", {"bf16.enabled=true"}}, 1).precision, Precision::bf16);
  EXPECT_EQ(load_config({f, "", {"fp16.enabled=true", "fp16.hysteresis=1"}}, 1).fp16.hysteresis, 1);
  EXPECT_EQ(load_config({f, "", {"pipeline_parallel.pp_size=2"}}, 2).pp_size, 2);
  EXPECT_THAT(load_error(f, {"pipeline_parallel.pp_size=4"}, 4),
              HasSubstr("pipeline_parallel.pp_size 4 is larger than model.n_layer 2"));
  EXPECT_THAT(load_error(f, {"tensor_parallel.tp_size=2"}),
              HasSubstr("the world size 1 is not a multiple of tensor_parallel.tp_size 2"));
  EXPECT_EQ(load_config({f, "", {"tensor_parallel.tp_size=2"}}, 4).tp_size, 2);
  EXPECT_THAT(load_error(f, {"tensor_parallel.tp_size=3"}, 3),
              HasSubstr("model.n_head 4 must be divisible by tensor_parallel.tp_size 3"));
  EXPECT_EQ(load_config({f, "", {"checkpoint.save_interval=100"}}, 1).checkpoint.save_interval, 100);
  EXPECT_THAT(load_error(f, {"checkpoint.load=\"\""}), HasSubstr("checkpoint.load"));
  EXPECT_THAT(load_error(f, {"zero_optimization.contiguous_gradients=false"}),
              HasSubstr("'zero_optimization.contiguous_gradients' = false is a DeepSpeed setting"));
  // world_size > 1 is data parallelism
  EXPECT_NO_THROW(load_config({f, "", {}}, 4));
}

// DeepSpeed's monitors and profiler: defaults, DeepSpeed's "never" (-1) and None (null), and the
// legacy keys the ds_config corpus (tests/ds_configs) carries.
TEST(Config, MonitorsProfilerAndLegacyKeys) {
  TempDir dir;
  const std::string f = dir.write("run.json", minimal());
  Config c = load_config({f, "", {}}, 1);
  EXPECT_FALSE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_EQ(c.flops_profiler.top_modules, 1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_EQ(c.flops_profiler.output_file, "");
  const std::string ds = dir.write("ds.json", R"({"flops_profiler": {"enabled": true, "profile_step": -1,
    "module_depth": 2, "top_modules": 3, "detailed": false, "output_file": null, "recompute_fwd_factor": 1.0},
    "csv_monitor": {"enabled": true, "output_path": "logs", "job_name": "j"},
    "comms_logger": {"enabled": true, "prof_all": false, "prof_ops": ["all_reduce"]}, "memory_breakdown": true})");
  c = load_config({f, ds, {}}, 1);
  EXPECT_TRUE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, -1);
  EXPECT_EQ(c.flops_profiler.module_depth, 2);
  EXPECT_EQ(c.flops_profiler.top_modules, 3);
  EXPECT_FALSE(c.flops_profiler.detailed);
  EXPECT_EQ(c.flops_profiler.output_file, "");
  EXPECT_DOUBLE_EQ(c.flops_profiler.recompute_fwd_factor, 1.0);
  EXPECT_EQ(c.csv_monitor.output_path, "logs");
  EXPECT_EQ(c.comms_logger.prof_ops, std::vector<std::string>{"all_reduce"});
  EXPECT_TRUE(c.memory_breakdown);
  EXPECT_THAT(load_error(f, {"flops_profiler.profile_step=-2"}), HasSubstr("flops_profiler.profile_step"));
  EXPECT_THAT(load_error(f, {"comms_logger.prof_ops=[\"alltoall\"]"}),
              HasSubstr("comms_logger.prof_ops: unknown collective \"alltoall\""));
  EXPECT_THAT(load_error(f, {"tensorboard.enabled=true"}), HasSubstr("use csv_monitor"));
  // apex's in-optimizer clipping: refused as DeepSpeed refuses it, pointing at gradient_clipping
  EXPECT_THAT(load_error(f, {"optimizer.params.max_grad_norm=1.0"}),
              HasSubstr("'optimizer.params.max_grad_norm' is a DeepSpeed key zero3d does not implement"));
  // Megatron-DeepSpeed's bfloat16.loss_scale: only the no-op values
  EXPECT_EQ(load_config({f, "", {"bfloat16.enabled=true", "bfloat16.loss_scale=1.0"}}, 1).precision,
            Precision::bf16);
  EXPECT_THAT(load_error(f, {"bf16.enabled=true", "bf16.loss_scale=128"}), HasSubstr("'bf16.loss_scale' = 128.0"));
  // DeepSpeed allows bucket sizes of 0 (one tensor at a time)
  EXPECT_EQ(load_config({f, "", {"zero_optimization.reduce_bucket_size=0"}}, 1).zero.reduce_bucket_size, 0);
}

TEST(Config, SchedulerParamsBelongToTheirType) {
  TempDir dir;
  std::string f = dir.write("run.json", minimal(R"("scheduler": {"type": "WarmupCosineLR",
    "params": {"total_num_steps": 100, "warmup_max_lr": 0.01}})"));
  EXPECT_THAT(load_error(f), HasSubstr("config key 'scheduler.params.warmup_max_lr' does not apply to scheduler.type "
                                       "\"WarmupCosineLR\""));
  f = dir.write("run.json", minimal(R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}})"));
  EXPECT_THAT(load_error(f), HasSubstr("missing required config key 'scheduler.params.total_num_steps' for "
                                       "scheduler.type \"WarmupDecayLR\""));
  f = dir.write("run.json", minimal(R"("scheduler": {"type": "OneCycle"})"));
  EXPECT_THAT(load_error(f), HasSubstr("scheduler.type \"OneCycle\" is a DeepSpeed choice zero3d does not implement: "
                                       "zero3d implements WarmupLR, WarmupDecayLR and WarmupCosineLR"));
  f = dir.write("run.json", minimal(R"("scheduler": {"type": "StepLR"})"));
  EXPECT_THAT(load_error(f), HasSubstr("scheduler.type must be one of \"WarmupLR\", \"WarmupDecayLR\", "
                                       "\"WarmupCosineLR\""));
  f = dir.write("run.json", minimal(R"("optimizer": {"type": "SGD"})"));
  EXPECT_THAT(load_error(f), HasSubstr("optimizer.type must be one of \"AdamW\", \"Adam\", got \"SGD\""));
  f = dir.write("run.json", minimal(R"("optimizer": {"params": {"adam_w_mode": false}})"));
  EXPECT_THAT(load_error(f), HasSubstr("adam_w_mode=false contradicts optimizer.type \"AdamW\""));
  f = dir.write("run.json", minimal(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}})"));
  EXPECT_THAT(load_error(f), HasSubstr("scheduler.params.warmup_type must be one of \"log\", \"linear\", got \"exp\""));

  f = dir.write("run.json", minimal(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01}})"));
  Config c = load_config({f, "", {}}, 1);
  EXPECT_DOUBLE_EQ(c.scheduler.warmup_max_lr, 0.01);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::log);
  EXPECT_FALSE(c.resolved["scheduler"]["params"].contains("cos_min_ratio"));
}

TEST(Config, BadJsonNamesLineAndColumn) {
  TempDir dir;
  std::string f = dir.write("bad.json", "{\n  \"train_steps\": 10,\n  \"seed\": 1,,\n}\n");
  std::string e = load_error(f);
  EXPECT_THAT(e, HasSubstr(f + ": invalid JSON at line 3, column 13"));
  EXPECT_THAT(e, Not(HasSubstr("[json.exception")));
  f = dir.write("trunc.json", "{\"a\": [1, 2");
  EXPECT_THAT(load_error(f), HasSubstr("trunc.json: invalid JSON at line 1, column 12"));
  f = dir.write("array.json", "[1, 2]");
  EXPECT_THAT(load_error(f), HasSubstr("array.json: the top level must be a JSON object"));
}

TEST(Config, MissingFile) {
  EXPECT_THAT(load_error("/nonexistent/run.json"),
              HasSubstr("cannot read config file '/nonexistent/run.json': No such file"));
}

TEST(Config, WrongTypesAndValues) {
  TempDir dir;
  auto err = [&](const std::string& extra) { return load_error(dir.write("run.json", minimal(extra))); };
  EXPECT_THAT(load_error(dir.write("run.json", minimal()), {"model.n_head=\"four\""}),
              HasSubstr("model.n_head must be a positive integer, got \"four\""));
  EXPECT_THAT(err(R"("gradient_clipping": -1)"), HasSubstr("gradient_clipping must be a number >= 0, got -1"));
  EXPECT_THAT(err(R"("steps_per_print": 2.5)"), HasSubstr("steps_per_print must be a positive integer, got 2.5"));
  EXPECT_THAT(err(R"("wall_clock_breakdown": 1)"), HasSubstr("wall_clock_breakdown must be true or false, got 1"));
  EXPECT_THAT(err(R"("optimizer": {"params": {"betas": [0.9]}})"),
              HasSubstr("optimizer.params.betas must be a pair of numbers [beta1, beta2], each in [0, 1), got [0.9]"));
  EXPECT_THAT(err(R"("optimizer": {"params": {"eps": 0}})"), HasSubstr("optimizer.params.eps must be a number > 0"));
  EXPECT_THAT(err(R"("zero_optimization": {"stage": 4})"),
              HasSubstr("zero_optimization.stage must be an integer in [0, 3], got 4"));
  EXPECT_THAT(load_error(dir.write("run.json", minimal()), {"model.d_model=66"}),
              HasSubstr("model.d_model 66 must be divisible by model.n_head 4"));
  EXPECT_THAT(load_error(dir.write("run.json", minimal()), {"data.train=\"\""}),
              HasSubstr("data.train must be a non-empty string, got \"\""));
  // missing required keys name the key and what it takes
  std::string f = dir.write("run.json", R"({"train_micro_batch_size_per_gpu": 1, "train_steps": 1,
    "model": {"vocab_size": 8, "seq_len": 8, "n_layer": 1, "d_model": 8}, "data": {"train": "t.bin"}})");
  EXPECT_THAT(load_error(f), HasSubstr("run.json: missing required config key 'model.n_head' (a positive integer"));
}

TEST(Config, ShippedInputsLoad) {
  const std::string root = ZERO3D_SOURCE_DIR;
  Config tiny = load_config({root + "/input/gpt-tiny.json", "", {}}, 1);
  EXPECT_EQ(tiny.model.vocab_size, 256);
  EXPECT_EQ(tiny.model.d_model, 128);
  EXPECT_EQ(tiny.train_batch_size, 8);
  EXPECT_EQ(tiny.train_steps, 200);
  EXPECT_EQ(tiny.scheduler.type, SchedulerType::WarmupCosineLR);
  EXPECT_EQ(tiny.scheduler.total_num_steps, 200);
  EXPECT_DOUBLE_EQ(tiny.scheduler.cos_min_ratio, 0.1);
  EXPECT_DOUBLE_EQ(tiny.optimizer.betas[1], 0.95);
  EXPECT_EQ(tiny.data.val_interval, 50);

  Config big = load_config({root + "/input/gpt2-124m.json", "", {}}, 1);
  EXPECT_EQ(big.model.vocab_size, 50257);
  EXPECT_EQ(big.model.padded_vocab(), 50304);  // llm.c's padding
  EXPECT_EQ(big.model.seq_len, 1024);
  EXPECT_EQ(big.model.n_layer, 12);
  EXPECT_DOUBLE_EQ(big.optimizer.lr, 6e-4);
  EXPECT_EQ(big.data.val_batches, 4);
  EXPECT_EQ(big.steps_per_print, 1);
}

TEST(Config, DescribeListsEveryKey) {
  std::string text = describe_config_keys();
  EXPECT_THAT(text, HasSubstr("optimizer.params.betas"));
  EXPECT_THAT(text, HasSubstr("zero_optimization.stage3_max_live_parameters"));
  EXPECT_THAT(text, HasSubstr("zero_optimization.contiguous_gradients"));
  EXPECT_THAT(text, HasSubstr("[only the value zero3d implements]"));
  EXPECT_THAT(text, HasSubstr("[accepted, no effect here]"));
  EXPECT_THAT(text, HasSubstr("[refused]"));
  EXPECT_THAT(text, HasSubstr("zero_optimization.cpu_offload"));  // old names too
  EXPECT_THAT(text, HasSubstr("model.n_head"));
}

}  // namespace
