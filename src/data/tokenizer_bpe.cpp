// data/tokenizer_bpe.cpp: byte-level BPE read from a Hugging Face tokenizer.json (GPT-2, Llama 3,
// Qwen, Mistral-Nemo). The pipeline is the `tokenizers` crate's, step for step:
//   text -> UTF-8 repaired -> normalizer (none, or NFC) -> pre-tokenizers (Split by a regex,
//   ByteLevel, Digits; in a Sequence) -> each pre-token's bytes merged by rank -> ids.
// Every other model, normalizer or pre-tokenizer is refused by name, never approximated.
//
// Bytes, not the byte-to-unicode spelling: the vocabulary's strings ("Ġthe") are turned back into
// the bytes they stand for (" the") at load, so a pre-token is merged as the bytes it is, and
// decoding is concatenation.
//
// Speed: the split regex runs through PCRE2's JIT; a pre-token's ids are cached per thread (most
// words recur); merging is a scan for the lowest rank over a short array, or a heap for long
// pre-tokens (a run of thousands of spaces must not cost n^2).
//
// Special ids, the rule: a TemplateProcessing post-processor (alone or in a Sequence) names them:
// a special token leading its "single" template is bos (Llama 3's <|begin_of_text|>), one ending
// it is eos; RobertaProcessing/BertProcessing give cls as bos and sep as eos. What is still
// unknown is looked up among the added special tokens by spelling: eos <|end_of_text|>,
// <|endoftext|>, </s>; bos (only where there is no template) <|begin_of_text|>, <s>.
// So GPT-2: no bos, eos <|endoftext|>; Llama 3: bos 128000, eos 128001; Qwen2: eos <|endoftext|>.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <uninorm.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "config/json_tree.h"
#include "core/check.h"
#include "data/tokenizer.h"
#include "data/tokenizer_impl.h"

namespace zero3d {

namespace {

using json = nlohmann::json;

// GPT-2's table: byte b is spelled as the code point table[b] (printable Latin-1 as itself, the
// rest as 256, 257, ... in byte order).
std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> t{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = printable ? b : next++;
  }
  return t;
}

// The bytes a byte-level spelling stands for; false if it holds a code point outside the table.
// to_byte: code point -> byte + 1 (0: not in the table), for code points below 512 (the table's
// reach is 323).
using ToByte = std::array<uint16_t, 512>;
bool unbyte(std::string_view spelling, const ToByte& to_byte, std::string& out) {
  out.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(spelling.data());
  for (size_t i = 0; i < spelling.size();) {
    uint32_t cp;
    size_t len;
    if (s[i] < 0x80) cp = s[i], len = 1;
    else if ((s[i] & 0xE0) == 0xC0) cp = s[i] & 0x1F, len = 2;
    else if ((s[i] & 0xF0) == 0xE0) cp = s[i] & 0x0F, len = 3;
    else cp = s[i] & 0x07, len = 4;
    if (i + len > spelling.size()) return false;
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    if (cp >= to_byte.size() || to_byte[cp] == 0) return false;
    out += static_cast<char>(to_byte[cp] - 1);
    i += len;
  }
  return true;
}

// Merges by pair: open addressing over (left id, right id) -> (rank, merged id).
class PairTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
  }
  void put(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    const uint64_t key = pack(a, b);
    size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    vals_[i] = (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(merged);
  }
  // (rank << 32 | merged id), or kNone.
  uint64_t get(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return vals_[i];
      if (keys_[i] == kEmpty) return kNone;
    }
  }
  static constexpr uint64_t kNone = ~0ull;

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0;
};

