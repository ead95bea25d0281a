// data/tokenizer.cpp: the byte-level tokenizer, the UTF-8 repair every other encoder reads text
// through, and the choice of a tokenizer by its file's content.
#include "data/tokenizer.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "core/check.h"
#include "data/tokenizer_impl.h"

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
      else s.append("<").append(std::to_string(id)).append(">");
    }
    return s;
  }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
};

// Length of the well-formed UTF-8 sequence at s[0..n) (1..4), or 0 where it is not well formed;
// then *bad is the length of its maximal subpart (1..3): the bytes one U+FFFD replaces.
size_t utf8_sequence(const unsigned char* s, size_t n, size_t* bad) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (Unicode Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < len && i < n; ++i) {
    const unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
    if (s[i] < lo_i || s[i] > hi_i) break;
  }
  if (i == len) return len;
  *bad = i;
  return 0;
}

}  // namespace

std::string_view utf8_replace_invalid(std::string_view text, std::string& scratch) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0, bad = 0;
  // Fast scan: ASCII eight bytes at a time, then whole sequences, until the first invalid one.
  for (;;) {
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) return text;
    const size_t len = utf8_sequence(s + i, n - i, &bad);
    if (len == 0) break;
    i += len;
  }
  scratch.assign(text.data(), i);
  while (i < n) {
    const size_t len = utf8_sequence(s + i, n - i, &bad);
    if (len) {
      scratch.append(text.data() + i, len);
      i += len;
    } else {
      scratch += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    }
  }
  return scratch;
}

uint64_t PieceCache::new_owner() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

PieceCache& PieceCache::for_thread(uint64_t owner) {
  thread_local PieceCache cache;
  if (cache.owner_ != owner || cache.pieces_.size() > (1u << 18)) {
    cache.pieces_.clear();
    cache.ids_.clear();
    cache.owner_ = owner;
  }
  return cache;
}

std::string tokenizer_file(const std::string& spec) {
  struct stat st {};
  if (spec == "byte" || ::stat(spec.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return spec;
  for (const char* name : {"/tokenizer.json", "/tokenizer.model"})
    if (::stat((spec + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) return spec + name;
  throw UserError(strprintf("tokenizer '%s' is a directory without a tokenizer.json or tokenizer.model", spec.c_str()));
}

std::string read_tokenizer_file(const std::string& spec) {
  struct stat st {};
  if (::stat(spec.c_str(), &st) != 0)
    throw UserError(strprintf("tokenizer '%s': %s (give a tokenizer.json, a SentencePiece tokenizer.model, or \"byte\")",
                              spec.c_str(), strerror(errno)));
  std::ifstream f(spec, std::ios::binary);
  std::stringstream buf;
  buf << f.rdbuf();
  if (!f) throw UserError(strprintf("tokenizer '%s': cannot read it: %s", spec.c_str(), strerror(errno)));
  return buf.str();
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& given) {
  if (given == "byte") return std::make_unique<ByteTokenizer>();
  const std::string spec = tokenizer_file(given);
  return load_tokenizer_bytes(spec, read_tokenizer_file(spec));
}

std::unique_ptr<Tokenizer> load_tokenizer_bytes(const std::string& spec, const std::string& bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') return load_hf_tokenizer(spec, bytes);
  // A SentencePiece ModelProto starts with field 1 (pieces, length-delimited): tag byte 0x0A.
  if (!bytes.empty() && bytes[0] == '\x0A') return load_sentencepiece_tokenizer(spec, bytes);
  throw UserError(strprintf("tokenizer '%s' is neither a Hugging Face tokenizer.json (JSON) nor a SentencePiece "
                            "model (protobuf): give a tokenizer.json, a tokenizer.model, or \"byte\"",
                            spec.c_str()));
}

}  // namespace zero3d
