// data/tokenizer_impl.h: what the tokenizer files share, internal to src/data (tokenizer.h is the
// interface). load_tokenizer (tokenizer.cpp) picks a loader by the file's content; each loader
// refuses what it does not implement by name.
// Invariant: every encoder reads text through utf8_replace_invalid first, so it sees valid UTF-8
// whatever the input (the contract of tokenizer.h: U+FFFD per maximal invalid subpart).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "data/tokenizer.h"

namespace zero3d {

// `text` when it is valid UTF-8 (no copy: `scratch` untouched); else `scratch`, filled with text
// whose invalid parts are each one U+FFFD (the maximal subparts of Unicode 15 section 3.9, as
// WHATWG's TextDecoder and Python's errors="replace" do), and a view of it.
std::string_view utf8_replace_invalid(std::string_view text, std::string& scratch);

// A Hugging Face tokenizer.json (its text already read): byte-level BPE (tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const std::string& json_text);

// A SentencePiece model file (its bytes already read): libsentencepiece (tokenizer_spm.cpp).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& bytes);

}  // namespace zero3d
