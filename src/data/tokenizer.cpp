// data/tokenizer.cpp: the byte-level tokenizer and the choice of a tokenizer by its file.
#include "data/tokenizer.h"

#include "core/check.h"

namespace zero3d {

namespace {

// Token = byte, vocabulary 256, no special tokens: the shipped corpus's tokenizer. Lossless.
class ByteTokenizer final : public Tokenizer {
 public:
  const char* kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) s += static_cast<char>(id);
      else s += "<" + std::to_string(id) + ">";
    }
    return s;
  }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  throw UserError(strprintf("tokenizer '%s': only \"byte\" is implemented so far", spec.c_str()));
}

}  // namespace zero3d
