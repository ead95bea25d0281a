// Token files and the data loader: prepare -> TokenFile -> DataLoader round trip, every user error
// the loader reports, the seeded permutation, and that the set of sequences in a global batch
// does not depend on how it is split into loads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/loader.h"

namespace fs = std::filesystem;
using namespace zero3d;

namespace {

// A fresh directory per test, removed afterwards.
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("zero3d_test_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // A token file with an arbitrary header and token payload (for crafting broken files).
  std::string write_raw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                        const std::vector<uint16_t>& tokens) const {
    std::vector<int32_t> header(kTokenFileHeaderInts, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
    out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
    return path(name);
  }

  fs::path dir_;
};

// Runs f, expects a UserError whose message contains every one of `parts`.
template <class F>
void expect_user_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected a UserError containing '" << parts.front() << "'";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

std::vector<uint16_t> iota_tokens(size_t n, int vocab) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((i * 7 + 3) % vocab);
  return t;
}

// The full permutation of one epoch, read back through load(): position in the file of each sample.
std::vector<uint64_t> epoch_order(DataLoader& dl, uint64_t epoch, int T, const std::vector<uint16_t>& tokens) {
  const uint64_t S = dl.num_sequences();
  std::vector<int32_t> in(T), tg(T);
  std::vector<uint64_t> order;
  for (uint64_t i = 0; i < S; ++i) {
    dl.load(epoch * S + i, 1, in.data(), tg.data());
    // Sequences are identified by their first T+1 tokens; the test files make that unique.
    uint64_t found = S;
    for (uint64_t s = 0; s < S; ++s) {
      if (std::equal(in.begin(), in.end(), tokens.begin() + s * T) && tg[T - 1] == tokens[s * T + T]) {
        found = s;
        break;
      }
    }
    order.push_back(found);
  }
  return order;
}

// Token i = i, so a sequence is identified by its first input token.
std::vector<uint16_t> counting_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i);
  return t;
}

}  // namespace

TEST_F(DataTest, PrepareRoundTrip) {
  const std::string a = write_text("a.txt", "hello, world\n");
  const std::string b = write_text("b.txt", std::string("\x00\xff\x80 bytes", 9));
  const std::string out = path("tok.bin");
  const uint64_t n = prepare_token_file({a, b}, out);
  const std::string text = std::string("hello, world\n") + std::string("\x00\xff\x80 bytes", 9);
  ASSERT_EQ(n, text.size());
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  EXPECT_EQ(fs::file_size(out), kTokenFileHeaderInts * 4 + 2 * text.size());

  TokenFile tf(out, 256);
  ASSERT_EQ(tf.num_tokens(), text.size());
  std::vector<uint16_t> tokens(text.size());
  tf.read(0, tokens.size(), tokens.data());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(tokens[i], static_cast<unsigned char>(text[i])) << i;

  // T = 4: S = (22 - 1) / 4 = 5 sequences, file order when unshuffled.
  DataLoader dl(out, 4, 256, 1234, false);
  ASSERT_EQ(dl.num_sequences(), 5u);
  std::vector<int32_t> in(5 * 4), tg(5 * 4);
  dl.load(0, 5, in.data(), tg.data());
  for (int k = 0; k < 5; ++k)
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[k * 4 + t], static_cast<unsigned char>(text[k * 4 + t]));
      EXPECT_EQ(tg[k * 4 + t], static_cast<unsigned char>(text[k * 4 + t + 1]));
    }
  // Unshuffled wraps around: sample 7 is sequence 2.
  std::vector<int32_t> in1(4), tg1(4);
  dl.load(7, 1, in1.data(), tg1.data());
  EXPECT_TRUE(std::equal(in1.begin(), in1.end(), in.begin() + 2 * 4));
}

TEST_F(DataTest, TargetsAreInputsShiftedByOne) {
  const auto tokens = counting_tokens(1 + 16 * 10);
  const std::string f = write_raw("c.bin", kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(tokens.size()), tokens);
  DataLoader dl(f, 16, 1024, 7, true);
  ASSERT_EQ(dl.num_sequences(), 10u);
  std::vector<int32_t> in(10 * 16), tg(10 * 16);
  dl.load(3, 10, in.data(), tg.data());
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(in[k * 16] % 16, 0);  // every sequence starts on a multiple of T
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(tg[k * 16 + t], in[k * 16 + t] + 1);
      if (t + 1 < 16) {
        EXPECT_EQ(in[k * 16 + t + 1], tg[k * 16 + t]);
      }
    }
  }
}

