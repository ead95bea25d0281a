// ckpt/tools.h: `zero3d ckpt`, the checkpoint file seen from outside a run: inspect what it
// holds, verify every dataset against its checksum, export the model weights as safetensors for
// other tools (Hugging Face, llm.c converters).
//
// Why a tool of its own: load_checkpoint() needs a run of the same model and reads only the master
// weights and the Adam moments; these read a file alone, on one process (world rank 0, the serial
// sec2 driver), and cover every dataset. Invariant: memory stays bounded by one tensor (verify:
// one block of rows), never the whole model, so they work on checkpoints larger than RAM (but
// read_checkpoint_model, for generate and eval, which need the whole model anyway).
// Each returns the exit code; a file that is missing, not HDF5, truncated or not a zero3d
// checkpoint is a UserError naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace zero3d {

// Prints the root attributes (step, layout at save, model shape, scaler and scheduler state) and a
// table of every dataset (path, dtype, shape, bytes). Returns 0.
int ckpt_inspect(const std::string& dir_or_file);

// Recomputes every dataset's checksum (ckpt/checkpoint.h) and prints one line per dataset that
// differs, lacks a checksum or cannot be read. Returns 0, or kExitInconsistent when any fails.
int ckpt_verify(const std::string& dir_or_file);

// Writes the model weights in the safetensors format: weights "master" (fp32 master weights, F32)
// or "model" (the computing weights as stored: F32, BF16 or F16). Format "safetensors": the file
// `out`, zero3d's names in model order (wte, wpe, h.0..., ln_f); "hf": the directory `out` with
// config.json and model.safetensors as transformers loads them (ckpt/hf.h), and the tokenizer's files
// (ckpt/tokenizer_record.h: the one recorded, or `tokenizer` when given). Each file is written as
// .tmp, then renamed. Returns 0.
int ckpt_export(const std::string& dir_or_file, const std::string& out, const std::string& weights,
                const std::string& format = "safetensors", const std::string& tokenizer = "");

// A checkpoint's model for inference on one process: its model config (shape and architecture)
// and every tensor of gpt_param_table(model) (tp 1, pp 1) as fp32, in table order: the fp32
// master weights (/optimizer/master of a 16-bit run, else /model), checksums verified.
struct CheckpointModel {
  ModelConfig model;
  int64_t step = 0;
  std::string file;       // the checkpoint file read
  std::string tokenizer;  // its "tokenizer" record (ckpt/tokenizer_record.h), "" when unknown
  std::vector<std::vector<float>> tensors;
};
CheckpointModel read_checkpoint_model(const std::string& dir_or_file);

}  // namespace zero3d
