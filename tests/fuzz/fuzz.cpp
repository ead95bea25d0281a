#include "fuzz.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace zero3d::fuzz {

namespace fs = std::filesystem;

const std::string& scratch_dir() {
  struct Scratch {
    std::string dir;
    Scratch() {
      const std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
      dir = base + "/zero3d_fuzz.XXXXXX";
      if (!mkdtemp(dir.data())) throw std::runtime_error("fuzz: cannot create a scratch directory in " + base);
    }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  };
  static const Scratch scratch;
  return scratch.dir;
}

std::string put_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("fuzz: cannot write " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("fuzz: cannot write " + path);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

std::map<std::string, std::string> sections(std::string_view data) {
  std::map<std::string, std::string> out;
  std::string name, text;
  bool first_line = true;  // of the current section
  size_t at = 0;
  for (;;) {
    size_t end = data.find('\n', at);
    const bool last = end == std::string_view::npos;
    if (last) end = data.size();
    const std::string_view line = data.substr(at, end - at);
    if (line.substr(0, 4) == "--- ") {
      out[name] += text;
      name = std::string(line.substr(4)), text.clear(), first_line = true;
    } else {
      if (!first_line) text += '\n';
      text += line, first_line = false;
    }
    if (last) break;
    at = end + 1;
  }
  out[name] += text;
  return out;
}

std::string join_sections(const std::map<std::string, std::string>& parts) {
  std::string out;
  auto it = parts.find("");
  if (it != parts.end()) out = it->second;
  for (const auto& [name, text] : parts) {
    if (name.empty()) continue;
    out += "\n--- " + name + "\n" + text;
  }
  return out;
}

std::string seed_request() {
  const char* dir = std::getenv("ZERO3D_FUZZ_SEEDS");
  return dir && *dir ? dir : "";
}

void write_seed(const std::string& dir, const std::string& name, std::string_view bytes) {
  fs::create_directories(dir);
  std::ofstream(dir + "/" + name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace zero3d::fuzz
