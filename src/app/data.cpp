// app/data.cpp: zero3d data prepare (text files into llm.c token files through a tokenizer,
// data/prepare.h) and zero3d data decode (a token file's tokens back to text, to look at one).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include "app/args.h"
#include "app/commands.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

const char* kDataUsage =
    "usage: zero3d data prepare TEXT... --out FILE.bin [--tokenizer FILE|byte] [--shard-tokens N] [--threads N]\n"
    "       zero3d data decode FILE.bin [--tokenizer FILE|byte] [--first N] [--count N]\n"
    "  prepare: each text file is one document, preceded by the tokenizer's separator (bos, else eos;\n"
    "    none for byte), into one llm.c token file, or with --shard-tokens N into FILE_000000.bin,\n"
    "    FILE_000001.bin, ... of N tokens each. --tokenizer: a Hugging Face tokenizer.json (byte-level\n"
    "    BPE), a SentencePiece tokenizer.model, or byte (the default: token = byte, vocabulary 256).\n"
    "    --threads: encoding threads (default: every core; the output is the same for any count).\n"
    "  decode: tokens [first, first + count) of a token file as text, on stdout.\n";

int data_prepare(const Args& a) {
  PrepareOptions opt;
  std::string tokenizer = "byte";
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out") opt.out = option_value(a, i, kDataUsage);
    else if (a[i] == "--tokenizer") tokenizer = option_value(a, i, kDataUsage);
    else if (a[i] == "--shard-tokens")
      opt.shard_tokens = parse_whole(option_value(a, i, kDataUsage), "--shard-tokens", 1, std::numeric_limits<int32_t>::max());
    else if (a[i] == "--threads") opt.threads = static_cast<int>(parse_whole(option_value(a, i, kDataUsage), "--threads", 1, 4096));
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kDataUsage));
    else opt.texts.push_back(a[i]);
  }
  if (opt.texts.empty() || opt.out.empty())
    throw UserError(strprintf("data prepare needs TEXT files and --out\n%s", kDataUsage));
  for (const std::string& t : opt.texts) {  // the output replaces its file only when done: it must not be an input
    std::error_code ec;
    if (std::filesystem::equivalent(t, opt.out, ec))
      throw UserError(strprintf("data prepare: --out '%s' is also an input text: give another output file", opt.out.c_str()));
  }
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(tokenizer);
  catch_interrupts();
  if (ProcessGroup::world()->rank() != 0) return 0;
  opt.progress = true;
  const PrepareResult r = prepare_tokens(*tok, opt);
  const double mb = r.bytes / 1e6;
  const std::string where = r.files.size() == 1
                                ? "to " + r.files[0]
                                : strprintf("in %zu shards, %s .. %s", r.files.size(), r.files.front().c_str(),
                                            r.files.back().c_str());
  log_info("wrote %llu tokens %s (%s tokenizer, %.1f MB of text at %.1f MB/s, %.3f s CPU)",
           static_cast<unsigned long long>(r.tokens), where.c_str(), tok->kind(), mb, mb / std::max(r.seconds, 1e-9),
           r.cpu_seconds);
  return 0;
}

// Reads tokens [first, first + count) of an llm.c token file (uint16 or uint32).
std::vector<int32_t> read_tokens(const std::string& path, uint64_t first, uint64_t count) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw UserError(strprintf("cannot open token file '%s': %s", path.c_str(), strerror(errno)));
  int32_t header[kTokenFileHeaderInts] = {};
  const bool u16 = std::fread(header, sizeof header, 1, f.get()) == 1 && header[0] == kTokenFileMagic &&
                   header[1] == kTokenFileVersion;
  const bool u32 = header[0] == kTokenFileMagicU32 && header[1] == kTokenFileVersionU32;
  if (!u16 && !u32)
    throw UserError(strprintf("'%s' is not an llm.c token file (magic %d version %d; expected %d/%d or %d/%d)",
                              path.c_str(), header[0], header[1], kTokenFileMagic, kTokenFileVersion,
                              kTokenFileMagicU32, kTokenFileVersionU32));
  const uint64_t n = static_cast<uint64_t>(header[2]);
  if (first > n) first = n;
  count = std::min(count, n - first);
  const size_t width = u32 ? 4 : 2;
  std::vector<unsigned char> raw(count * width);
  if (std::fseek(f.get(), static_cast<long>(sizeof header + first * width), SEEK_SET) != 0 ||
      std::fread(raw.data(), 1, raw.size(), f.get()) != raw.size())
    throw UserError(strprintf("token file '%s' is shorter than its header's %llu tokens", path.c_str(),
                              static_cast<unsigned long long>(n)));
  std::vector<int32_t> ids(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (u32) std::memcpy(&ids[i], &raw[i * 4], 4);
    else ids[i] = static_cast<uint16_t>(raw[i * 2] | (raw[i * 2 + 1] << 8));
  }
  return ids;
}

int data_decode(const Args& a) {
  std::string file, tokenizer = "byte";
  uint64_t first = 0, count = std::numeric_limits<uint64_t>::max();
  const int64_t most = std::numeric_limits<int64_t>::max();
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--tokenizer") tokenizer = option_value(a, i, kDataUsage);
    else if (a[i] == "--first") first = parse_whole(option_value(a, i, kDataUsage), "--first", 0, most);
    else if (a[i] == "--count") count = parse_whole(option_value(a, i, kDataUsage), "--count", 0, most);
    else if (a[i].starts_with("-") || !file.empty()) throw UserError(strprintf("unexpected argument '%s'\n%s", a[i].c_str(), kDataUsage));
    else file = a[i];
  }
  if (file.empty()) throw UserError(strprintf("data decode needs a token file\n%s", kDataUsage));
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(tokenizer);
  if (ProcessGroup::world()->rank() != 0) return 0;
  const std::string text = tok->decode(read_tokens(file, first, count));
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int cmd_data(const Args& a) {
  if (const std::optional<int> rc = usage_exit(a, kDataUsage)) return *rc;
  if (a[0] == "prepare") return data_prepare(a);
  if (a[0] == "decode") return data_decode(a);
  throw UserError(strprintf("unknown data command '%s'\n%s", a[0].c_str(), kDataUsage));
}

}  // namespace zero3d
