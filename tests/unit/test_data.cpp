// Token files and the data loader: prepare -> TokenFile -> DataLoader round trip, uint16 and uint32
// files, every user error the loader reports, the seeded permutation, sets of shards (the sequence
// index, globs and lists, the order over the whole set against one file's), and that the set of
// sequences in a global batch does not depend on how it is split into loads.
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

  // A token file with an arbitrary header and token payload (for crafting broken files): uint16
  // or uint32 tokens, as the vector's type.
  template <class Tok>
  std::string write_raw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                        const std::vector<Tok>& tokens) const {
    std::vector<int32_t> header(kTokenFileHeaderInts, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
    out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(Tok));
    return path(name);
  }
  // A valid llm.c file of these tokens: uint16 (GPT-2's) or uint32 (Llama 3's).
  std::string write_u16(const std::string& name, const std::vector<uint16_t>& t) const {
    return write_raw(name, kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(t.size()), t);
  }
  std::string write_u32(const std::string& name, const std::vector<uint32_t>& t) const {
    return write_raw(name, kTokenFileMagicU32, kTokenFileVersionU32, static_cast<int32_t>(t.size()), t);
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
  std::vector<int32_t> tokens(text.size());
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
                    {"'" + f + "' is not an llm.c token file", "magic 12345", "expected 20240520", "or 20240801"});
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

// Opening checks the first kTokenFileCheckedAtOpen ids (a wrong vocabulary is refused before the
// run starts), not the whole file; every id read is checked, and one out of range is named with the
// file and its position.
TEST_F(DataTest, TokenOutOfVocabulary) {
  auto tokens = iota_tokens(40, 256);
  tokens[17] = 300;
  tokens[30] = 999;
  const std::string f = write_raw("vocab.bin", kTokenFileMagic, kTokenFileVersion, 40, tokens);
  expect_user_error([&] { TokenFile tf(f, 256); },
                    {"'" + f + "' holds token id 300 at position 17, but model.vocab_size is 256"});
  TokenFile wide(f, 1000);
  std::vector<int32_t> out(40);
  wide.read(0, 40, out.data());
  EXPECT_EQ(out[17], 300);
  EXPECT_EQ(out[30], 999);
  // Past the ids checked at open: found by the read that reaches it, and by no other.
  constexpr int T = 8;
  const uint64_t late = kTokenFileCheckedAtOpen + 5;
  auto more = iota_tokens(late + 4 * T, 256);
  more[late] = 256;
  const std::string g = write_u16("late.bin", more);
  TokenFile tf(g, 256);
  tf.read(0, late, std::vector<int32_t>(late).data());
  expect_user_error([&] { tf.read(late - 1, 2, out.data()); },
                    {"'" + g + "' holds token id 256 at position " + std::to_string(late) + ", but model.vocab_size is 256"});
  DataLoader dl(g, T, 256, 0, false);
  std::vector<int32_t> in(T), tg(T);
  dl.load(late / T - 1, 1, in.data(), tg.data());
  expect_user_error([&] { dl.load(late / T, 1, in.data(), tg.data()); }, {"token id 256"});
  // uint32: an id past 2^31 is out of range, not a negative int32.
  std::vector<uint32_t> t32(10, 5);
  t32[4] = 0x80000001u;
  const std::string h = write_u32("vocab32.bin", t32);
  expect_user_error([&] { TokenFile x(h, 70000); },
                    {"'" + h + "' holds token id 2147483649 at position 4, but model.vocab_size is 70000"});
}

