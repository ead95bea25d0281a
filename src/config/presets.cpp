// config/presets.cpp: a name -> the preset's file (config/presets.h).
#include "config/presets.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/check.h"
#include "core/install_dirs.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {

// The names of the presets in `dir` (its *.json files, sorted), for the error.
std::string preset_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".json" && it->is_regular_file(ec)) names.push_back(it->path().stem().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

ConfigFile find_config_file(const std::string& arg, PresetKind kind) {
  std::error_code ec;
  if (arg.empty() || arg.find('/') != std::string::npos || fs::exists(arg, ec)) return {arg, ""};
  const std::string root = data_dir();
  const fs::path dir = fs::path(root) / (kind == PresetKind::machine ? "input/machines" : "input");
  const std::string name = arg.ends_with(".json") ? arg.substr(0, arg.size() - 5) : arg;
  const fs::path file = dir / (name + ".json");
  if (!root.empty() && fs::is_regular_file(file, ec)) return {file.string(), root};
  throw UserError(strprintf("%s '%s': no such file, and no preset of that name (the presets in %s: %s)",
                            kind == PresetKind::machine ? "machine file" : "config file", arg.c_str(),
                            root.empty() ? "(this binary's tree is unknown)" : dir.c_str(),
                            preset_names(dir).c_str()));
}

void set_config_file(ConfigSources& src, const std::string& arg) {
  const ConfigFile f = find_config_file(arg);
  src.config_file = f.file;
  src.preset_root = f.root;
}

}  // namespace zero3d
