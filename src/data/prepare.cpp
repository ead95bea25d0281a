// data/prepare.cpp: byte-level tokenizer (token = byte, vocabulary 256) writing one llm.c token
// file. The file appears whole or not at all: tokens stream into "<out>.tmp", the header is
// written last (the count is known only then), and rename() publishes it atomically.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/stop_signal.h"
#include "data/loader.h"

namespace zero3d {

namespace {

struct InputFile {
  FILE* f = nullptr;
  ~InputFile() {
    if (f) std::fclose(f);
  }
};

}  // namespace

uint64_t prepare_token_file(const std::vector<std::string>& text_files, const std::string& out_path) {
  // Refuse before creating anything: every input must be there and readable (checked without
  // opening it: a FIFO's writer sends its text once, to the one open that reads it), the output
  // directory must exist.
  for (const std::string& in : text_files) {
    struct stat st {};
    if (::stat(in.c_str(), &st) != 0 || ::access(in.c_str(), R_OK) != 0)
      throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
    if (S_ISDIR(st.st_mode)) throw UserError(strprintf("text file '%s' is a directory", in.c_str()));
  }
  const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    throw UserError(strprintf("output directory '%s' for token file '%s' does not exist", parent.c_str(),
                              out_path.c_str()));

  AtomicFile out(out_path, "token file");
  int32_t header[kTokenFileHeaderInts] = {};
  out.write(header, sizeof header);  // placeholder until the count is known

  // The header stores the count as int32 (llm.c reads it so): more is refused as soon as it is read.
  const uint64_t most = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  uint64_t count = 0;
  std::vector<unsigned char> bytes(1 << 16);
  std::vector<uint16_t> tokens(bytes.size());
  for (const std::string& in : text_files) {
    InputFile src{std::fopen(in.c_str(), "rb")};
    if (!src.f) throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
    for (;;) {
      throw_if_interrupted("data prepare");
      const size_t n = std::fread(bytes.data(), 1, bytes.size(), src.f);
      if (count + n > most)
        throw UserError(strprintf("token file '%s' would hold more than %llu tokens, the most the format's int32 count "
                                  "allows ('%s' is that long or endless): split the text into several token files",
                                  out_path.c_str(), static_cast<unsigned long long>(most), in.c_str()));
      for (size_t i = 0; i < n; ++i) tokens[i] = bytes[i];
      out.write(tokens.data(), n * sizeof(uint16_t));
      count += n;
      if (n < bytes.size()) break;
    }
    if (std::ferror(src.f)) throw UserError(strprintf("cannot read text file '%s': %s", in.c_str(), strerror(errno)));
  }

  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(count);
  out.seek(0);
  out.write(header, sizeof header);
  out.commit();
  return count;
}

}  // namespace zero3d