// llm.c's uint32 format (its Llama 3 scripts): ids past 65535 come out as int32, through the loader too.
TEST_F(DataTest, Uint32FileRead) {
  constexpr int T = 5;
  std::vector<uint32_t> t(3 * T + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(65530 + 1000 * i);
  const std::string f = write_u32("u32.bin", t);
  const int vocab = 65530 + 1000 * static_cast<int>(t.size());
  TokenFile tf(f, vocab);
  EXPECT_EQ(tf.num_tokens(), t.size());
  EXPECT_EQ(tf.token_bytes(), 4);
  std::vector<int32_t> out(t.size());
  tf.read(0, t.size(), out.data());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(out[i], static_cast<int32_t>(t[i])) << i;
  DataLoader dl(f, T, vocab, 0, false);
  ASSERT_EQ(dl.num_sequences(), 3u);
  std::vector<int32_t> in(3 * T), tg(3 * T);
  dl.load(1, 2, in.data(), tg.data());  // sequences 1 and 2
  for (int k = 0; k < 2; ++k)
    for (int i = 0; i < T; ++i) {
      EXPECT_EQ(in[k * T + i], static_cast<int32_t>(t[(k + 1) * T + i]));
      EXPECT_EQ(tg[k * T + i], static_cast<int32_t>(t[(k + 1) * T + i + 1]));
    }
  // The uint32 format's errors: its own version, and truncation counted in 4-byte tokens.
  const std::string v = write_raw("u32v1.bin", kTokenFileMagicU32, 1, 4, std::vector<uint32_t>(4, 1));
  expect_user_error([&] { TokenFile x(v, 256); }, {"'" + v + "' is an llm.c uint32 token file of version 1", "version 7"});
  const std::string s = write_raw("u32short.bin", kTokenFileMagicU32, kTokenFileVersionU32, 10, std::vector<uint32_t>(6, 1));
  expect_user_error([&] { TokenFile x(s, 256); }, {"'" + s + "' is truncated", "header promises 10 tokens (1064 bytes)",
                                                   "the file has 1048 bytes"});
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

// ---- sets of shards ----

TEST(DataShards, LocateSequence) {
  // Shards of 3, 0, 2 and 4 sequences: the empty one is never chosen.
  const std::vector<uint64_t> first = {0, 3, 3, 5, 9};
  const std::vector<std::pair<size_t, uint64_t>> expected = {{0, 0}, {0, 1}, {0, 2}, {2, 0}, {2, 1},
                                                             {3, 0}, {3, 1}, {3, 2}, {3, 3}};
  for (uint64_t g = 0; g < 9; ++g) {
    const SequenceIndex at = locate_sequence(first, g);
    EXPECT_EQ(at.shard, expected[g].first) << g;
    EXPECT_EQ(at.sequence, expected[g].second) << g;
  }
  EXPECT_EQ(locate_sequence({0, 7}, 6).shard, 0u);  // one file: sequence g of shard 0
  EXPECT_EQ(locate_sequence({0, 7}, 6).sequence, 6u);
}

// A set's order is one file's order over the same number of sequences (the permutation seeded by
// (seed, epoch) over the whole set), with global sequence g read from the shard that holds it;
// every shard's sequences end with its own tokens (a sequence never spans two shards).
TEST_F(DataTest, ShardsFollowTheOrderOverTheWholeSet) {
  constexpr int T = 4;
  const int vocab = 1 << 20;
  // Shards: uint16 of 3 sequences (+2 spare tokens), uint32 of 1, one too short for any, uint32 of 5.
  std::vector<std::vector<uint32_t>> shards = {std::vector<uint32_t>(3 * T + 3), std::vector<uint32_t>(T + 1),
                                               std::vector<uint32_t>(T), std::vector<uint32_t>(5 * T + 1)};
  for (size_t j = 0; j < shards.size(); ++j)
    for (size_t i = 0; i < shards[j].size(); ++i) shards[j][i] = static_cast<uint32_t>((j == 0 ? 0 : 70000) + 1000 * j + i);
  std::vector<uint16_t> s0(shards[0].begin(), shards[0].end());
  const std::string list = write_u16("s0.bin", s0) + "," + write_u32("s1.bin", shards[1]) + "," +
                           write_u32("s2.bin", shards[2]) + " , " + write_u32("s3.bin", shards[3]);
  // Global sequence g -> (shard, sequence), walked here by hand.
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t j = 0; j < shards.size(); ++j)
    for (size_t q = 0; q < (shards[j].size() - 1) / T; ++q) where.push_back({j, q});
  ASSERT_EQ(where.size(), 9u);
  const uint64_t S = where.size();
  // One file of S sequences whose first token names the sequence: its order, as today.
  const auto counting = counting_tokens(S * T + 1);
  const std::string one = write_raw("one.bin", kTokenFileMagic, kTokenFileVersion, static_cast<int32_t>(counting.size()),
                                    counting);
  for (const bool shuffle : {true, false}) {
    DataLoader set(list, T, vocab, 77, shuffle), single(one, T, vocab, 77, shuffle);
    ASSERT_EQ(set.num_sequences(), S);
    ASSERT_EQ(set.num_shards(), 4u);
    std::vector<int32_t> in(T), tg(T), in1(T), tg1(T);
    for (uint64_t i = 0; i < 3 * S + 2; ++i) {  // three epochs and a bit
      single.load(i, 1, in1.data(), tg1.data());
      const auto [j, q] = where[static_cast<size_t>(in1[0] / T)];
      set.load(i, 1, in.data(), tg.data());
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[t], static_cast<int32_t>(shards[j][q * T + t])) << "sample " << i << " shuffle " << shuffle;
        ASSERT_EQ(tg[t], static_cast<int32_t>(shards[j][q * T + t + 1])) << "sample " << i << " shuffle " << shuffle;
      }
    }
  }
}

