// Tokenizers on small handmade tokenizer.json files whose ids are worked out by hand: merges by
// rank (leftmost of equals; the long-word heap path equal to the short-word scan), both merge
// forms, ignore_merges, the Split behaviors, Digits, ByteLevel's prefix space, NFC, invalid UTF-8
// as U+FFFD per maximal subpart, special ids and decoding; and every refusal named. The real
// GPT-2 and Llama 3 files against tiktoken and @huggingface/tokenizers: tests/cli/test_tokenizers.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/tokenizer.h"
#include "data/tokenizer_impl.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace zero3d;

namespace {

// GPT-2's byte spelling, written out again here: printable Latin-1 as itself, the rest 256, 257...
std::string spell(unsigned char b) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t next = 256;
    for (uint32_t c = 0; c < 256; ++c)
      t[c] = ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174)) ? c : next++;
    return t;
  }();
  const uint32_t cp = table[b];
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}
std::string spell(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += spell(b);
  return s;
}

// A byte-level BPE: ids 0..255 are the bytes; then `merges` (byte strings, rank = order), each
// adding the merged token with the next id; then `extra` tokens.
json bpe_json(const std::vector<std::pair<std::string, std::string>>& merges, const std::vector<std::string>& extra = {},
              bool array_form = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell(static_cast<unsigned char>(b))] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(spell(a + b))) vocab[spell(a + b)] = next++;
    if (array_form) m.push_back(json::array({spell(a), spell(b)}));
    else m.push_back(spell(a) + " " + spell(b));
  }
  for (const std::string& e : extra) vocab[spell(e)] = next++;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"normalizer", nullptr}, {"added_tokens", json::array()}};
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("zero3d_test_tokenizer_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::unique_ptr<Tokenizer> load(const json& j) { return load_tokenizer(write("tokenizer.json", j.dump())); }

  fs::path dir_;
};

std::vector<int32_t> ids(const Tokenizer& t, std::string_view text) {
  std::vector<int32_t> out;
  t.encode(text, out);
  return out;
}
std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

template <class F>
void expect_user_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, MergesByRankLeftmostFirst) {
  // ids: ab 256, abc 257, bc 258, aa 259
  const auto t = load(bpe_json({{"a", "b"}, {"ab", "c"}, {"b", "c"}, {"a", "a"}}));
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(ids(*t, "abc"), (std::vector<int32_t>{257}));       // (a,b) rank 0, then (ab,c) rank 1
  EXPECT_EQ(ids(*t, "bca"), (std::vector<int32_t>{258, 'a'}));  // (b,c) rank 2
  EXPECT_EQ(ids(*t, "aaa"), (std::vector<int32_t>{259, 'a'}));  // equal ranks: the leftmost first
  EXPECT_EQ(ids(*t, "xyz"), bytes_of("xyz"));
  // The same file with merges as [a, b] arrays.
  const auto t2 = load(bpe_json({{"a", "b"}, {"ab", "c"}, {"b", "c"}, {"a", "a"}}, {}, true));
  EXPECT_EQ(ids(*t2, "abc bca aaa"), ids(*t, "abc bca aaa"));
}

TEST_F(TokenizerTest, LongWordsMergeAsShortOnes) {
  // aa 256, aaaa 257: 2k a's are k/2 aaaa (+ aa, + a); past 64 bytes the heap path runs.
  const auto t = load(bpe_json({{"a", "a"}, {"aa", "aa"}}));
  for (size_t n : {63, 64, 65, 66, 67, 200, 1001}) {
    std::vector<int32_t> want(n / 4, 257);
    if (n % 4 >= 2) want.push_back(256);
    if (n % 2) want.push_back('a');
    EXPECT_EQ(ids(*t, std::string(n, 'a')), want) << n;
  }
}

