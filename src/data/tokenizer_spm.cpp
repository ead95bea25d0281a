// data/tokenizer_spm.cpp: a SentencePiece model (tokenizer.model: Llama 2, Mistral, TinyLlama)
// through libsentencepiece, the library its authors ship (Debian's libsentencepiece-dev), so ids
// are the model's by construction. bos/eos are the model's own (-1 where it disables them).
// Decode spells control tokens (<s>, </s>), which the library's Decode drops, as their pieces.
#include <sentencepiece_processor.h>

#include "core/check.h"
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
  }
  const char* kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  int bos_id() const override { return sp_.bos_id(); }
  int eos_id() const override { return sp_.eos_id(); }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::string repaired;
    const std::string_view t = utf8_replace_invalid(text, repaired);
    std::vector<int> ids;
    const auto status = sp_.Encode(t, &ids);
    if (!status.ok()) throw std::runtime_error("SentencePiece encode failed: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
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
      s += id >= 0 && id < n ? sp_.IdToPiece(id) : "<" + std::to_string(id) + ">";
    }
    flush();
    return s;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& path, const std::string& bytes) {
  return std::make_unique<SentencePieceTokenizer>(path, bytes);
}

}  // namespace zero3d