TEST_F(DataTest, GlobsAndLists) {
  const auto t = counting_tokens(9);
  for (const char* name : {"b.bin", "a.bin", "c.bin"}) write_u16(std::string("s_") + name, t);
  EXPECT_EQ(token_file_paths(path("s_*.bin"), "data.train"),
            (std::vector<std::string>{path("s_a.bin"), path("s_b.bin"), path("s_c.bin")}));
  // A list keeps its order; each glob's matches are sorted in place.
  EXPECT_EQ(token_file_paths(path("s_c.bin") + ", " + path("s_[ab].bin"), "data.train"),
            (std::vector<std::string>{path("s_c.bin"), path("s_a.bin"), path("s_b.bin")}));
  DataLoader dl(path("s_*.bin"), 4, 256, 0, false);
  EXPECT_EQ(dl.num_shards(), 3u);
  EXPECT_EQ(dl.num_sequences(), 6u);
}

TEST_F(DataTest, ShardErrors) {
  const auto t = counting_tokens(9);
  const std::string a = write_u16("a.bin", t), b = write_u16("b.bin", t);
  expect_user_error([&] { DataLoader dl(path("x_*.bin"), 4, 256, 0, true, "data.train"); },
                    {"data.train: '" + path("x_*.bin") + "' matches no file"});
  expect_user_error([&] { DataLoader dl(a + "," + path("gone.bin"), 4, 256, 0, true, "data.train"); },
                    {"cannot open token file '" + path("gone.bin") + "'", "No such file"});
  expect_user_error([&] { DataLoader dl(a + "," + b + "," + a, 4, 256, 0, true, "data.train"); },
                    {"data.train names '" + a + "' twice"});
  expect_user_error([&] { DataLoader dl(path("*.bin") + "," + b, 4, 256, 0, true, "data.val"); },
                    {"data.val names '" + b + "' twice"});
  fs::create_symlink(a, path("link.bin"));
  expect_user_error([&] { DataLoader dl(a + "," + path("link.bin"), 4, 256, 0, true, "data.train"); },
                    {"data.train names one file twice: '" + a + "' and '" + path("link.bin") + "'"});
  expect_user_error([&] { DataLoader dl(a + ",," + b, 4, 256, 0, true, "data.train"); },
                    {"data.train '" + a + ",," + b + "' has an empty entry"});
  expect_user_error([&] { DataLoader dl(a + ",", 4, 256, 0, true, "data.train"); }, {"has an empty entry"});
  expect_user_error([&] { DataLoader dl(a + "," + b, 9, 256, 0, true, "data.train"); },
                    {"data.train '" + a + "," + b + "': none of its 2 files holds one sequence of seq_len 9 (at least "
                     "10 tokens)"});
}

// A shard changed under the run is caught by the load that reads it, and only by one that does.
TEST_F(DataTest, ShardChangedUnderTheRun) {
  constexpr int T = 4;
  const auto t = counting_tokens(2 * T + 1);
  const std::string a = write_u16("a.bin", t), b = write_u16("b.bin", t);
  DataLoader dl(a + "," + b, T, 256, 0, false);
  std::ofstream(b, std::ios::binary | std::ios::app) << "xx";  // a rewrite that grows it
  std::vector<int32_t> in(2 * T), tg(2 * T);
  dl.load(0, 2, in.data(), tg.data());  // shard a only
  expect_user_error([&] { dl.load(1, 2, in.data(), tg.data()); },
                    {"token file '" + b + "' changed under the run: its size is 1044 bytes (it was 1042 when opened)"});
}

// What the checkpoint records: equal for the same set under other names, different for other sizes.
TEST_F(DataTest, DataOrderNamesTheSet) {
  constexpr int T = 4;
  const std::string a = write_u16("a.bin", counting_tokens(2 * T + 1)), b = write_u16("b.bin", counting_tokens(3 * T + 1));
  const std::string c = write_u16("c.bin", counting_tokens(2 * T + 1)), d = write_u16("d.bin", counting_tokens(3 * T + 1));
  const DataOrder ab = DataLoader(a + "," + b, T, 256, 0, true).order();
  EXPECT_EQ(ab.shards, 2u);
  EXPECT_EQ(ab.sequences, 5u);
  EXPECT_EQ(ab, DataLoader(c + "," + d, T, 256, 0, true).order());  // moved or renamed: the same order
  const DataOrder ba = DataLoader(b + "," + a, T, 256, 0, true).order();
  EXPECT_EQ(ba.sequences, ab.sequences);
  EXPECT_NE(ba, ab);  // the same counts in another order: another sequence numbering
  EXPECT_EQ(DataOrder::from_json(ab.to_json()), ab);
  expect_user_error([] { DataOrder::from_json("{\"shards\": 1}"); }, {"does not parse"});
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
