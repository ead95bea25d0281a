// data/tokenizer_spm.cpp: a SentencePiece model (tokenizer.model: Llama 2, Mistral, TinyLlama)
// through libsentencepiece, the library its authors ship (Debian's libsentencepiece-dev), so ids
// are the model's by construction. bos/eos are the model's own (-1 where it disables them).
// Decode spells control tokens (<s>, </s>), which the library's Decode drops, as their pieces.
//
// Speed: the library encodes a long text several times slower per byte than a short one (0.8 vs
// 2.2 MB/s at 10 KB vs 1 KB), and a word's ids recur. So a text is cut into words at each single
// space between two ASCII letters or digits, each word's ids memoized (PieceCache), where that is
// exact: no piece of the model holds the whitespace mark U+2581 after another character than the
// mark (so none spans "x_y": BPE merges and unigram paths stay inside words; Llama 2's runs of
// marks are fine) and its normalizer spells "a b" as "_a_b" (dummy prefix on, whitespace escaped,
// not as suffix). Then "x y" encodes as "x" then "y": the dummy prefix of the second word is the
// mark its space would have become.
#include <sentencepiece_processor.h>

#include "core/check.h"
#include "data/tokenizer.h"
#include "data/tokenizer_impl.h"

namespace zero3d {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& bytes) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      throw UserError(strprintf("tokenizer '%s' is not a SentencePiece model (%s): give a tokenizer.json, a "
                                "tokenizer.model, or \"byte\"", path.c_str(), status.ToString().c_str()));
    cut_at_spaces_ = words_stay_whole();
  }
  const char* kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  int bos_id() const override { return sp_.bos_id(); }
  int eos_id() const override { return sp_.eos_id(); }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::string repaired;
    const std::string_view t = utf8_replace_invalid(text, repaired);
    if (!cut_at_spaces_) return encode_piece(t, out);
    PieceCache& cache = PieceCache::for_thread(serial_);
    auto encode = [this](std::string_view piece, std::vector<int32_t>& ids) { encode_piece(piece, ids); };
    size_t begin = 0;
    while (begin < t.size()) {
      const size_t end = next_cut(t, begin);
      cache.encode(t.substr(begin, end - begin), out, encode);
      begin = end == t.size() ? end : end + 1;  // the space at a cut is the next word's dummy prefix
    }
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string s, part;
    std::vector<int> run;  // ids the library decodes, between the ones spelled here
    auto flush = [&] {
      if (run.empty()) return;
      const auto status = sp_.Decode(run, &part);
      if (!status.ok()) throw std::runtime_error("SentencePiece decode failed: " + status.ToString());
      s += part;
      run.clear();
    };
    const int n = sp_.GetPieceSize();
    for (int32_t id : ids) {
      if (id >= 0 && id < n && !sp_.IsControl(id)) {
        run.push_back(id);
        continue;
      }
      flush();
      if (id >= 0 && id < n) s += sp_.IdToPiece(id);
      else s.append("<").append(std::to_string(id)).append(">");
    }
    flush();
    return s;
  }

 private:
  void encode_piece(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Where the word from `begin` ends: the next space between two ASCII letters or digits, else
  // the text's end.
  static size_t next_cut(std::string_view t, size_t begin) {
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
    for (size_t i = begin + 1; i + 1 < t.size(); ++i)
      if (t[i] == ' ' && alnum(t[i - 1]) && alnum(t[i + 1])) return i;
    return t.size();
  }

  // Whether cutting at spaces is exact for this model (see the top of the file).
  bool words_stay_whole() const {
    const std::string mark = "\xE2\x96\x81";  // U+2581
    for (int id = 0; id < sp_.GetPieceSize(); ++id) {
      if (sp_.IsControl(id) || sp_.IsUnknown(id) || sp_.IsByte(id)) continue;
      const std::string& piece = sp_.IdToPiece(id);
      size_t run = 0;  // the leading marks
      while (piece.compare(run, mark.size(), mark) == 0) run += mark.size();
      if (piece.find(mark, run) != std::string::npos) return false;
    }
    std::vector<std::string> pieces;
    if (!sp_.Encode("a b", &pieces).ok()) return false;
    std::string joined;
    for (const std::string& p : pieces) joined += p;
    return joined == mark + "a" + mark + "b";
  }

  sentencepiece::SentencePieceProcessor sp_;
  bool cut_at_spaces_ = false;
  uint64_t serial_ = PieceCache::new_owner();
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& bytes) {
  return std::make_unique<SentencePieceTokenizer>(path, bytes);
}

}  // namespace zero3d