TEST_F(DataTest, LargerThanPromisedUsesOnlyCount) {
  const auto tokens = counting_tokens(100);
  const std::string f = write_raw("big.bin", kTokenFileMagic, kTokenFileVersion, 50, tokens);
  TokenFile tf(f, 256);
  EXPECT_EQ(tf.num_tokens(), 50u);
  DataLoader dl(f, 7, 256, 0, false);
  EXPECT_EQ(dl.num_sequences(), 7u);  // (50 - 1) / 7
}

TEST_F(DataTest, MissingFile) {
  const std::string f = path("nope.bin");
  expect_user_error([&] { TokenFile tf(f, 256); }, {"cannot open token file '" + f + "'", "No such file"});
}

TEST_F(DataTest, ForeignFile) {
  const std::string f = write_raw("foreign.bin", 12345, 1, 10, iota_tokens(10, 256));
  expect_user_error([&] { TokenFile tf(f, 256); },
                    {"'" + f + "' is not an llm.c token file", "magic 12345", "expected 20240520"});
  // Shorter than the header: a text file passed by mistake.
  const std::string t = write_text("short.txt", "not a token file\n");
  expect_user_error([&] { TokenFile tf(t, 256); }, {"'" + t + "' is not an llm.c token file", "1024-byte header"});
  const std::string e = write_text("empty.bin", "");
  expect_user_error([&] { TokenFile tf(e, 256); }, {"'" + e + "' is not an llm.c token file"});
}

TEST_F(DataTest, WrongVersion) {
  const std::string f = write_raw("v2.bin", kTokenFileMagic, 2, 10, iota_tokens(10, 256));
  expect_user_error([&] { TokenFile tf(f, 256); }, {"'" + f + "'", "version 2", "version 1"});
}

TEST_F(DataTest, TruncatedFile) {
  const std::string f = write_raw("trunc.bin", kTokenFileMagic, kTokenFileVersion, 100, iota_tokens(60, 256));
  expect_user_error([&] { TokenFile tf(f, 256); },
                    {"'" + f + "' is truncated", "header promises 100 tokens (1224 bytes)", "the file has 1144 bytes"});
  // A corrupt negative count is reported as truncation, not as a huge allocation.
  const std::string g = write_raw("neg.bin", kTokenFileMagic, kTokenFileVersion, -1, iota_tokens(10, 256));
  expect_user_error([&] { TokenFile tf(g, 256); }, {"'" + g + "' is truncated"});
}

TEST_F(DataTest, TokenOutOfVocabulary) {
  auto tokens = iota_tokens(40, 256);
  tokens[17] = 300;
  tokens[30] = 999;
  const std::string f = write_raw("vocab.bin", kTokenFileMagic, kTokenFileVersion, 40, tokens);
  expect_user_error([&] { TokenFile tf(f, 256); },
                    {"'" + f + "' holds token id 300 at position 17, but model.vocab_size is 256"});
  EXPECT_NO_THROW(TokenFile(f, 1000));
  expect_user_error([&] { DataLoader dl(f, 4, 256, 0, true); }, {"token id 300"});
}

TEST_F(DataTest, TooFewTokensForOneSequence) {
  const std::string f = write_raw("tiny.bin", kTokenFileMagic, kTokenFileVersion, 8, iota_tokens(8, 256));
  expect_user_error([&] { DataLoader dl(f, 8, 256, 0, true); }, {"'" + f + "'", "8 tokens", "9"});
  EXPECT_NO_THROW(DataLoader(f, 7, 256, 0, true));
}

