// data/loader.cpp: the token file, read with pread, sets of them, and the seeded,
// layout-independent sequence order.
#include "data/loader.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/check.h"
#include "core/hash.h"
#include "core/posix_io.h"
#include "core/rng.h"

namespace zero3d {

static_assert(std::endian::native == std::endian::little, "llm.c token files are little-endian");

namespace {

constexpr uint64_t kHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

// Closes a file descriptor on every exit path of the constructor.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TokenFile::TokenFile(const std::string& path, int vocab_size) : path_(path), vocab_size_(vocab_size) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw UserError(strprintf("cannot open token file '%s': %s", path.c_str(), strerror(errno)));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    throw UserError(strprintf("cannot stat token file '%s': %s", path.c_str(), strerror(errno)));
  if (!S_ISREG(st.st_mode)) throw UserError(strprintf("token file '%s' is not a regular file", path.c_str()));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kHeaderBytes)
    throw UserError(strprintf("'%s' is not an llm.c token file (%llu bytes, shorter than the %llu-byte header)",
                              path.c_str(), static_cast<unsigned long long>(file_bytes),
                              static_cast<unsigned long long>(kHeaderBytes)));
  int32_t header[kTokenFileHeaderInts];
  // An I/O error is the storage's, not a verdict on the file (the README's exit code 10); a file
  // shorter than its header was refused above.
  if (const std::string e = pread_fully(fd.fd, header, sizeof header, 0); !e.empty())
    throw RunError(strprintf("cannot read the header of token file '%s': %s (after retries); run again when the "
                             "storage reads", path.c_str(), e.c_str()), kExitReadFailed);
  // uint16 (GPT-2's scripts) or uint32 (llm.c's Llama 3 scripts), each with its own version.
  if (header[0] == kTokenFileMagic) {
    if (header[1] != kTokenFileVersion)
      throw UserError(strprintf("'%s' is an llm.c token file of version %d, but zero3d reads version %d (uint16 tokens)",
                                path.c_str(), header[1], kTokenFileVersion));
    token_bytes_ = 2;
  } else if (header[0] == kTokenFileMagicU32) {
    if (header[1] != kTokenFileVersionU32)
      throw UserError(strprintf("'%s' is an llm.c uint32 token file of version %d, but zero3d reads version %d",
                                path.c_str(), header[1], kTokenFileVersionU32));
    token_bytes_ = 4;
  } else {
    throw UserError(strprintf("'%s' is not an llm.c token file (magic %d, expected %d for uint16 tokens or %d for "
                              "uint32)", path.c_str(), header[0], kTokenFileMagic, kTokenFileMagicU32));
  }
  // llm.c writes the count as int32; read it unsigned so a corrupt negative count is caught as
  // truncation below instead of wrapping to a huge size.
  const uint64_t count = static_cast<uint32_t>(header[2]);
  const uint64_t needed = kHeaderBytes + count * static_cast<uint64_t>(token_bytes_);
  if (file_bytes < needed)
    throw UserError(strprintf("'%s' is truncated: header promises %llu tokens (%llu bytes) but the file has %llu bytes",
                              path.c_str(), static_cast<unsigned long long>(count),
                              static_cast<unsigned long long>(needed), static_cast<unsigned long long>(file_bytes)));
  // Bytes past the promised tokens are ignored, as llm.c does.
  num_tokens_ = count;
  fd_ = fd.fd;  // the guard still closes it if the look below throws
  dev_ = st.st_dev, ino_ = st.st_ino, size_ = st.st_size, mtime_ = st.st_mtim;
  // A look at the first tokens, not all of them (a hundred shards are not read through on every
  // rank at start): a model.vocab_size too small for the data, or a shard of another tokenizer, is
  // refused here, on every rank alike, before anything is written. Every id read later is checked too.
  std::vector<int32_t> head(static_cast<size_t>(std::min<uint64_t>(count, kTokenFileCheckedAtOpen)));
  read(0, head.size(), head.data());
  fd.fd = -1;
}

