#include "ckpt/tokenizer_record.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/hash.h"
#include "core/posix_io.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {

std::string hex64(uint64_t h) { return strprintf("%016llx", static_cast<unsigned long long>(h)); }

// The tokenizer in `spec`, checked against the model's vocabulary; `where` starts the error. With
// `bytes`, read once: an empty one gets the file's bytes, a full one is loaded as it is (either way
// what a caller hashes is what is loaded).
std::unique_ptr<Tokenizer> load_checked(const std::string& spec, int model_vocab, const std::string& where,
                                        std::string* bytes = nullptr) {
  std::unique_ptr<Tokenizer> t;
  try {
    if (!bytes || spec == "byte") {
      t = load_tokenizer(spec);
    } else {
      if (bytes->empty()) *bytes = read_tokenizer_file(spec);
      t = load_tokenizer_bytes(spec, *bytes);
    }
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  if (t->vocab_size() > model_vocab)
    throw UserError(strprintf("%s: tokenizer '%s' has %d ids, more than the model's vocab_size %d (set model.vocab_size "
                              "to at least %d)",
                              where.c_str(), spec.c_str(), t->vocab_size(), model_vocab, t->vocab_size()));
  return t;
}

}  // namespace

std::string tokenizer_record(const std::string& given, int model_vocab) {
  if (given.empty()) return "";
  std::string spec = given, bytes;
  try {
    spec = tokenizer_file(given);
  } catch (const UserError& e) {
    throw UserError(std::string("data.tokenizer: ") + e.what());
  }
  const std::unique_ptr<Tokenizer> t = load_checked(spec, model_vocab, "data.tokenizer", &bytes);
  nlohmann::ordered_json r{{"kind", t->kind()}};
  if (spec != "byte") {
    const std::string hash = hex64(fnv1a(bytes.data(), bytes.size()));
    std::error_code ec;
    const fs::path abs = fs::absolute(spec, ec);
    r["file"] = "tokenizer-" + hash + (std::string(t->kind()) == "sentencepiece" ? ".model" : ".json");
    r["source"] = ec ? spec : abs.lexically_normal().string();
    r["hash"] = hash;
    r["vocab_size"] = t->vocab_size();
    r["bos"] = t->bos_id();
    r["eos"] = t->eos_id();
  }
  return r.dump();
}

void check_same_tokenizer(const std::string& run_record, const std::string& saved_record, const std::string& path) {
  if (run_record.empty() || saved_record.empty()) return;
  const nlohmann::json run = nlohmann::json::parse(run_record, nullptr, false),
                       saved = nlohmann::json::parse(saved_record, nullptr, false);
  auto show = [](const nlohmann::json& r) {
    if (!r.is_object()) return std::string("(unreadable record)");
    const std::string kind = r.value("kind", std::string("?"));
    return r.contains("source") ? kind + " '" + r.value("source", std::string()) + "' (hash " + r.value("hash", std::string()) + ")"
                                : kind;
  };
  if (run.is_object() && saved.is_object() && run.value("kind", "") == saved.value("kind", "") &&
      run.value("hash", "") == saved.value("hash", ""))
    return;
  throw UserError(strprintf("checkpoint '%s' was trained with tokenizer %s, this run's data.tokenizer is %s: its ids "
                            "would mean other text. Set data.tokenizer to the checkpoint's (or start a new run from "
                            "its weights)",
                            path.c_str(), show(saved).c_str(), show(run).c_str()));
}

