// data/loader.h: llm.c token files and the layout-independent order of training sequences.
// A token file is 256 int32 header words (magic 20240520, version 1, token count) followed by
// that many uint16 tokens. The file is cut into S = (count - 1) / T sequences of T inputs and the
// T targets shifted by one. Global sample i (counting from the start of training) is sequence
// perm_e[i mod S] of epoch e = i / S, where perm_e is a permutation seeded only by (seed, e).
// So the global batch of a step is the same set of sequences whatever the layout or the
// micro-batch split; each dp rank takes its slice. The cursor is the number of samples consumed.
#pragma once
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace zero3d {

// One token file, read with pread (not mapped: a file truncated under the run must be an error,
// not a SIGBUS); validates header, size and token range on open, and each read again.
class TokenFile {
 public:
  // Throws UserError naming the file for: missing/unreadable, foreign magic, unknown version,
  // truncated (fewer bytes than the header promises), or a token id >= vocab_size.
  TokenFile(const std::string& path, int vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t num_tokens() const { return num_tokens_; }
  // Tokens [first, first + n) into out. A file changed under the run (truncated, or rewritten with
  // tokens out of range) ends the job with one line naming it (exit 2): only this rank knows.
  void read(uint64_t first, size_t n, uint16_t* out) const;
  // A file rewritten in place (valid ids, same size) reads fine: what names it is its metadata.
  // Its path's size, modification time (ns) and inode against those at open; a change ends the
  // job like read() does (exit 2). One stat: cheap enough for every load.
  void check_unchanged() const;

 private:
  static std::string read_tokens(int fd, uint64_t first, size_t n, uint16_t* out);  // "" or what failed
  std::string path_;
  int vocab_size_ = 0;
  int fd_ = -1;
  uint64_t num_tokens_ = 0;
  // At open: what check_unchanged compares.
  uint64_t dev_ = 0, ino_ = 0;
  int64_t size_ = 0;
  timespec mtime_{};
};

class DataLoader {
 public:
  // shuffle=false keeps file order (validation). Throws UserError if the file holds no full sequence.
  DataLoader(const std::string& path, int seq_len, int vocab_size, uint64_t seed, bool shuffle);

  uint64_t num_sequences() const { return num_sequences_; }
  // Writes `count` sequences, global samples first_sample .. first_sample+count-1, as int32:
  // inputs[k*T + t] = token t of the sequence, targets[k*T + t] = token t+1. Checks that the
  // file is unchanged since it was opened (TokenFile::check_unchanged).
  void load(uint64_t first_sample, int count, int32_t* inputs, int32_t* targets);

 private:
  uint64_t sequence_of(uint64_t sample);
  TokenFile file_;
  int seq_len_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t num_sequences_;
  int64_t perm_epoch_ = -1;
  std::vector<uint64_t> perm_;
  std::vector<uint16_t> seq_;  // one sequence and its last target, as read
};

// Header constants of the llm.c token format: uint16 tokens (GPT-2's scripts), or uint32 tokens for
// vocabularies above 65,536 (llm.c's Llama 3 scripts: their own magic and version).
constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int32_t kTokenFileMagicU32 = 20240801;
constexpr int32_t kTokenFileVersionU32 = 7;
constexpr int kTokenFileHeaderInts = 256;

// Byte-level tokenizer (vocabulary 256): concatenates the files' bytes, writes one token file
// atomically (temp + rename). Throws UserError naming a missing input. Returns the token count.
uint64_t prepare_token_file(const std::vector<std::string>& text_files, const std::string& out_path);

}  // namespace zero3d