TEST_F(TokenizerTest, IgnoreMergesTakesAVocabularyWordWhole) {
  // ab 256, then "abd" in the vocabulary with no merge to reach it.
  json j = bpe_json({{"a", "b"}}, {"abd"});
  EXPECT_EQ(ids(*load(j), "abd"), (std::vector<int32_t>{256, 'd'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(ids(*load(j), "abd"), (std::vector<int32_t>{257}));
  EXPECT_EQ(ids(*load(j), "abdd"), (std::vector<int32_t>{256, 'd', 'd'}));
}

TEST_F(TokenizerTest, PreTokenizersSplitAsTheCrateDoes) {
  // GPT-2's regex keeps "a" and "-" apart; merges a- 256, -a 257, -- 258.
  json j = bpe_json({{"a", "-"}, {"-", "a"}, {"-", "-"}});
  EXPECT_EQ(ids(*load(j), "a-a"), bytes_of("a-a"));
  auto with_split = [&](const char* behavior, bool invert = false) {
    json k = j;
    k["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    return load(k);
  };
  EXPECT_EQ(ids(*with_split("Isolated"), "a-a--"), bytes_of("a-a--"));
  EXPECT_EQ(ids(*with_split("Removed"), "a-a--a"), bytes_of("aaa"));
  EXPECT_EQ(ids(*with_split("MergedWithPrevious"), "a-a"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(ids(*with_split("MergedWithNext"), "a-a"), (std::vector<int32_t>{'a', 257}));
  EXPECT_EQ(ids(*with_split("Contiguous"), "a--a"), (std::vector<int32_t>{'a', 258, 'a'}));
  // invert: the gaps are the delimiters ("a" merged with the next "-" ...).
  EXPECT_EQ(ids(*with_split("MergedWithNext", true), "a-a-"), (std::vector<int32_t>{256, 256}));
  // A regex Split, and Digits.
  json r = j;
  r["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Digits"}, {"individual_digits", true}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  json rj = bpe_json({{"1", "2"}, {"a", "b"}});
  rj["pre_tokenizer"] = r["pre_tokenizer"];
  EXPECT_EQ(ids(*load(rj), "12ab"), (std::vector<int32_t>{'1', '2', 257}));
  rj["pre_tokenizer"]["pretokenizers"][0]["individual_digits"] = false;
  EXPECT_EQ(ids(*load(rj), "12ab"), (std::vector<int32_t>{256, 257}));
}

TEST_F(TokenizerTest, ByteLevelPrefixSpace) {
  json j = bpe_json({{" ", "a"}});
  EXPECT_EQ(ids(*load(j), "a"), (std::vector<int32_t>{'a'}));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(ids(*load(j), "a"), (std::vector<int32_t>{256}));
  EXPECT_EQ(ids(*load(j), " a"), (std::vector<int32_t>{256}));
  EXPECT_TRUE(ids(*load(j), "").empty());
}

TEST_F(TokenizerTest, InvalidUtf8IsOneReplacementPerMaximalSubpart) {
  std::string scratch;
  auto repair = [&](std::string_view s) { return std::string(utf8_replace_invalid(s, scratch)); };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(repair("plain ascii and \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), "plain ascii and \xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(repair("\x80"), r);                               // lone continuation
  EXPECT_EQ(repair("\xC0\x80"), r + r);                       // overlong lead: each byte
  EXPECT_EQ(repair("\xED\xA0\x80"), r + r + r);               // a surrogate: ED takes only 80..9F
  EXPECT_EQ(repair("\xF4\x90\x80\x80"), r + r + r + r);       // past U+10FFFF
  EXPECT_EQ(repair("\xE2\x82" "a"), r + "a");                 // truncated: one for the subpart
  EXPECT_EQ(repair("\xF0\x9F\x98"), r);                       // cut at the end
  EXPECT_EQ(repair("ab\xFF" "cdefghijk\xFE"), "ab" + r + "cdefghijk" + r);
  // The tokenizer encodes the repaired text.
  const auto t = load(bpe_json({}));
  EXPECT_EQ(ids(*t, "a\xFF"), bytes_of("a" + r));
}

TEST_F(TokenizerTest, NfcNormalizer) {
  json j = bpe_json({});
  const auto plain = load(j);
  j["normalizer"] = {{"type", "NFC"}};
  const auto nfc = load(j);
  EXPECT_EQ(ids(*nfc, "e\xCC\x81"), bytes_of("\xC3\xA9"));  // e + U+0301 -> U+00E9
  EXPECT_EQ(ids(*plain, "e\xCC\x81"), bytes_of("e\xCC\x81"));
}

TEST_F(TokenizerTest, SpecialIdsAndDecoding) {
  json j = bpe_json({{"a", "b"}});
  j["added_tokens"] = {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}}};
  const auto gpt2 = load(j);
  EXPECT_EQ(gpt2->bos_id(), -1);
  EXPECT_EQ(gpt2->eos_id(), 300);
  EXPECT_EQ(gpt2->document_separator(), 300);
  EXPECT_EQ(gpt2->vocab_size(), 301);
  EXPECT_EQ(ids(*gpt2, "<|endoftext|>").size(), 13u);  // ordinary text: the spelling, byte by byte
  EXPECT_EQ(gpt2->decode(std::vector<int32_t>{256, 300, ' ', 999}), "ab<|endoftext|> <999>");
  // Llama 3: the template's leading special token is bos; eos by its spelling.
  j["added_tokens"] = {{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
                       {{"id", 301}, {"content", "<|end_of_text|>"}, {"special", true}}};
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [{"type": "ByteLevel"},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300]}}}]})");
  const auto llama = load(j);
  EXPECT_EQ(llama->bos_id(), 300);
  EXPECT_EQ(llama->eos_id(), 301);
  EXPECT_EQ(llama->document_separator(), 300);
  EXPECT_STREQ(llama->kind(), "bpe");
  const auto byte = load_tokenizer("byte");
  EXPECT_EQ(byte->document_separator(), -1);
  EXPECT_EQ(byte->decode(std::vector<int32_t>{'h', 'i', 256}), "hi<256>");
}

TEST_F(TokenizerTest, RefusalsAreNamed) {
  expect_user_error([&] { load_tokenizer((dir_ / "missing.json").string()); }, {"missing.json", "No such file"});
  expect_user_error([&] { load_tokenizer(dir_.string()); }, {"is a directory"});
  expect_user_error([&] { load_tokenizer(write("bad.json", "{\"model\": [")); }, {"bad.json", "invalid JSON at line 1"});
  expect_user_error([&] { load_tokenizer(write("text.txt", "hello")); }, {"text.txt", "neither"});
  expect_user_error([&] { load_tokenizer(write("bad.model", "\x0A\x03xyz")); }, {"bad.model", "not a SentencePiece model"});
  json j = bpe_json({});
  j["model"]["type"] = "WordPiece";
  expect_user_error([&] { load(j); }, {"model type 'WordPiece' is not implemented"});
  j = bpe_json({});
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_user_error([&] { load(j); }, {"pre-tokenizer 'Metaspace' is not implemented"});
  j = bpe_json({});
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_user_error([&] { load(j); }, {"normalizer 'Lowercase' is not implemented"});
  j = bpe_json({});
  j["pre_tokenizer"] = nullptr;
  expect_user_error([&] { load(j); }, {"without a ByteLevel pre-tokenizer"});
  j = bpe_json({});
  j["model"]["byte_fallback"] = true;
  expect_user_error([&] { load(j); }, {"byte_fallback"});
  j = bpe_json({});
  j["model"]["merges"] = {"x yz"};
  expect_user_error([&] { load(j); }, {"merge 0", "not in the vocabulary"});
  j = bpe_json({});
  j["model"]["vocab"].erase(spell('\n'));
  expect_user_error([&] { load(j); }, {"no token for byte 0x0A"});
  j = bpe_json({});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_user_error([&] { load(j); }, {"does not compile with PCRE2"});
}

}  // namespace