// One compiled pattern (UTF + UCP, JIT where PCRE2 has it). Move-only owner of the pcre2_code.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& file) {
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL refuses UCP
    const std::string p = literal ? pattern : oniguruma_to_pcre2(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), opts, &err, &at, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw UserError(strprintf("tokenizer '%s': its split regex '%s' does not compile with PCRE2 at offset %zu: %s",
                                file.c_str(), pattern.c_str(), static_cast<size_t>(at), reinterpret_cast<char*>(msg)));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(start, end) for each match in s, left to right, as Oniguruma's find_iter does (an
  // empty match is reported, then the search moves on one character).
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    thread_local struct Data {
      pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
      ~Data() { pcre2_match_data_free(md); }
    } data;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), pos, 0, data.md, nullptr)
                          : pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, data.md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw std::runtime_error(strprintf("PCRE2 match failed: %s", reinterpret_cast<char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
      f(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
      if (ov[1] > ov[0]) {
        pos = ov[1];
      } else {  // empty match: step over one UTF-8 character
        pos = ov[1] + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

 private:
  // The patterns are written for Oniguruma (the tokenizers crate) and Rust's regex (tiktoken),
  // where \s is Unicode's White_Space; PCRE2's UCP \s also takes U+180E. Say White_Space.
  static std::string oniguruma_to_pcre2(const std::string& p) {
    std::string out;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == '\\' && i + 1 < p.size()) {
        const char c = p[++i];
        if (c == 's') out += "\\p{White_Space}";
        else if (c == 'S') out += "\\P{White_Space}";
        else out += '\\', out += c;
      } else {
        out += p[i];
      }
    }
    return out;
  }
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// The tokenizers crate's SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step applied to every piece the previous step made.
struct Step {
  bool prefix_space = false;    // ByteLevel(add_prefix_space): a piece not starting with ' ' gets one
  std::shared_ptr<Regex> regex;  // else: split by this pattern
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
};

// GPT-2's pattern: ByteLevel(use_regex=true) splits with it.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const std::string& path, const json& j);

  const char* kind() const override { return "bpe"; }
  int vocab_size() const override { return vocab_size_; }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::string repaired, normalized;
    std::string_view t = utf8_replace_invalid(text, repaired);
    if (nfc_) t = nfc(t, normalized);
    pre_tokenize(0, t, PieceCache::for_thread(serial_), out);
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size_ && has_[id]) s += spelling_[id];
      else s.append("<").append(std::to_string(id)).append(">");
    }
    return s;
  }

 private:
  static std::string_view nfc(std::string_view t, std::string& out) {
    if (std::all_of(t.begin(), t.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return t;
    size_t len = 0;
    uint8_t* r = u8_normalize(UNINORM_NFC, reinterpret_cast<const uint8_t*>(t.data()), t.size(), nullptr, &len);
    if (!r) throw std::runtime_error("NFC normalization failed (out of memory)");
    out.assign(reinterpret_cast<const char*>(r), len);
    std::free(r);
    return out;
  }

  void pre_tokenize(size_t k, std::string_view piece, PieceCache& cache, std::vector<int32_t>& out) const {
    if (k == steps_.size()) return encode_word(piece, cache, out);
    const Step& st = steps_[k];
    if (st.prefix_space) {
      if (piece.empty() || piece[0] == ' ') return pre_tokenize(k + 1, piece, cache, out);
      std::string spaced = " ";
      spaced += piece;
      return pre_tokenize(k + 1, spaced, cache, out);
    }
    auto emit = [&](size_t b, size_t e) {
      if (e > b) pre_tokenize(k + 1, piece.substr(b, e - b), cache, out);
    };
    if (piece.empty()) return;
    // The pattern's matches and the gaps between them, in order, as (start, end, is_match).
    if (st.behavior == Behavior::kIsolated) {  // the common case: every segment is a piece
      size_t prev = 0;
      st.regex->for_each_match(piece, [&](size_t b, size_t e) {
        emit(prev, b);
        emit(b, e);
        prev = e;
      });
      emit(prev, piece.size());
      return;
    }
    struct Segment {
      size_t b, e;
      bool match;
    };
    std::vector<Segment> segs;
    size_t prev = 0;
    st.regex->for_each_match(piece, [&](size_t b, size_t e) {
      if (b != prev) segs.push_back({prev, b, st.invert});
      segs.push_back({b, e, !st.invert});
      prev = e;
    });
    if (prev != piece.size()) segs.push_back({prev, piece.size(), st.invert});
    std::vector<Segment> pieces;  // the crate's fold for each behavior
    bool previous_match = false;
    switch (st.behavior) {
      case Behavior::kRemoved:
        for (const Segment& s : segs)
          if (!s.match) pieces.push_back(s);
        break;
      case Behavior::kContiguous:
        for (const Segment& s : segs) {
          if (s.match == previous_match && !pieces.empty()) pieces.back().e = s.e;
          else pieces.push_back(s);
          previous_match = s.match;
        }
        break;
      case Behavior::kMergedWithPrevious:
        for (const Segment& s : segs) {
          if (s.match && !previous_match && !pieces.empty()) pieces.back().e = s.e;
          else pieces.push_back(s);
          previous_match = s.match;
        }
        break;
      case Behavior::kMergedWithNext:
        for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
          if (it->match && !previous_match && !pieces.empty()) pieces.back().b = it->b;
          else pieces.push_back(*it);
          previous_match = it->match;
        }
        std::reverse(pieces.begin(), pieces.end());
        break;
      case Behavior::kIsolated:
        break;
    }
    for (const Segment& s : pieces) emit(s.b, s.e);
  }

  void encode_word(std::string_view w, PieceCache& cache, std::vector<int32_t>& out) const {
    if (w.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(w[0])]);
      return;
    }
    cache.encode(w, out, [this](std::string_view piece, std::vector<int32_t>& ids) { merge_word(piece, ids); });
  }

  // BPE on one pre-token: start from its bytes, merge the lowest-ranked adjacent pair (the
  // leftmost of equal ranks) until no pair has a merge.
  void merge_word(std::string_view w, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
      if (const auto it = vocab_.find(w); it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const size_t n = w.size();
    if (n > 64) return merge_long(w, out);
    int32_t ids[64];
    uint64_t pair[64];  // pair[i]: merge of (ids[i], ids[i+1]), rank in the high word
    for (size_t i = 0; i < n; ++i) ids[i] = byte_id_[static_cast<unsigned char>(w[i])];
    for (size_t i = 0; i + 1 < n; ++i) pair[i] = merges_.get(ids[i], ids[i + 1]);
    size_t m = n;
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (pair[i] < pair[best]) best = i;  // lower rank wins; equal ranks keep the leftmost
      if (pair[best] == PairTable::kNone) break;
      ids[best] = static_cast<int32_t>(pair[best] & 0xFFFFFFFFu);
      for (size_t i = best + 1; i + 1 < m; ++i) ids[i] = ids[i + 1], pair[i] = pair[i + 1];
      --m;
      if (best > 0) pair[best - 1] = merges_.get(ids[best - 1], ids[best]);
      if (best + 1 < m) pair[best] = merges_.get(ids[best], ids[best + 1]);
    }
    out.insert(out.end(), ids, ids + m);
  }

  // The same merges for a long pre-token, in n log n: a heap of candidate merges by (rank,
  // position), checked against the current symbols when taken (the crate's Word::merge_all).
  void merge_long(std::string_view w, std::vector<int32_t>& out) const {
    const auto n = static_cast<int32_t>(w.size());
    struct Symbol {
      int32_t id, prev, next;
    };
    std::vector<Symbol> sym(n);
    for (int32_t i = 0; i < n; ++i) sym[i] = {byte_id_[static_cast<unsigned char>(w[i])], i - 1, i + 1 < n ? i + 1 : -1};
    struct Candidate {
      uint64_t rank_and_id;
      int32_t pos;
      bool operator>(const Candidate& o) const {
        const uint64_t r = rank_and_id >> 32, ro = o.rank_and_id >> 32;
        return r != ro ? r > ro : pos > o.pos;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto consider = [&](int32_t left) {
      const int32_t right = sym[left].next;
      if (right < 0) return;
      const uint64_t m = merges_.get(sym[left].id, sym[right].id);
      if (m != PairTable::kNone) heap.push({m, left});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      Symbol& left = sym[c.pos];
      if (left.id < 0 || left.next < 0) continue;
      const int32_t r = left.next;
      if (merges_.get(left.id, sym[r].id) != c.rank_and_id) continue;  // stale: a symbol changed since
      left.id = static_cast<int32_t>(c.rank_and_id & 0xFFFFFFFFu);
      left.next = sym[r].next;
      if (left.next >= 0) sym[left.next].prev = c.pos;
      sym[r].id = -1;
      if (left.prev >= 0) consider(left.prev);
      consider(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

  void read_model(const std::string& path, const json& model);
  void read_normalizer(const std::string& path, const json& norm);
  void read_pre_tokenizer(const std::string& path, const json& pre);
  void read_specials(const json& j);

  uint64_t serial_;
  int vocab_size_ = 0;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  bool byte_level_ = false;
  int bos_ = -1, eos_ = -1;
  std::array<int32_t, 256> byte_id_{};
  StringMap<int32_t> vocab_;  // the bytes a token stands for -> id
  PairTable merges_;
  std::vector<Step> steps_;
  std::vector<std::string> spelling_;  // id -> the bytes decode writes
  std::vector<char> has_;              // id -> whether it is in the vocabulary
  StringMap<int32_t> added_special_;   // spelling of an added special token -> id
};

std::string type_of(const json& j) {
  const auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string("(no type)");
}

BpeTokenizer::BpeTokenizer(const std::string& path, const json& j) : serial_(PieceCache::new_owner()) {
  if (!j.contains("model") || !j["model"].is_object())
    throw UserError(strprintf("tokenizer '%s' has no \"model\" object: not a Hugging Face tokenizer.json", path.c_str()));
  const json& model = j["model"];
  const std::string type = model.contains("type") ? type_of(model) : std::string("BPE");
  if (type != "BPE")
    throw UserError(strprintf("tokenizer '%s': model type '%s' is not implemented (zero3d reads byte-level BPE "
                              "tokenizer.json files and SentencePiece tokenizer.model files)",
                              path.c_str(), type.c_str()));
  read_normalizer(path, j.value("normalizer", json()));
  read_pre_tokenizer(path, j.value("pre_tokenizer", json()));
  if (!byte_level_)
    throw UserError(strprintf("tokenizer '%s': a BPE without a ByteLevel pre-tokenizer (pre_tokenizer %s) is not "
                              "implemented: zero3d reads byte-level BPE (GPT-2, Llama 3, Qwen, Mistral-Nemo); for "
                              "Llama 2 / Mistral style models give their SentencePiece tokenizer.model",
                              path.c_str(), j.value("pre_tokenizer", json()).dump().substr(0, 200).c_str()));
  read_model(path, model);
  read_specials(j);
}

void BpeTokenizer::read_model(const std::string& path, const json& model) {
  auto refuse_if = [&](bool bad, const char* key) {
    if (bad)
      throw UserError(strprintf("tokenizer '%s': BPE option %s = %s is not implemented", path.c_str(), key,
                                model[key].dump().c_str()));
  };
  refuse_if(model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0, "dropout");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    refuse_if(model.contains(key) && !model[key].is_null() && model[key] != "", key);
  refuse_if(model.value("byte_fallback", false), "byte_fallback");
  ignore_merges_ = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array())
    throw UserError(strprintf("tokenizer '%s': its BPE model needs a \"vocab\" object and a \"merges\" array", path.c_str()));

  ToByte to_byte{};
  const std::array<uint32_t, 256> table = byte_to_unicode();
  for (int b = 0; b < 256; ++b) to_byte[table[b]] = static_cast<uint16_t>(b + 1);

  const json& vocab = model["vocab"];
  int max_id = -1;
  for (const auto& [tok, idj] : vocab.items()) max_id = std::max(max_id, idj.get<int>());
  spelling_.assign(max_id + 1, std::string());
  has_.assign(max_id + 1, 0);
  vocab_.reserve(vocab.size());
  std::string bytes;
  for (const auto& [tok, idj] : vocab.items()) {
    const int id = idj.get<int>();
    if (id < 0)
      throw UserError(strprintf("tokenizer '%s': vocab token '%s' has a negative id", path.c_str(), tok.c_str()));
    if (!unbyte(tok, to_byte, bytes)) bytes = tok;  // not a byte-level spelling: decoded as written
    spelling_[id] = bytes;
    has_[id] = 1;
    vocab_.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it == vocab_.end())
      throw UserError(strprintf("tokenizer '%s': its vocabulary has no token for byte 0x%02X: not a byte-level BPE",
                                path.c_str(), b));
    byte_id_[b] = it->second;
  }

  const json& merges = model["merges"];
  merges_.reserve(merges.size());
  std::string a, b;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw UserError(strprintf("tokenizer '%s': merge %zu '%s' is not two tokens separated by one space",
                                  path.c_str(), r, s.c_str()));
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      throw UserError(strprintf("tokenizer '%s': merge %zu is %s, not \"a b\" or [\"a\", \"b\"]", path.c_str(), r,
                                m.dump().substr(0, 80).c_str()));
    }
    if (!unbyte(left, to_byte, a)) a = left;
    if (!unbyte(right, to_byte, b)) b = right;
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      throw UserError(strprintf("tokenizer '%s': merge %zu ('%s' '%s') names a token not in the vocabulary",
                                path.c_str(), r, left.c_str(), right.c_str()));
    merges_.put(ia->second, ib->second, static_cast<uint32_t>(r), iab->second);  // a repeated pair: the last wins, as in the crate
  }
  vocab_size_ = max_id + 1;
}

