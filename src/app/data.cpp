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
  // Through the trainer's reader: either width, and an id the tokenizer lacks is named, not printed as "<id>".
  const TokenFile tokens(file, tok->vocab_size());
  first = std::min(first, tokens.num_tokens());
  std::vector<int32_t> ids(std::min(count, tokens.num_tokens() - first));
  tokens.read(first, ids.size(), ids.data());
  const std::string text = tok->decode(ids);
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
