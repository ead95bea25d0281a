// ckpt/tokenizer_record.h: the run's tokenizer travels with its checkpoints, so `generate`, `eval`
// and `ckpt export` turn text into the ids the model was trained on, and never guess.
//
// A checkpoint's root attribute "tokenizer" holds the record of data.tokenizer (JSON):
//   ""                      unknown (data.tokenizer unset; checkpoints from before the key)
//   {"kind": "byte"}        token = byte
//   {"kind": "bpe" | "sentencepiece", "file": "tokenizer-<hash>.json|.model", "source": the path the
//    run named, "hash": FNV-1a 64 of the file's bytes (hex), "vocab_size", "bos", "eos"}
// The file is copied into the checkpoint directory under `file` (named by its hash, so runs with
// other tokenizers never overwrite it) before the first save. Invariant: a recorded tokenizer is
// only ever opened from bytes whose hash equals the record's: the copy beside the checkpoint, else
// the source path if it still holds the same file; anything else is refused by name.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace zero3d {

// The record of `spec` (data.tokenizer) for a model of `model_vocab` tokens: loads the tokenizer.
// UserError naming the key and file when it does not load or has more ids than the model.
std::string tokenizer_record(const std::string& spec, int model_vocab);

// A resume continues the same ids: UserError naming `path` when this run's record and the saved one
// both name a tokenizer and differ (kind or hash). Either unknown: nothing to compare.
void check_same_tokenizer(const std::string& run_record, const std::string& saved_record, const std::string& path);

// Rank 0, before a save into `dir`: the recorded file copied there unless already present. Returns
// "" or what failed (the save goes on: the source path still serves while it holds the same file).
std::string copy_recorded_tokenizer(const std::string& record, const std::string& dir);

struct CheckpointTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string kind;  // "byte", "bpe", "sentencepiece"
  std::string file;  // the file it was read from ("" for byte)
  std::string bytes;  // that file's bytes, as loaded (and, when recorded, hash-checked): what an export writes
  std::string origin;  // for messages: "recorded in the checkpoint" or "--tokenizer"
};
// The tokenizer for text in or out of the checkpoint at `ckpt_file` (whose "tokenizer" attribute is
// `record`): `given` (a --tokenizer option: "byte" or a file) when not empty, else the recorded one.
// UserError when none is recorded and none given (naming --tokenizer and --prompt-ids), when the
// recorded file is neither beside the checkpoint nor at its source with the recorded hash, or when
// the tokenizer has more ids than the model's vocabulary `model_vocab`.
CheckpointTokenizer checkpoint_tokenizer(const std::string& ckpt_file, const std::string& record, int model_vocab,
                                         const std::string& given);

// The tokenizer files of a Hugging Face export (ckpt export --format hf), name -> content, so that
// AutoTokenizer reads them as they are: the tokenizer itself (tokenizer.json as recorded, or
// tokenizer.model; "byte" written as the equivalent tokenizer.json: 256 byte tokens, no merges),
// tokenizer_config.json (class, bos/eos spelled, model_max_length = seq_len) and
// generation_config.json (bos/eos ids). `config` (config.json) gets bos_token_id / eos_token_id.
struct HfFile {
  std::string name, content;
};
std::vector<HfFile> hf_tokenizer_files(const CheckpointTokenizer& t, int seq_len, nlohmann::ordered_json& config);
// Every name hf_tokenizer_files may write.
extern const std::vector<std::string> kHfTokenizerFileNames;

}  // namespace zero3d