namespace {
std::string format_time(const timespec& t) {
  std::tm tm{};
  localtime_r(&t.tv_sec, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return strprintf("%s.%09ld", buf, t.tv_nsec);
}
}  // namespace

void TokenFile::check_unchanged() const {
  struct stat st {};
  std::string change;
  if (::stat(path_.c_str(), &st) != 0)
    change = strprintf("it can no longer be found (%s)", strerror(errno));
  else if (st.st_dev != dev_ || st.st_ino != ino_)
    change = strprintf("it was replaced by another file (inode %llu, it was %llu when opened)",
                       static_cast<unsigned long long>(st.st_ino), static_cast<unsigned long long>(ino_));
  else if (st.st_size != size_)
    change = strprintf("its size is %lld bytes (it was %lld when opened)", static_cast<long long>(st.st_size),
                       static_cast<long long>(size_));
  else if (st.st_mtim.tv_sec != mtime_.tv_sec || st.st_mtim.tv_nsec != mtime_.tv_nsec)
    change = strprintf("modified at %s (it was %s when opened): rewritten in place", format_time(st.st_mtim).c_str(),
                       format_time(mtime_).c_str());
  if (!change.empty())
    throw UserError(strprintf("token file '%s' changed under the run: %s. Restore it and resume from the last "
                              "checkpoint", path_.c_str(), change.c_str()));
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::read(uint64_t first, size_t n, int32_t* out) const {
  // Read, not mapped: a file truncated or rewritten under the run is one clear line, not a SIGBUS.
  // uint16 tokens land at the front of `out` and are widened in place, last first (token i's
  // int32 slot starts at or after its raw bytes, so none is overwritten before it is read).
  const size_t w = static_cast<size_t>(token_bytes_);
  const std::string e = pread_fully(fd_, out, n * w, kHeaderBytes + first * w);
  if (e.find("truncated") != std::string::npos)
    throw UserError(strprintf("token file '%s' changed under the run: tokens %llu-%llu can no longer be read (end of "
                              "file); the file was truncated or replaced. Restore it and resume from the last "
                              "checkpoint", path_.c_str(), static_cast<unsigned long long>(first),
                              static_cast<unsigned long long>(first + n - 1)));
  else if (!e.empty())  // the storage failed, after retries: the file may be good
    throw RunError(strprintf("token file '%s': tokens %llu-%llu could not be read: %s (after retries). Resume from "
                             "the last checkpoint when the storage reads",
                             path_.c_str(), static_cast<unsigned long long>(first),
                             static_cast<unsigned long long>(first + n - 1), e.c_str()),
                   kExitReadFailed);
  if (w == 2) {
    const auto* raw = reinterpret_cast<const unsigned char*>(out);
    for (size_t i = n; i-- > 0;) {
      uint16_t t;
      std::memcpy(&t, raw + i * 2, 2);
      out[i] = t;
    }
  }
  // The first id out of range, compared unsigned (a uint32 id past 2^31 is not a negative int32).
  for (size_t i = 0; i < n; ++i)
    if (static_cast<uint32_t>(out[i]) >= static_cast<uint32_t>(vocab_size_)) {
      check_unchanged();  // a file rewritten under the run says so; else the id was there from the start
      throw UserError(strprintf("'%s' holds token id %u at position %llu, but model.vocab_size is %d", path_.c_str(),
                                static_cast<uint32_t>(out[i]), static_cast<unsigned long long>(first + i),
                                vocab_size_));
    }
}

std::vector<std::string> token_file_paths(const std::string& spec, const std::string& key) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = spec.find(',', at);
    std::string entry = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t b = entry.find_first_not_of(" \t"), e = entry.find_last_not_of(" \t");
    entry = b == std::string::npos ? "" : entry.substr(b, e - b + 1);
    if (entry.empty())
      throw UserError(strprintf("%s '%s' has an empty entry: give token files or globs separated by commas",
                                key.c_str(), spec.c_str()));
    if (entry.find_first_of("*?[") == std::string::npos) {
      out.push_back(entry);
    } else {
      glob_t g{};
      const int rc = ::glob(entry.c_str(), GLOB_NOSORT, nullptr, &g);
      std::vector<std::string> found(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
      globfree(&g);
      if (rc == GLOB_NOMATCH || (rc == 0 && found.empty()))
        throw UserError(strprintf("%s: '%s' matches no file", key.c_str(), entry.c_str()));
      if (rc != 0)
        throw UserError(strprintf("%s: the glob '%s' could not be expanded (%s)", key.c_str(), entry.c_str(),
                                  rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read"));
      std::sort(found.begin(), found.end());  // bytewise: the same order in every locale
      out.insert(out.end(), found.begin(), found.end());
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

SequenceIndex locate_sequence(const std::vector<uint64_t>& first, uint64_t g) {
  // The last shard whose first sequence is <= g: past the shards of no sequence before it.
  const auto it = std::upper_bound(first.begin(), first.end() - 1, g);
  const size_t j = static_cast<size_t>(it - first.begin()) - 1;
  return {j, g - first[j]};
}

std::string DataOrder::to_json() const {
  const std::string hex = strprintf("%016llx", static_cast<unsigned long long>(sizes));
  return nlohmann::json{{"shards", shards}, {"sequences", sequences}, {"sizes", hex}}.dump();
}

DataOrder DataOrder::from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    DataOrder o;
    o.shards = j.at("shards").get<uint64_t>();
    o.sequences = j.at("sequences").get<uint64_t>();
    o.sizes = std::stoull(j.at("sizes").get<std::string>(), nullptr, 16);
    return o;
  } catch (const std::exception& e) {
    throw UserError(strprintf("the data order '%s' does not parse (%s)", text.c_str(), e.what()));
  }
}

uint64_t sequences_in(uint64_t tokens, int seq_len) {
  return tokens > 0 ? (tokens - 1) / static_cast<uint64_t>(seq_len) : 0;
}

void cut_sequence(const int32_t* seq, size_t seq_len, int32_t* inputs, int32_t* targets) {
  std::copy(seq, seq + seq_len, inputs);
  std::copy(seq + 1, seq + seq_len + 1, targets);
}

DataLoader::DataLoader(const std::string& files, int seq_len, int vocab_size, uint64_t seed, bool shuffle,
                       const std::string& key)
    : seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  if (seq_len <= 0) throw UserError(strprintf("sequence length must be positive, got %d", seq_len));
  first_.push_back(0);
  for (const std::string& path : token_file_paths(files, key)) {
    files_.push_back(std::make_unique<TokenFile>(path, vocab_size));
    const TokenFile& f = *files_.back();
    for (size_t j = 0; j + 1 < files_.size(); ++j)
      if (files_[j]->same_file(f))
        throw UserError(strprintf(f.path() == files_[j]->path() ? "%s names '%s' twice" : "%s names one file twice: "
                                  "'%s' and '%s'", key.c_str(), files_[j]->path().c_str(), f.path().c_str()));
    first_.push_back(first_.back() + sequences_in(f.num_tokens(), seq_len));
  }
  if (num_sequences() > 0) return;
  if (files_.size() == 1)
    throw UserError(strprintf("'%s' holds %llu tokens, but one sequence of seq_len %d needs at least %d tokens",
                              files_[0]->path().c_str(), static_cast<unsigned long long>(files_[0]->num_tokens()),
                              seq_len, seq_len + 1));
  throw UserError(strprintf("%s '%s': none of its %zu files holds one sequence of seq_len %d (at least %d tokens)",
                            key.c_str(), files.c_str(), files_.size(), seq_len, seq_len + 1));
}

DataOrder DataLoader::order() const {
  DataOrder o;
  o.shards = files_.size();
  o.sequences = num_sequences();
  std::vector<uint64_t> sizes(files_.size());
  for (size_t j = 0; j < sizes.size(); ++j) sizes[j] = first_[j + 1] - first_[j];
  o.sizes = fnv1a(sizes.data(), sizes.size() * sizeof(uint64_t));
  return o;
}

// Sample -> sequence. Epoch e's order is a Fisher-Yates shuffle driven only by (seed, e), so any
// rank computes it alone; the current epoch's permutation is cached.
uint64_t DataLoader::sequence_of(uint64_t sample) {
  const uint64_t S = num_sequences();
  if (!shuffle_) return sample % S;
  const uint64_t epoch = sample / S;
  if (static_cast<int64_t>(epoch) != perm_epoch_) {
    perm_.resize(S);
    std::iota(perm_.begin(), perm_.end(), uint64_t{0});
    // Seed and epoch go through the mixer separately so nearby (seed, epoch) pairs do not share streams.
    SplitMix64 rng{splitmix64_mix(seed_ ^ 0x5a3d0c2e8f6b1749ULL) ^ splitmix64(epoch)};
    for (uint64_t i = S - 1; i > 0; --i) std::swap(perm_[i], perm_[rng.below(i + 1)]);
    perm_epoch_ = static_cast<int64_t>(epoch);
  }
  return perm_[sample % S];
}

void DataLoader::load(uint64_t first_sample, int count, int32_t* inputs, int32_t* targets) {
  const size_t T = static_cast<size_t>(seq_len_);
  seq_.resize(T + 1);
  touched_.clear();
  for (int k = 0; k < count; ++k) {
    // Sequence s of a shard covers its tokens [s*T, s*T + T]; the last target is at most
    // S_j*T <= num_tokens - 1.
    const SequenceIndex at = locate_sequence(first_, sequence_of(first_sample + static_cast<uint64_t>(k)));
    files_[at.shard]->read(at.sequence * T, T + 1, seq_.data());
    if (std::find(touched_.begin(), touched_.end(), at.shard) == touched_.end()) touched_.push_back(at.shard);
    cut_sequence(seq_.data(), T, inputs + static_cast<size_t>(k) * T, targets + static_cast<size_t>(k) * T);
  }
  // After the reads: a truncated file is named by the read that fails, with the tokens it lost.
  for (size_t j : touched_) files_[j]->check_unchanged();
}

}  // namespace zero3d
