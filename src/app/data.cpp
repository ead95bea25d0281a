// app/data.cpp: zero3d data prepare, text files into one llm.c token file (data/loader.h).
#include <filesystem>
#include <optional>

#include "app/commands.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "data/loader.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

const char* kDataUsage =
    "usage: zero3d data prepare TEXT... --out FILE.bin\n"
    "  Tokenize text files byte by byte (vocabulary 256) into one llm.c token file.\n";

}  // namespace

int cmd_data(const Args& a) {
  if (const std::optional<int> rc = usage_exit(a, kDataUsage)) return *rc;
  if (a[0] != "prepare") throw UserError(strprintf("unknown data command '%s'\n%s", a[0].c_str(), kDataUsage));
  std::vector<std::string> texts;
  std::string out;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out") out = option_value(a, i, kDataUsage);
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kDataUsage));
    else texts.push_back(a[i]);
  }
  if (texts.empty() || out.empty()) throw UserError(strprintf("data prepare needs TEXT files and --out\n%s", kDataUsage));
  for (const std::string& t : texts) {  // the output replaces its file only when done: it must not be an input
    std::error_code ec;
    if (std::filesystem::equivalent(t, out, ec))
      throw UserError(strprintf("data prepare: --out '%s' is also an input text: give another output file", out.c_str()));
  }
  catch_interrupts();
  if (ProcessGroup::world()->rank() == 0) {
    uint64_t n = prepare_token_file(texts, out);
    log_info("wrote %llu tokens to %s", static_cast<unsigned long long>(n), out.c_str());
  }
  return 0;
}

}  // namespace zero3d
