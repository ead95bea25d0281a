// data/tokenizer_impl.h: what the tokenizer files share, internal to src/data (tokenizer.h is the
// interface). load_tokenizer (tokenizer.cpp) picks a loader by the file's content; each loader
// refuses what it does not implement by name.
// Invariant: every encoder reads text through utf8_replace_invalid first, so it sees valid UTF-8
// whatever the input (the contract of tokenizer.h: U+FFFD per maximal invalid subpart).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zero3d {

class Tokenizer;  // data/tokenizer.h

// `text` when it is valid UTF-8 (no copy: `scratch` untouched); else `scratch`, filled with text
// whose invalid parts are each one U+FFFD (the maximal subparts of Unicode 15 section 3.9, as
// WHATWG's TextDecoder and Python's errors="replace" do), and a view of it.
std::string_view utf8_replace_invalid(std::string_view text, std::string& scratch);

struct StringHash {  // lets a std::string-keyed map be searched with a string_view
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// A thread's memo of piece -> ids (a pre-token, a word), for one tokenizer at a time: most pieces
// of a text recur, and their ids depend on nothing else. Per thread, so encode() stays const and
// lock-free; bounded (emptied past 2^18 pieces: some 30 MB a thread).
class PieceCache {
 public:
  // A serial number for a tokenizer, the owner of a thread's cache while it encodes.
  static uint64_t new_owner();
  // This thread's cache, emptied first when it served another owner or grew past its bound.
  static PieceCache& for_thread(uint64_t owner);

  // Appends the ids of `piece` to out: remembered, or as encode_piece(piece, out) appends them.
  template <class F>
  void encode(std::string_view piece, std::vector<int32_t>& out, F&& encode_piece) {
    if (const auto it = pieces_.find(piece); it != pieces_.end()) {
      const int32_t* ids = ids_.data() + it->second.first;
      out.insert(out.end(), ids, ids + it->second.second);
      return;
    }
    const size_t before = out.size();
    encode_piece(piece, out);
    const auto offset = static_cast<uint32_t>(ids_.size());
    ids_.insert(ids_.end(), out.begin() + static_cast<std::ptrdiff_t>(before), out.end());
    pieces_.emplace(std::string(piece), std::make_pair(offset, static_cast<uint32_t>(out.size() - before)));
  }

 private:
  uint64_t owner_ = 0;
  StringMap<std::pair<uint32_t, uint32_t>> pieces_;  // -> (offset, count) in ids_
  std::vector<int32_t> ids_;
};

// A Hugging Face tokenizer.json (its text already read): byte-level BPE (tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const std::string& json_text);

// A SentencePiece model file (its bytes already read): libsentencepiece (tokenizer_spm.cpp).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& bytes);

}  // namespace zero3d
