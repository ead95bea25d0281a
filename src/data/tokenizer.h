// data/tokenizer.h: text <-> token ids, one interface for every tokenizer zero3d reads.
// A tokenizer is chosen by a file (load_tokenizer): a Hugging Face `tokenizer.json` (byte-level
// BPE: GPT-2, Llama 3, Mistral-Nemo, Qwen), a SentencePiece `tokenizer.model` (Llama 2, Mistral,
// TinyLlama), or "byte" (token = byte, vocabulary 256: the shipped corpus's).
//
// Invariant: encode() reads text as *ordinary* text, as llm.c's data scripts and tiktoken's
// encode_ordinary do: a special token's spelling inside the text ("<|endoftext|>") is text, never
// the special id; special ids are placed by the caller (data prepare, generate). Bytes that are
// not UTF-8 read as U+FFFD, one per maximal invalid subpart (WHATWG, Python's errors="replace"),
// so ids equal those of references that take strings; "byte" keeps every byte.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero3d {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte", "bpe" (tokenizer.json) or "sentencepiece" (tokenizer.model).
  virtual const char* kind() const = 0;
  // One past the largest id, added and special tokens included: a model's vocab_size must be at least this.
  virtual int vocab_size() const = 0;
  // Appends the ids of `text` (ordinary text: see above) to `out`. Thread-safe: const, no shared mutable state.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The text of `ids`; special tokens as their spelling; an id outside the vocabulary as "<id>".
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Special ids, -1 where the tokenizer has none. bos: begins a sequence (Llama 3 <|begin_of_text|>,
  // SentencePiece <s>); eos: ends one (GPT-2 <|endoftext|>, Llama 3 <|end_of_text|>, </s>).
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  // The token data prepare writes before every document, as llm.c's scripts do: bos where the
  // tokenizer has one, else eos; -1 for "byte" (documents are concatenated).
  int document_separator() const { return bos_id() >= 0 ? bos_id() : eos_id(); }
  // One document as the training data holds it: the separator (where there is one), then its ids.
  // data prepare writes documents so; eval --text and generate's prompt read text so.
  void encode_document(std::string_view text, std::vector<int32_t>& out) const {
    if (const int sep = document_separator(); sep >= 0) out.push_back(sep);
    encode(text, out);
  }
};

// The tokenizer `spec` names: "byte", or a file (a Hugging Face tokenizer.json, recognised by its
// JSON content; a SentencePiece model, by its protobuf content), or a directory holding one
// (tokenizer_file below). Throws UserError naming the file
// and what is wrong (missing, unreadable, another tokenizer type such as WordPiece, a model type
// or pre-tokenizer it does not implement: refused by name, never approximated).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);
// The two halves of loading a file, for a caller that hashes what it loads: the bytes of the file
// (UserError naming it: missing, unreadable), and the tokenizer in them (`path` names it in errors).
std::string read_tokenizer_file(const std::string& path);
std::unique_ptr<Tokenizer> load_tokenizer_bytes(const std::string& path, const std::string& bytes);

// The file `spec` names: spec itself, or in a directory (a model as the hub ships it) its
// tokenizer.json, else its tokenizer.model; "byte" as is. UserError for a directory with neither.
std::string tokenizer_file(const std::string& spec);

}  // namespace zero3d
