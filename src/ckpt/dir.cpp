#include "ckpt/dir.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/check.h"

namespace zero3d {

namespace fs = std::filesystem;

int64_t step_of(const std::string& file) {
  const std::string name = fs::path(file).filename().string();
  if (!name.starts_with("step_") || !name.ends_with(".h5") || name.size() <= 8) return -1;
  const std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().string());
    if (s >= 0 && e.is_regular_file()) found.push_back({s, e.path().string()});
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string read_latest(const std::string& dir) {
  std::ifstream f(dir + "/latest");
  std::string name;
  return f >> name ? name : std::string();
}

std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s.substr(0, 64)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return s.size() > 64 ? out + "..." : out;
}

std::string checkpoint_file(const std::string& dir_or_file) {
  std::error_code ec;
  if (fs::is_regular_file(dir_or_file, ec)) return dir_or_file;
  if (!fs::is_directory(dir_or_file, ec))
    throw UserError(strprintf("checkpoint '%s' %s (give a checkpoint file or a checkpoint directory)",
                              dir_or_file.c_str(), fs::exists(dir_or_file, ec) ? "is neither a file nor a directory"
                                                                                : "does not exist"));
  const std::string name = read_latest(dir_or_file);
  if (name.empty())
    throw UserError(strprintf("checkpoint directory '%s' has no 'latest' file (no checkpoint was committed there)",
                              dir_or_file.c_str()));
  if (step_of(name) < 0 || name.find('/') != std::string::npos)
    throw UserError(strprintf("checkpoint directory '%s': its 'latest' holds '%s', not a checkpoint's name "
                              "(step_XXXXXXXX.h5): give the checkpoint file itself",
                              dir_or_file.c_str(), printable(name).c_str()));
  return dir_or_file + "/" + name;
}

std::string commit_checkpoint(const std::string& dir, const std::string& tmp, const std::string& final_path,
                              int keep_last) {
  try {
    sync_path(tmp);
    if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw UserError(strprintf("cannot rename '%s' to '%s': %s", tmp.c_str(), final_path.c_str(), strerror(errno)));
    try {
      sync_path(dir);
      write_file_atomic(dir + "/latest", fs::path(final_path).filename().string() + "\n", /*durable=*/true,
                        "checkpoint pointer");
    } catch (const UserError&) {  // `latest` still names the previous one: take the new file back
      std::error_code ec;
      fs::remove(final_path, ec);
      throw;
    }
  } catch (const UserError& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return e.what();
  }
  std::error_code ec;  // what follows only frees space: a failure leaves a file more, never a wrong one
  if (keep_last > 0) {
    const std::vector<std::string> all = list_checkpoints(dir);
    for (size_t i = static_cast<size_t>(keep_last); i < all.size(); ++i)
      if (all[i] != final_path) fs::remove(all[i], ec);
  }
  remove_partial_saves(dir);
  return "";
}

int64_t set_aside_diverged(const std::string& dir, int64_t from) {
  const std::vector<std::string> all = list_checkpoints(dir);  // newest first
  if (all.empty() || step_of(all.front()) < from) return -1;
  for (const std::string& c : all) {
    if (step_of(c) < from) {
      write_file_atomic(dir + "/latest", fs::path(c).filename().string() + "\n", /*durable=*/true, "checkpoint pointer");
      return step_of(c);
    }
    if (std::rename(c.c_str(), (c + ".diverged").c_str()) != 0)
      throw UserError(strprintf("cannot rename '%s' to '%s.diverged': %s", c.c_str(), c.c_str(), strerror(errno)));
  }
  std::error_code ec;
  fs::remove(dir + "/latest", ec);
  return 0;
}

void remove_partial_saves(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().string().ends_with(".h5.tmp")) fs::remove(e.path(), ec);
}

}  // namespace zero3d