void BpeTokenizer::read_normalizer(const std::string& path, const json& norm) {
  if (norm.is_null()) return;
  const std::string type = type_of(norm);
  if (type == "NFC") {
    nfc_ = true;
  } else if (type == "Sequence" && norm.contains("normalizers") && norm["normalizers"].is_array()) {
    for (const json& n : norm["normalizers"]) read_normalizer(path, n);
  } else {
    throw UserError(strprintf("tokenizer '%s': normalizer '%s' is not implemented (zero3d implements none and NFC)",
                              path.c_str(), type.c_str()));
  }
}

void BpeTokenizer::read_pre_tokenizer(const std::string& path, const json& pre) {
  if (pre.is_null()) return;
  const std::string type = type_of(pre);
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const json& p : pre["pretokenizers"]) read_pre_tokenizer(path, p);
  } else if (type == "ByteLevel") {
    byte_level_ = true;
    if (pre.value("add_prefix_space", false)) steps_.push_back(Step{true, nullptr, Behavior::kIsolated, false});
    if (pre.value("use_regex", true))
      steps_.push_back(Step{false, std::make_shared<Regex>(kGpt2Pattern, false, path), Behavior::kIsolated, false});
  } else if (type == "Split") {
    const json pattern = pre.value("pattern", json());
    std::shared_ptr<Regex> re;
    if (pattern.contains("Regex") && pattern["Regex"].is_string())
      re = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), false, path);
    else if (pattern.contains("String") && pattern["String"].is_string())
      re = std::make_shared<Regex>(pattern["String"].get<std::string>(), true, path);
    else
      throw UserError(strprintf("tokenizer '%s': Split pattern %s is neither {\"Regex\": ...} nor {\"String\": ...}",
                                path.c_str(), pattern.dump().c_str()));
    const std::string behavior = pre.value("behavior", std::string("Isolated"));
    static const std::unordered_map<std::string, Behavior> kBehaviors = {
        {"Removed", Behavior::kRemoved}, {"Isolated", Behavior::kIsolated},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious}, {"MergedWithNext", Behavior::kMergedWithNext},
        {"Contiguous", Behavior::kContiguous}};
    const auto it = kBehaviors.find(behavior);
    if (it == kBehaviors.end())
      throw UserError(strprintf("tokenizer '%s': Split behavior '%s' is unknown (Removed, Isolated, "
                                "MergedWithPrevious, MergedWithNext, Contiguous)", path.c_str(), behavior.c_str()));
    steps_.push_back(Step{false, re, it->second, pre.value("invert", false)});
  } else if (type == "Digits") {
    // The crate splits on char::is_numeric (categories Nd, Nl, No): each digit, or each run.
    const bool each = pre.value("individual_digits", false);
    steps_.push_back(Step{false, std::make_shared<Regex>(each ? "\\p{N}" : "\\p{N}+", false, path), Behavior::kIsolated, false});
  } else {
    throw UserError(strprintf("tokenizer '%s': pre-tokenizer '%s' is not implemented (zero3d implements ByteLevel, "
                              "Split, Digits and Sequence of them)", path.c_str(), type.c_str()));
  }
}

