// config/presets.h: run configs and machine files by name, one rule for every command that reads
// one (train, plan, plan --machine, bench --config). input/README.md#presets says it for users.
// - An argument that names an existing file, or holds a '/', is the user's file: read as given,
//   its relative paths (data.train, ...) taken from the working directory, as always.
// - Otherwise it is a preset's name, with or without ".json": input/NAME.json (a machine:
//   input/machines/NAME.json) in the tree of this binary (core/install_dirs.h: the source tree
//   from the build tree, <prefix>/share/zero3d installed). The preset's own relative paths resolve
//   against that tree, so `zero3d train gpt-tiny` trains the shipped data from any directory.
// - A name that is no preset: one line listing the presets found, exit code 2.
#pragma once
#include <string>

#include "config/config.h"

namespace zero3d {

enum class PresetKind { config, machine };

struct ConfigFile {
  std::string file;  // the path to read
  std::string root;  // a preset's tree, for its relative paths; "" for the user's own file
};

ConfigFile find_config_file(const std::string& arg, PresetKind kind = PresetKind::config);
// A command line's CONFIG argument into src (its config_file and preset_root).
void set_config_file(ConfigSources& src, const std::string& arg);

}  // namespace zero3d
