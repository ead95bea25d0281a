// data/loader.h: llm.c token files, sets of them (shards), and the layout-independent order of
// training sequences.
// A token file is 256 int32 header words (magic, version, token count) followed by that many
// tokens: uint16 (magic 20240520, version 1: GPT-2's scripts) or uint32 (magic 20240801,
// version 7: llm.c's Llama 3 scripts); both come out as int32.
// A data set is one or more such files (data.train: a file, a glob or a comma-separated list);
// it may mix the two formats, whose ids are those of one vocabulary.
// Shard j of count_j tokens is cut into S_j = (count_j - 1) / T sequences of T inputs and the T
// targets shifted by one; a sequence never spans two shards (llm.c's loader neither). The set's
// sequences are numbered shard after shard: global sequence g is sequence g - P_j of shard j,
// where P_j = S_0 + ... + S_{j-1} <= g < P_{j+1}. With one file, g is the file's sequence g, as
// it was before sets: one-file runs and their checkpoints keep their order.
// Global sample i (counting from the start of training) is sequence perm_e[i mod S] of epoch
// e = i / S, S = sum of the S_j, where perm_e is a permutation seeded only by (seed, e).
// So the global batch of a step is the same set of sequences whatever the layout or the
// micro-batch split; each dp rank takes its slice. The cursor is the number of samples consumed,
// in the order of one set: a checkpoint records its DataOrder.
#pragma once
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

namespace zero3d {

// One token file, read with pread (not mapped: a file truncated under the run must be an error,
// not a SIGBUS). Opening reads the header and the first kTokenFileCheckedAtOpen tokens, not the
// whole file: a set of a hundred 200 MB shards opens at once. Every token is checked against the
// vocabulary when it is read.
class TokenFile {
 public:
  // Throws UserError naming the file for: missing/unreadable, foreign magic, unknown version,
  // truncated (fewer bytes than the header promises), a token id >= vocab_size among the first
  // kTokenFileCheckedAtOpen.
  TokenFile(const std::string& path, int vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t num_tokens() const { return num_tokens_; }
  int token_bytes() const { return token_bytes_; }  // 2 (uint16) or 4 (uint32)
  // The same file, whatever the path that named it (a link, "./a" and "a").
  bool same_file(const TokenFile& o) const { return dev_ == o.dev_ && ino_ == o.ino_; }
  // Tokens [first, first + n) into out. UserError naming the file for a token id >= vocab_size or
  // a file changed under the run (truncated); RunError (exit 10) when the storage fails. Only the
  // reading rank knows: a trainer ends the job with it (abort_job), it cannot agree on it.
  void read(uint64_t first, size_t n, int32_t* out) const;
  // A file rewritten in place (valid ids, same size) reads fine: what names it is its metadata.
  // Its path's size, modification time (ns) and inode against those at open; UserError naming the
  // change. One stat: cheap enough for every load.
  void check_unchanged() const;

 private:
  std::string path_;
  int vocab_size_ = 0;
  int fd_ = -1;
  int token_bytes_ = 2;
  uint64_t num_tokens_ = 0;
  // At open: what check_unchanged compares.
  uint64_t dev_ = 0, ino_ = 0;
  int64_t size_ = 0;
  timespec mtime_{};
};

// The files a data key names, in order: comma-separated entries, each a path or a glob (an entry
// with * ? or [), a glob's matches sorted bytewise. UserError naming `key` and the entry for an
// empty entry or a glob that matches nothing; a missing path is TokenFile's to name.
std::vector<std::string> token_file_paths(const std::string& spec, const std::string& key);

// How a run of tokens (a shard, or eval's text) is cut into sequences of T = seq_len: n tokens
// hold (n - 1) / T of them (none when n is 0); a sequence is T + 1 tokens from tokens[s*T], cut
// into T inputs and the T targets shifted by one.
uint64_t sequences_in(uint64_t tokens, int seq_len);
void cut_sequence(const int32_t* seq, size_t seq_len, int32_t* inputs, int32_t* targets);

// Where global sequence g lives: shard j = the last with first[j] <= g, sequence g - first[j] of
// it. first[j] = S_0 + ... + S_{j-1} (first.size() == shards + 1; first.back() == S). Shards of no
// sequence (first[j] == first[j + 1]) are never chosen.
struct SequenceIndex {
  size_t shard = 0;
  uint64_t sequence = 0;  // within the shard
};
SequenceIndex locate_sequence(const std::vector<uint64_t>& first, uint64_t g);

// What fixes the training order, for the checkpoint: resuming over a set of other shard sizes
// would reorder every later sample. `shards` and `sequences` name the difference; `sizes` is a
// fingerprint of every shard's sequence count, in order.
struct DataOrder {
  uint64_t shards = 0, sequences = 0, sizes = 0;
  std::string to_json() const;
  static DataOrder from_json(const std::string& text);  // UserError when it does not parse
  bool operator==(const DataOrder&) const = default;
};

class DataLoader {
 public:
  // `files`: data.train's value (token_file_paths); `key` names it in errors. shuffle=false keeps
  // file order (validation). Throws UserError if the set holds no full sequence, or names one file
  // twice.
  DataLoader(const std::string& files, int seq_len, int vocab_size, uint64_t seed, bool shuffle,
             const std::string& key = "token files");

  uint64_t num_sequences() const { return first_.back(); }
  size_t num_shards() const { return files_.size(); }
  DataOrder order() const;
  // Writes `count` sequences, global samples first_sample .. first_sample+count-1, as int32:
  // inputs[k*T + t] = token t of the sequence, targets[k*T + t] = token t+1. Checks that every
  // file read is unchanged since it was opened (TokenFile::check_unchanged). Throws as
  // TokenFile::read does: only this rank knows (see there).
  void load(uint64_t first_sample, int count, int32_t* inputs, int32_t* targets);

 private:
  uint64_t sequence_of(uint64_t sample);
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<uint64_t> first_;  // first global sequence of each shard, and S (SequenceIndex)
  int seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t perm_epoch_ = -1;
  std::vector<uint64_t> perm_;
  std::vector<int32_t> seq_;      // one sequence and its last target, as read
  std::vector<size_t> touched_;  // the shards one load read
};

// Header constants of the llm.c token format: uint16 tokens (GPT-2's scripts), or uint32 tokens for
// vocabularies above 65,536 (llm.c's Llama 3 scripts: their own magic and version).
constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr int32_t kTokenFileMagicU32 = 20240801;
constexpr int32_t kTokenFileVersionU32 = 7;
constexpr int kTokenFileHeaderInts = 256;
// The tokens TokenFile checks when it opens a file (128 KiB of uint16): a wrong model.vocab_size
// is refused before the run starts; the rest are checked as they are read.
constexpr uint64_t kTokenFileCheckedAtOpen = uint64_t{1} << 16;

// Byte-level tokenizer (vocabulary 256): concatenates the files' bytes, writes one token file
// atomically (temp + rename). Throws UserError naming a missing input. Returns the token count.
uint64_t prepare_token_file(const std::vector<std::string>& text_files, const std::string& out_path);

}  // namespace zero3d
