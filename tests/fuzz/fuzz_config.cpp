// The config reader as `zero3d train` runs it: the run config (JSON), a DeepSpeed config overlaid on
// it, --set overrides and the number of ranks, read, overlaid, validated and resolved by
// load_config. Input: the run config, then optional sections "--- deepspeed" (a ds_config.json),
// "--- set" (one KEY=VALUE a line) and "--- ranks" (a number; 1 when absent).
// ZERO3D_FUZZ_DICT=FILE writes a libFuzzer dictionary of every key and choice and exits.
#include <cstdio>
#include <fstream>
#include <set>

#include "config/config.h"
#include "config/schema.h"
#include "fuzz.h"

namespace {

using namespace zero3d;

void write_dictionary(const std::string& path) {
  std::set<std::string> words;
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return out + "\"";
  };
  for (const config_schema::Key& k : config_schema::schema()) {
    words.insert(quoted(k.path + "="));
    size_t from = 0;
    for (size_t dot = k.path.find('.'); ; dot = k.path.find('.', from)) {
      words.insert(quoted("\"" + k.path.substr(from, dot == std::string::npos ? std::string::npos : dot - from) + "\""));
      if (dot == std::string::npos) break;
      from = dot + 1;
    }
    for (const std::string& c : k.choices) words.insert(quoted("\"" + c + "\""));
    for (const std::string& c : k.refused_choices) words.insert(quoted("\"" + c + "\""));
  }
  for (const char* w : {"\"auto\"", "true", "false", "null", "1e300", "-1", "2147483648", "--- deepspeed",
                        "--- set", "--- ranks"})
    words.insert(quoted(w));
  std::ofstream out(path);
  for (const std::string& w : words) out << w << "\n";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dict = std::getenv("ZERO3D_FUZZ_DICT")) {
    write_dictionary(dict);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = fuzz::sections(std::string_view(reinterpret_cast<const char*>(data), size));
  ConfigSources sources;
  sources.config_file = fuzz::put_file("run.json", parts[""]);
  if (parts.count("deepspeed")) sources.deepspeed_file = fuzz::put_file("ds_config.json", parts["deepspeed"]);
  if (parts.count("set")) {
    const std::string& sets = parts["set"];
    for (size_t at = 0; at <= sets.size();) {
      size_t end = sets.find('\n', at);
      if (end == std::string::npos) end = sets.size();
      if (end > at) sources.overrides.push_back(sets.substr(at, end - at));
      at = end + 1;
    }
  }
  int ranks = 1;
  if (parts.count("ranks")) {  // what --ranks/mpirun can give: 1 .. 2^24
    long long r = std::atoll(parts["ranks"].substr(0, 9).c_str());
    ranks = r >= 1 && r <= (1 << 24) ? static_cast<int>(r) : 1;
  }
  fuzz::expect_user_errors([&] {
    Config c = load_config(sources, ranks);
    (void)describe_resolved(c);
  });
  return 0;
}
