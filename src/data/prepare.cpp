// data/prepare.cpp: byte-level tokenizer (token = byte, vocabulary 256) writing one llm.c token
// file. The file appears whole or not at all: tokens stream into "<out>.tmp", the header is
// written last (the count is known only then), and rename() publishes it atomically.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "core/check.h"
#include "data/loader.h"

namespace zero3d {

namespace {

// Owns the temp file: closes it and removes it unless the rename succeeded.
struct TempFile {
  std::string path;
  FILE* f = nullptr;
  bool published = false;
  ~TempFile() {
    if (f) std::fclose(f);
    if (!published) std::remove(path.c_str());
  }
};

struct InputFile {
  FILE* f = nullptr;
  ~InputFile() {
    if (f) std::fclose(f);
  }
};

}  // namespace

uint64_t prepare_token_file(const std::vector<std::string>& text_files, const std::string& out_path) {
  // Refuse before creating anything: every input must open, the output directory must exist.
  for (const std::string& in : text_files) {
    InputFile probe{std::fopen(in.c_str(), "rb")};
    if (!probe.f) throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
  }
  const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    throw UserError(strprintf("output directory '%s' for token file '%s' does not exist", parent.c_str(),
                              out_path.c_str()));

  TempFile tmp{out_path + ".tmp"};
  tmp.f = std::fopen(tmp.path.c_str(), "wb");
  if (!tmp.f) throw UserError(strprintf("cannot write token file '%s': %s", tmp.path.c_str(), strerror(errno)));
  auto write_or_throw = [&](const void* data, size_t bytes) {
    if (std::fwrite(data, 1, bytes, tmp.f) != bytes)
      throw UserError(strprintf("cannot write token file '%s': %s", tmp.path.c_str(), strerror(errno)));
  };

  int32_t header[kTokenFileHeaderInts] = {};
  write_or_throw(header, sizeof header);  // placeholder until the count is known

  uint64_t count = 0;
  std::vector<unsigned char> bytes(1 << 16);
  std::vector<uint16_t> tokens(bytes.size());
  for (const std::string& in : text_files) {
    InputFile src{std::fopen(in.c_str(), "rb")};
    if (!src.f) throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
    for (;;) {
      const size_t n = std::fread(bytes.data(), 1, bytes.size(), src.f);
      for (size_t i = 0; i < n; ++i) tokens[i] = bytes[i];
      write_or_throw(tokens.data(), n * sizeof(uint16_t));
      count += n;
      if (n < bytes.size()) break;
    }
    if (std::ferror(src.f)) throw UserError(strprintf("cannot read text file '%s': %s", in.c_str(), strerror(errno)));
  }
  // The header stores the count as int32 (llm.c reads it so).
  if (count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    throw UserError(strprintf("token file '%s' would hold %llu tokens, more than the format's int32 count allows",
                              out_path.c_str(), static_cast<unsigned long long>(count)));

  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(count);
  if (std::fseek(tmp.f, 0, SEEK_SET) != 0)
    throw UserError(strprintf("cannot write token file '%s': %s", tmp.path.c_str(), strerror(errno)));
  write_or_throw(header, sizeof header);
  FILE* f = tmp.f;
  tmp.f = nullptr;
  if (std::fclose(f) != 0)
    throw UserError(strprintf("cannot write token file '%s': %s", tmp.path.c_str(), strerror(errno)));
  if (std::rename(tmp.path.c_str(), out_path.c_str()) != 0)
    throw UserError(strprintf("cannot rename '%s' to '%s': %s", tmp.path.c_str(), out_path.c_str(), strerror(errno)));
  tmp.published = true;
  return count;
}

}  // namespace zero3d