TEST_F(DataTest, PrepareErrors) {
  const std::string good = write_text("good.txt", "abc");
  const std::string missing = path("missing.txt");
  const std::string out = path("out.bin");
  expect_user_error([&] { prepare_token_file({good, missing}, out); }, {"'" + missing + "'"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  const std::string nodir = path("no/such/dir");
  expect_user_error([&] { prepare_token_file({good}, nodir + "/out.bin"); }, {"'" + nodir + "'"});

  // A failed rename (the target is a non-empty directory) leaves no temp file behind.
  const std::string blocked = path("blocked");
  fs::create_directories(blocked + "/x");
  expect_user_error([&] { prepare_token_file({good}, blocked); }, {"'" + blocked + "'"});
  EXPECT_FALSE(fs::exists(blocked + ".tmp"));
}

TEST_F(DataTest, PermutationIsSeededPerEpoch) {
  constexpr int T = 4;
  constexpr uint64_t S = 50;
  const auto tokens = counting_tokens(S * T + 1);
  const std::string f = write_raw("p.bin", kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(tokens.size()), tokens);
  DataLoader a(f, T, 1024, 42, true), b(f, T, 1024, 42, true), c(f, T, 1024, 43, true);
  ASSERT_EQ(a.num_sequences(), S);

  const auto a0 = epoch_order(a, 0, T, tokens);
  const auto a1 = epoch_order(a, 1, T, tokens);
  std::vector<uint64_t> sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t s = 0; s < S; ++s) ASSERT_EQ(sorted[s], s);  // a permutation of [0, S)
  sorted = a1;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t s = 0; s < S; ++s) ASSERT_EQ(sorted[s], s);

  EXPECT_NE(a0, a1);                           // epochs differ
  EXPECT_NE(a0, epoch_order(c, 0, T, tokens));  // seeds differ
  // Same seed, same order, whatever was loaded before (b reads epoch 1 first, then epoch 0).
  EXPECT_EQ(a1, epoch_order(b, 1, T, tokens));
  EXPECT_EQ(a0, epoch_order(b, 0, T, tokens));
  std::vector<uint64_t> identity(S);
  for (uint64_t s = 0; s < S; ++s) identity[s] = s;
  EXPECT_NE(a0, identity);
  DataLoader plain(f, T, 1024, 42, false);
  EXPECT_EQ(epoch_order(plain, 3, T, tokens), identity);
}

// Fixed expected order for one seed: the permutation must not change across compilers, standard
// libraries or refactors, or resumed runs would read different data.
TEST_F(DataTest, PermutationIsPortable) {
  constexpr int T = 1;
  constexpr uint64_t S = 10;
  const auto tokens = counting_tokens(S * T + 1);
  const std::string f = write_raw("q.bin", kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(tokens.size()), tokens);
  DataLoader dl(f, T, 1024, 1337, true);
  std::vector<int32_t> in(S), tg(S);
  dl.load(0, S, in.data(), tg.data());
  // From an independent Python transcription of splitmix64 + Fisher-Yates.
  const std::vector<int32_t> expected = {4, 5, 2, 1, 8, 6, 7, 9, 3, 0};
  EXPECT_EQ(in, expected);
}

TEST_F(DataTest, GlobalBatchIsLayoutIndependent) {
  constexpr int T = 8;
  constexpr uint64_t S = 13;  // not a multiple of the batch: batches straddle epochs
  const auto tokens = counting_tokens(S * T + 1);
  const std::string f = write_raw("l.bin", kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(tokens.size()), tokens);
  for (uint64_t step = 0; step < 6; ++step) {
    const uint64_t first = step * 8;
    DataLoader one(f, T, 1024, 99, true), four(f, T, 1024, 99, true);
    std::vector<int32_t> in(8 * T), tg(8 * T);
    one.load(first, 8, in.data(), tg.data());
    std::multiset<int32_t> whole;
    for (int k = 0; k < 8; ++k) whole.insert(in[k * T]);
    // Four dp ranks of micro-batch 2, each its own loader, in an arbitrary order.
    std::multiset<int32_t> split;
    for (int r : {2, 0, 3, 1}) {
      std::vector<int32_t> in2(2 * T), tg2(2 * T);
      four.load(first + 2 * r, 2, in2.data(), tg2.data());
      for (int k = 0; k < 2; ++k) split.insert(in2[k * T]);
    }
    EXPECT_EQ(whole, split) << "step " << step;
  }
}

TEST(DataShipped, CorpusOpensWithByteVocabulary) {
  for (const char* name : {"train.bin", "val.bin"}) {
    const std::string f = std::string(ZERO3D_SOURCE_DIR) + "/input/data/" + name;
    TokenFile tf(f, 256);
    EXPECT_GT(tf.num_tokens(), 100000u) << f;
    DataLoader dl(f, 64, 256, 0, true);
    EXPECT_GT(dl.num_sequences(), 1000u) << f;
  }
}
