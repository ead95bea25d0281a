// core/install_dirs.cpp: the two layouts of core/install_dirs.h. CMakeLists.txt defines, for this
// file only (a new prefix recompiles one file):
//   ZERO3D_BUILD_BIN_DIR  the build tree's bin folder, ZERO3D_SOURCE_DIR  the source tree;
//   ZERO3D_REL_DATADIR    bin dir -> <datadir>/zero3d ("../share/zero3d"),
//   ZERO3D_REL_MODULEDIR  bin dir -> <libdir>/zero3d ("../lib/zero3d").
#include "core/install_dirs.h"

#include <limits.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

namespace zero3d {

namespace {

// Whether this binary runs from the folder it was built into (a copy elsewhere is "installed").
bool in_build_tree(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && std::filesystem::equivalent(dir, ZERO3D_BUILD_BIN_DIR, ec);
}

// dir/rel without the "bin/.." detour, so the paths zero3d prints read as the tree they are in.
std::string under(const std::string& dir, const char* rel) {
  return (std::filesystem::path(dir) / rel).lexically_normal().string();
}

}  // namespace

std::string exe_dir() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "";
  const std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

std::string data_dir() {
  const std::string dir = exe_dir();
  if (dir.empty()) return "";
  return in_build_tree(dir) ? std::string(ZERO3D_SOURCE_DIR) : under(dir, ZERO3D_REL_DATADIR);
}

std::string cuda_module_dir() {
  const std::string dir = exe_dir();
  if (dir.empty()) return "";
  return under(dir, in_build_tree(dir) ? "../lib" : ZERO3D_REL_MODULEDIR);
}

}  // namespace zero3d
