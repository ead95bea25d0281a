// data/loader.cpp: the token file, read with pread, and the seeded, layout-independent sequence order.
#include "data/loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/check.h"
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
  if (header[0] != kTokenFileMagic)
    throw UserError(strprintf("'%s' is not an llm.c token file (magic %d, expected %d)", path.c_str(), header[0],
                              kTokenFileMagic));
  if (header[1] != kTokenFileVersion)
    throw UserError(strprintf("'%s' is an llm.c token file of version %d, but zero3d reads version %d (uint16 tokens)",
                              path.c_str(), header[1], kTokenFileVersion));
  // llm.c writes the count as int32; read it unsigned so a corrupt negative count is caught as
  // truncation below instead of wrapping to a huge size.
  const uint64_t count = static_cast<uint32_t>(header[2]);
  const uint64_t needed = kHeaderBytes + count * sizeof(uint16_t);
  if (file_bytes < needed)
    throw UserError(strprintf("'%s' is truncated: header promises %llu tokens (%llu bytes) but the file has %llu bytes",
                              path.c_str(), static_cast<unsigned long long>(count),
                              static_cast<unsigned long long>(needed), static_cast<unsigned long long>(file_bytes)));
  // Bytes past the promised tokens are ignored, as llm.c does.
  num_tokens_ = count;
  // Every token id in range, a block at a time (one pass for the maximum; a second names the first bad one).
  std::vector<uint16_t> block(std::max<uint64_t>(1, std::min<uint64_t>(count, uint64_t(1) << 20)));
  for (uint64_t at = 0; at < count && vocab_size <= 65535; at += block.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block.size(), count - at));
    if (const std::string e = read_tokens(fd.fd, at, n, block.data()); !e.empty())
      throw RunError(strprintf("cannot read token file '%s': %s (after retries); run again when the storage reads",
                               path.c_str(), e.c_str()), kExitReadFailed);
    if (*std::max_element(block.begin(), block.begin() + n) < vocab_size) continue;
    const auto bad = std::find_if(block.begin(), block.end(), [&](uint16_t t) { return t >= vocab_size; });
    throw UserError(strprintf("'%s' holds token id %d at position %llu, but model.vocab_size is %d", path.c_str(),
                              static_cast<int>(*bad), static_cast<unsigned long long>(at + (bad - block.begin())),
                              vocab_size));
  }
  fd_ = std::exchange(fd.fd, -1);
  dev_ = st.st_dev, ino_ = st.st_ino, size_ = st.st_size, mtime_ = st.st_mtim;
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
    abort_job(strprintf("token file '%s' changed under the run: %s. Restore it and resume from the last checkpoint",
                        path_.c_str(), change.c_str()),
              kExitUserError);
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TokenFile::read_tokens(int fd, uint64_t first, size_t n, uint16_t* out) {
  return pread_fully(fd, out, n * sizeof(uint16_t), kHeaderBytes + first * sizeof(uint16_t));
}

void TokenFile::read(uint64_t first, size_t n, uint16_t* out) const {
  // Read, not mapped: a file truncated or rewritten under the run is one clear line, not a SIGBUS.
  // Only this rank sees it, so the job ends here.
  if (const std::string e = read_tokens(fd_, first, n, out); e.find("truncated") != std::string::npos)
    abort_job(strprintf("token file '%s' changed under the run: tokens %llu-%llu can no longer be read (end of "
                        "file); the file was truncated or replaced. Restore it and resume from the last checkpoint",
                        path_.c_str(), static_cast<unsigned long long>(first),
                        static_cast<unsigned long long>(first + n - 1)),
              kExitUserError);
  else if (!e.empty())  // the storage failed, after retries: the file may be good
    abort_job(strprintf("token file '%s': tokens %llu-%llu could not be read: %s (after retries). Resume from the "
                        "last checkpoint when the storage reads",
                        path_.c_str(), static_cast<unsigned long long>(first),
                        static_cast<unsigned long long>(first + n - 1), e.c_str()),
              kExitReadFailed);
  for (size_t i = 0; i < n; ++i)
    if (out[i] >= vocab_size_)
      abort_job(strprintf("token file '%s' changed under the run: token %llu is %d, beyond model.vocab_size %d. "
                          "Restore it and resume from the last checkpoint",
                          path_.c_str(), static_cast<unsigned long long>(first + i), out[i], vocab_size_),
                kExitUserError);
}

DataLoader::DataLoader(const std::string& path, int seq_len, int vocab_size, uint64_t seed, bool shuffle)
    : file_(path, vocab_size), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  if (seq_len <= 0) throw UserError(strprintf("sequence length must be positive, got %d", seq_len));
  const uint64_t n = file_.num_tokens();
  num_sequences_ = n > 0 ? (n - 1) / static_cast<uint64_t>(seq_len) : 0;
  if (num_sequences_ == 0)
    throw UserError(strprintf("'%s' holds %llu tokens, but one sequence of seq_len %d needs at least %d tokens",
                              path.c_str(), static_cast<unsigned long long>(n), seq_len, seq_len + 1));
}

// Sample -> sequence. Epoch e's order is a Fisher-Yates shuffle driven only by (seed, e), so any
// rank computes it alone; the current epoch's permutation is cached.
uint64_t DataLoader::sequence_of(uint64_t sample) {
  const uint64_t S = num_sequences_;
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
  for (int k = 0; k < count; ++k) {
    // Sequence s covers tokens [s*T, s*T + T]; its last target is at most S*T <= num_tokens - 1.
    file_.read(sequence_of(first_sample + static_cast<uint64_t>(k)) * T, T + 1, seq_.data());
    const uint16_t* seq = seq_.data();
    int32_t* in = inputs + static_cast<size_t>(k) * T;
    int32_t* tg = targets + static_cast<size_t>(k) * T;
    for (size_t t = 0; t < T; ++t) {
      in[t] = seq[t];
      tg[t] = seq[t + 1];
    }
  }
  // After the reads: a truncated file is named by the read that fails, with the tokens it lost.
  file_.check_unchanged();
}

}  // namespace zero3d