void BpeTokenizer::read_specials(const json& j) {
  for (const json& t : j.value("added_tokens", json::array())) {
    const int id = t.value("id", -1);
    const std::string content = t.value("content", std::string());
    if (id < 0) continue;
    if (id >= vocab_size_) {
      vocab_size_ = id + 1;
      spelling_.resize(vocab_size_);
      has_.resize(vocab_size_, 0);
    }
    spelling_[id] = content;  // an added token is spelled as its content
    has_[id] = 1;
    if (t.value("special", false)) added_special_.emplace(content, id);
  }
  auto id_of = [&](const std::string& name) {
    const auto it = added_special_.find(name);
    if (it != added_special_.end()) return it->second;
    const auto iv = vocab_.find(name);
    return iv != vocab_.end() ? iv->second : -1;
  };
  // The post-processor: TemplateProcessing (maybe inside a Sequence), or Roberta/Bert's cls and sep.
  bool has_template = false;
  std::function<void(const json&)> visit = [&](const json& p) {
    if (!p.is_object()) return;
    const std::string type = type_of(p);
    if (type == "Sequence") {
      for (const json& q : p.value("processors", json::array())) visit(q);
    } else if (type == "TemplateProcessing" && p.contains("single") && p["single"].is_array()) {
      has_template = true;
      const json& single = p["single"];
      auto special = [&](const json& item) -> int {
        if (!item.contains("SpecialToken")) return -1;
        const std::string name = item["SpecialToken"].value("id", std::string());
        const json sp = p.value("special_tokens", json::object());
        if (sp.contains(name) && sp[name].contains("ids") && sp[name]["ids"].size() == 1) return sp[name]["ids"][0].get<int>();
        return id_of(name);
      };
      if (!single.empty()) {
        bos_ = special(single.front());
        if (single.size() > 1) eos_ = special(single.back());
      }
    } else if ((type == "RobertaProcessing" || type == "BertProcessing") && p.contains("cls") && p.contains("sep")) {
      has_template = true;
      bos_ = p["cls"][1].get<int>();
      eos_ = p["sep"][1].get<int>();
    }
  };
  visit(j.value("post_processor", json()));
  auto first_of = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (const auto it = added_special_.find(std::string_view(n)); it != added_special_.end()) return it->second;
    return -1;
  };
  if (eos_ < 0) eos_ = first_of({"<|end_of_text|>", "<|endoftext|>", "</s>"});
  if (bos_ < 0 && !has_template) bos_ = first_of({"<|begin_of_text|>", "<s>"});
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const std::string& json_text) {
  const json j = config_json::parse_text(json_text, strprintf("tokenizer '%s'", path.c_str()));
  try {
    return std::make_unique<BpeTokenizer>(path, j);
  } catch (const json::exception& e) {  // a key of the wrong type
    throw UserError(strprintf("tokenizer '%s': unexpected content: %s", path.c_str(), e.what()));
  }
}

}  // namespace zero3d