std::string copy_recorded_tokenizer(const std::string& record, const std::string& dir) {
  if (record.empty()) return "";
  const nlohmann::json r = nlohmann::json::parse(record);
  if (!r.contains("file")) return "";
  const std::string to = dir + "/" + r["file"].get<std::string>(), from = r["source"].get<std::string>();
  std::error_code ec;
  if (fs::exists(to, ec)) return "";
  try {
    const std::string bytes = read_text_file(from, "data.tokenizer");
    if (hex64(fnv1a(bytes.data(), bytes.size())) != r["hash"].get<std::string>())
      return strprintf("tokenizer '%s' changed since the run started: not copied beside the checkpoints", from.c_str());
    AtomicFile out(to, "tokenizer copy");
    out.write(bytes);
    out.commit(true);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

CheckpointTokenizer checkpoint_tokenizer(const std::string& ckpt_file, const std::string& record, int model_vocab,
                                         const std::string& given) {
  CheckpointTokenizer c;
  if (!given.empty()) {
    if (given != "byte") try {
        c.file = tokenizer_file(given);
      } catch (const UserError& e) {
        throw UserError(std::string("--tokenizer: ") + e.what());
      }
    c.tokenizer = load_checked(c.file.empty() ? given : c.file, model_vocab, "--tokenizer", &c.bytes);
    c.kind = c.tokenizer->kind();
    c.origin = "--tokenizer";
    return c;
  }
  if (record.empty())
    throw UserError(strprintf("checkpoint '%s' records no tokenizer (its run did not set data.tokenizer): give "
                              "--tokenizer FILE (or \"byte\") to say which made its token ids, or give ids (--prompt-ids)",
                              ckpt_file.c_str()));
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(record);
  } catch (const nlohmann::json::exception&) {
  }
  if (!r.is_object() || !r.contains("kind") || !r["kind"].is_string())
    throw UserError(strprintf("checkpoint '%s': its tokenizer attribute is not a record this zero3d reads: give "
                              "--tokenizer FILE",
                              ckpt_file.c_str()));
  c.origin = "recorded in the checkpoint";
  if (r["kind"] == "byte") {
    c.tokenizer = load_checked("byte", model_vocab, "checkpoint '" + ckpt_file + "'");
    c.kind = "byte";
    return c;
  }
  const std::string name = r.value("file", ""), hash = r.value("hash", ""), source = r.value("source", "");
  const std::string beside = (fs::path(ckpt_file).parent_path() / name).string();
  std::error_code ec;
  for (const std::string& candidate : {beside, source}) {
    if (name.empty() || candidate.empty() || !fs::is_regular_file(candidate, ec)) continue;
    std::string bytes = read_text_file(candidate, "the checkpoint's tokenizer");
    if (hex64(fnv1a(bytes.data(), bytes.size())) != hash) continue;
    c.tokenizer = load_checked(candidate, model_vocab, "checkpoint '" + ckpt_file + "'", &bytes);
    c.kind = c.tokenizer->kind();
    c.file = candidate;
    c.bytes = std::move(bytes);
    return c;
  }
  throw UserError(strprintf("checkpoint '%s' was trained with tokenizer '%s' (hash %s), but neither '%s' nor that "
                            "path holds it: copy the tokenizer file there, or give --tokenizer FILE",
                            ckpt_file.c_str(), source.c_str(), hash.c_str(), beside.c_str()));
}

const std::vector<std::string> kHfTokenizerFileNames = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                                        "generation_config.json"};

namespace {

// GPT-2's printable stand-ins for bytes (the ByteLevel pre-tokenizer's alphabet): printable
// Latin-1 bytes stand for themselves, the other 68 for U+0100 on, in byte order. As UTF-8.
std::string byte_level_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++cp;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// The byte tokenizer as a Hugging Face tokenizer.json: a BPE model of the 256 byte tokens and no
// merges behind the ByteLevel pre-tokenizer (no regex, no prefix space): id = byte.
std::string byte_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  const nlohmann::ordered_json byte_level{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                          {"use_regex", false}};
  nlohmann::ordered_json t{{"version", "1.0"},
                           {"truncation", nullptr},
                           {"padding", nullptr},
                           {"added_tokens", nlohmann::ordered_json::array()},
                           {"normalizer", nullptr},
                           {"pre_tokenizer", byte_level},
                           {"post_processor", nullptr},
                           {"decoder", byte_level},
                           {"model",
                            {{"type", "BPE"},
                             {"dropout", nullptr},
                             {"unk_token", nullptr},
                             {"continuing_subword_prefix", nullptr},
                             {"end_of_word_suffix", nullptr},
                             {"fuse_unk", false},
                             {"byte_fallback", false},
                             {"ignore_merges", false},
                             {"vocab", vocab},
                             {"merges", nlohmann::ordered_json::array()}}}};
  return t.dump() + "\n";
}

}  // namespace

std::vector<HfFile> hf_tokenizer_files(const CheckpointTokenizer& t, int seq_len, nlohmann::ordered_json& config) {
  std::vector<HfFile> out;
  const Tokenizer& tok = *t.tokenizer;
  // The bytes checkpoint_tokenizer loaded (and checked against the record), not a second read.
  if (t.kind == "byte") out.push_back({"tokenizer.json", byte_tokenizer_json()});
  else out.push_back({t.kind == "sentencepiece" ? "tokenizer.model" : "tokenizer.json", t.bytes});
  auto spelled = [&](int id) { return id >= 0 ? nlohmann::ordered_json(tok.decode(std::span<const int32_t>(&id, 1))) : nullptr; };
  // GPT-2's files name its one special token bos and eos alike; a tokenizer without bos does so here.
  const int bos = tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id(), eos = tok.eos_id();
  nlohmann::ordered_json tc{{"tokenizer_class", t.kind == "sentencepiece" ? "LlamaTokenizer" : "PreTrainedTokenizerFast"},
                            {"bos_token", spelled(bos)},
                            {"eos_token", spelled(eos)},
                            {"model_max_length", seq_len},
                            {"clean_up_tokenization_spaces", false}};
  if (t.kind == "sentencepiece") tc["add_bos_token"] = tok.bos_id() >= 0, tc["add_eos_token"] = false, tc["legacy"] = true;
  out.push_back({"tokenizer_config.json", tc.dump(2) + "\n"});
  nlohmann::ordered_json gen{{"bos_token_id", bos >= 0 ? nlohmann::ordered_json(bos) : nullptr},
                             {"eos_token_id", eos >= 0 ? nlohmann::ordered_json(eos) : nullptr}};
  out.push_back({"generation_config.json", gen.dump(2) + "\n"});
  config["bos_token_id"] = gen["bos_token_id"];
  config["eos_token_id"] = gen["eos_token_id"];
  return out;
}

}  // namespace zero3d
