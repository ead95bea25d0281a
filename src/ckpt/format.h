// ckpt/format.h: what a checkpoint file holds, declared once and used by save, load and
// `zero3d ckpt`: the root attributes (one table: name, type, meaning), the datasets, the checksum.
//
// Format (version 1), self-describing (h5dump -H shows it all):
//   /model/<name>                  the weights the model computes with, in their logical (whole,
//                                  unsharded) shape: float32, or in 16-bit runs uint16 holding
//                                  bfloat16/float16 bits (attribute "dtype" says which)
//   /optimizer/master/<name>       fp32 master weights (16-bit runs only; in fp32 runs /model is the master)
//   /optimizer/exp_avg/<name>      Adam m, fp32
//   /optimizer/exp_avg_sq/<name>   Adam v, fp32
//   every dataset: attribute "checksum" (uint64, checksum_run below)
//   root attributes: kHeaderFields.
// <name> is the tensor's name in the whole model (wte, wpe, h.L.attn.c_attn.weight, ..., ln_f.bias).
//
// The checksum of a dataset is a sum over its elements of a hash of (logical index, bits), so any
// partition of the elements (the saving layout's or the loading layout's) sums to the same value:
// a load verifies every dataset it reads without reading anything twice.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"
#include "storage/hdf5.h"

namespace zero3d {

constexpr int kCheckpointFormatVersion = 1;
extern const char* const kCheckpointFormat;  // the "format" attribute: "zero3d-checkpoint"
extern const char* const kChecksumAlgorithm;

// The checksum of a run of n elements whose first has logical index `first`:
// sum over i of splitmix64((first + i) << 32 | bits(x_i)), modulo 2^64.
uint64_t checksum_run(uint64_t first, const float* x, size_t n);
uint64_t checksum_run(uint64_t first, const uint16_t* x, size_t n);

// ---- root attributes ----

struct CheckpointHeader {
  std::string format, zero3d_version;
  int64_t format_version = 0;
  int64_t step = 0, optimizer_steps = 0;
  uint64_t data_cursor = 0, seed = 0;
  int64_t world_size = 0, tp = 0, pp = 0, dp = 0, zero_stage = 0;
  std::string precision;
  int64_t n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, seq_len = 0;
  std::string architecture;  // config/config.h's architecture_of, JSON; "" in checkpoints before it (GPT-2)
  std::string config, loss_scaler, lr_scheduler, rng, checksum_algorithm;
  std::string tokenizer;  // ckpt/tokenizer_record.h's record; "" when unknown or before the attribute
  std::string data;  // the training data's order (data/loader.h DataOrder, JSON); "" in checkpoints before it

  bool mixed() const { return precision != "fp32"; }  // 16-bit /model and an fp32 /optimizer/master
  std::string layout() const;  // "world 8 = tp 1 x pp 1 x dp 8, ZeRO-3, fp32"
};

struct HeaderField {
  const char* name;
  std::variant<std::string CheckpointHeader::*, int64_t CheckpointHeader::*, uint64_t CheckpointHeader::*> member;
  const char* meaning;
  bool optional = false;  // older checkpoints lack it: read when there, "" when not
};
// Every root attribute, in the order `zero3d ckpt inspect` shows them.
extern const std::vector<HeaderField> kHeaderFields;

void write_header(hid_t file, const CheckpointHeader& h);  // collective in a parallel file
// Every field; UserError naming `path` and the first attribute that is missing or of another type
// (but an optional one, which older checkpoints lack: "" then).
CheckpointHeader read_header(hid_t file, const std::string& path);
// Each field's value as text, "(missing)" where it is absent (inspect shows what is there).
std::vector<std::pair<const HeaderField*, std::string>> header_text(hid_t file);
// The model the header holds against this run's: its shape, then its architecture keys (GPT-2's when
// the attribute is absent, as in checkpoints from before the Llama family). UserError naming `path`
// and the first key that differs, or an architecture attribute that does not parse.
void check_saved_model(const CheckpointHeader& h, const ModelConfig& m, const std::string& path);
// The model the root attributes describe, for `zero3d ckpt` (which shows what it can of a damaged
// file): nullopt when a shape attribute is missing or not a positive int, the architecture
// attribute does not parse, or the shape is not one a config resolves to (heads that do not divide
// d_model, more layers than the file could hold).
std::optional<ModelConfig> model_of(hid_t file);

// ---- datasets ----

enum class StateKind { model, master, exp_avg, exp_avg_sq };

struct DatasetSpec {
  std::string path;  // /model/wte, /optimizer/exp_avg/h.0.attn.c_attn.weight, ...
  int tensor = 0;    // index in gpt_param_table(model)
  StateKind kind = StateKind::model;
  bool sixteen = false;       // uint16 holding bf16/fp16 bits (the 16-bit /model of a mixed run)
  std::vector<hsize_t> dims;  // the logical shape
};

// What a checkpoint of this model holds (mixed: 16-bit /model and /optimizer/master), in file order.
std::vector<DatasetSpec> checkpoint_datasets(const ModelConfig& m, bool mixed);
// What a load reads: the fp32 master (/optimizer/master, or /model in an fp32 file), m and v.
std::vector<DatasetSpec> optimizer_datasets(const ModelConfig& m, bool mixed_file);
// The group every dataset of `kind` sits in.
const char* group_of(StateKind kind);

// Dataset `dataset` (a path like /model/wte) of an open checkpoint; UserError naming file_path and
// the dataset when it is missing or cannot be opened. Its group is checked first, so HDF5 never
// looks below a missing one.
Hid open_checkpoint_dataset(hid_t file, const std::string& file_path, const std::string& dataset);

}  // namespace zero3d
