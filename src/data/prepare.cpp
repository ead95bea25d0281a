// data/prepare.cpp: text files into llm.c token files (data/prepare.h).
// Two ways to read, one writer:
// - "byte" streams each file in 64 KiB pieces (token = byte, exact at any cut), so an endless
//   input (a FIFO, /dev/zero) is read until the format's limit or an interrupt;
// - every other tokenizer reads a document whole (a regex split or a merge depends on what
//   follows), on `threads` workers; the writer takes the encoded documents in input order, so the
//   output does not depend on the thread count.
// The writer (ShardWriter) streams tokens into PATH.tmp files, writes each header last (the count
// is known only then) and renames them all into place at the end.
#include "data/prepare.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

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

constexpr uint64_t kMaxDocumentBytes = 1ull << 30;  // a document read whole

// The whole of `path` (a FIFO too: read until its writer closes it).
std::string read_document(const std::string& path, const char* tokenizer_kind) {
  InputFile src{std::fopen(path.c_str(), "rb")};
  if (!src.f) throw UserError(strprintf("cannot open text file '%s': %s", path.c_str(), strerror(errno)));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const size_t n = std::fread(buf, 1, sizeof buf, src.f);
    text.append(buf, n);
    if (text.size() > kMaxDocumentBytes)
      throw UserError(strprintf("text file '%s' is over 1 GiB: the %s tokenizer reads a document whole; split it "
                                "into several files (each is one document)", path.c_str(), tokenizer_kind));
    if (n < sizeof buf) break;
  }
  if (std::ferror(src.f)) throw UserError(strprintf("cannot read text file '%s': %s", path.c_str(), strerror(errno)));
  return text;
}

// Token files in order, each a header and uint16 or uint32 tokens; committed together.
class ShardWriter {
 public:
  ShardWriter(const PrepareOptions& opt, bool u32) : opt_(opt), u32_(u32) {
    const uint64_t most = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
    if (opt.shard_tokens > most)
      throw UserError(strprintf("--shard-tokens %llu: at most %llu, the format's int32 count",
                                static_cast<unsigned long long>(opt.shard_tokens), static_cast<unsigned long long>(most)));
    limit_ = opt.shard_tokens ? opt.shard_tokens : most;
    prefix_ = opt.out;
    if (opt.shard_tokens && prefix_.ends_with(".bin")) prefix_.resize(prefix_.size() - 4);
    check_not_input(path_of(0));
  }

  // Appends ids (below the vocabulary size: 16 or 32 bits); `source` names the input in errors.
  void append(const int32_t* ids, size_t n, const std::string& source) {
    while (n > 0) {
      if (!current_ || in_current_ == limit_) {
        if (current_ && !opt_.shard_tokens)
          throw UserError(strprintf("token file '%s' would hold more than %llu tokens, the most the format's int32 "
                                    "count allows ('%s' is that long or endless): split the text into several token "
                                    "files, or write shards (--shard-tokens)",
                                    opt_.out.c_str(), static_cast<unsigned long long>(limit_), source.c_str()));
        open_next();
      }
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, limit_ - in_current_));
      if (u32_) {
        current_->write(ids, take * sizeof(int32_t));
      } else {
        narrow_.assign(ids, ids + take);
        current_->write(narrow_.data(), take * sizeof(uint16_t));
      }
      ids += take, n -= take;
      in_current_ += take;
      total_ += take;
    }
  }

  uint64_t tokens() const { return total_; }

  // Headers written, every file renamed into place; their paths.
  std::vector<std::string> commit() {
    if (!current_) open_next();  // no tokens: still one (empty) token file
    finish_current();
    for (auto& f : files_) f->commit();
    return paths_;
  }

 private:
  std::string path_of(size_t index) const {
    return opt_.shard_tokens ? strprintf("%s_%06zu.bin", prefix_.c_str(), index) : opt_.out;
  }
  // An output replaces its file only at the end: it must not be an input.
  void check_not_input(const std::string& path) const {
    for (const std::string& t : opt_.texts) {
      std::error_code ec;
      if (std::filesystem::equivalent(t, path, ec))
        throw UserError(strprintf("data prepare: output '%s' is also an input text ('%s'): give another --out",
                                  path.c_str(), t.c_str()));
    }
  }
  void open_next() {
    if (current_) finish_current();
    const std::string path = path_of(files_.size());
    check_not_input(path);
    files_.push_back(std::make_unique<AtomicFile>(path, "token file"));
    paths_.push_back(path);
    current_ = files_.back().get();
    const int32_t header[kTokenFileHeaderInts] = {};
    current_->write(header, sizeof header);  // placeholder until the count is known
    in_current_ = 0;
  }
  void finish_current() {
    int32_t header[kTokenFileHeaderInts] = {};
    header[0] = u32_ ? kTokenFileMagicU32 : kTokenFileMagic;
    header[1] = u32_ ? kTokenFileVersionU32 : kTokenFileVersion;
    header[2] = static_cast<int32_t>(in_current_);
    current_->seek(0);
    current_->write(header, sizeof header);
  }

  const PrepareOptions& opt_;
  bool u32_;
  uint64_t limit_ = 0;
  std::string prefix_;
  std::vector<std::unique_ptr<AtomicFile>> files_;
  std::vector<std::string> paths_;
  AtomicFile* current_ = nullptr;
  uint64_t in_current_ = 0, total_ = 0;
  std::vector<uint16_t> narrow_;
};

// The progress line: input MB, tokens, rate; rewritten in place on a terminal, every 10 s otherwise.
class Progress {
 public:
  Progress(bool on, size_t files) : on_(on), tty_(isatty(2)), files_(files), start_(now()), last_(start_) {}
  void update(uint64_t bytes, uint64_t tokens, size_t files_done, bool force = false) {
    if (!on_) return;
    const double t = now();
    if (!force && t - last_ < (tty_ ? 0.5 : 10.0)) return;
    last_ = t;
    std::fprintf(stderr, "%sdata prepare: %zu/%zu files, %.1f MB, %llu tokens, %.1f MB/s%s", tty_ ? "\r" : "",
                 files_done, files_, bytes / 1e6, static_cast<unsigned long long>(tokens), bytes / 1e6 / std::max(t - start_, 1e-9),
                 tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void done(uint64_t bytes, uint64_t tokens) {  // the final count, on a terminal
    if (!on_ || !tty_) return;
    update(bytes, tokens, files_, true);
    std::fputc('\n', stderr);
  }
  double seconds() const { return now() - start_; }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool on_, tty_;
  size_t files_;
  double start_, last_;
};

// The byte tokenizer: each file streamed in pieces.
void stream_bytes(const PrepareOptions& opt, ShardWriter& out, Progress& progress, uint64_t& bytes) {
  std::vector<unsigned char> buf(1 << 16);
  std::vector<int32_t> ids(buf.size());
  for (size_t k = 0; k < opt.texts.size(); ++k) {
    const std::string& in = opt.texts[k];
    InputFile src{std::fopen(in.c_str(), "rb")};
    if (!src.f) throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
    for (;;) {
      throw_if_interrupted("data prepare");
      const size_t n = std::fread(buf.data(), 1, buf.size(), src.f);
      for (size_t i = 0; i < n; ++i) ids[i] = buf[i];
      out.append(ids.data(), n, in);
      bytes += n;
      progress.update(bytes, out.tokens(), k);
      if (n < buf.size()) break;
    }
    if (std::ferror(src.f)) throw UserError(strprintf("cannot read text file '%s': %s", in.c_str(), strerror(errno)));
  }
}

// Every other tokenizer: documents encoded by `threads` workers, at most `window` ahead of the
// writer, written in input order.
void encode_parallel(const Tokenizer& tok, const PrepareOptions& opt, int threads, ShardWriter& out,
                     Progress& progress, uint64_t& bytes) {
  struct Slot {
    std::vector<int32_t> ids;
    uint64_t bytes = 0;
    std::exception_ptr error;  // what reading or encoding threw, rethrown by the writer as it was
    bool ready = false;
  };
  const size_t n_docs = opt.texts.size();
  const size_t window = static_cast<size_t>(2 * threads);
  std::vector<Slot> slots(window);
  std::mutex mu;
  std::condition_variable cv;
  size_t next = 0, written = 0;
  bool stop = false;

  auto work = [&] {
    for (;;) {
      size_t i;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || next >= n_docs || next < written + window; });
        if (stop || next >= n_docs) return;
        i = next++;
      }
      Slot local;
      try {
        const std::string text = read_document(opt.texts[i], tok.kind());
        tok.encode_document(text, local.ids);
        local.bytes = text.size();
      } catch (...) {
        local.error = std::current_exception();
      }
      std::lock_guard lock(mu);
      Slot& s = slots[i % window];
      s = std::move(local);
      s.ready = true;
      cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  struct Join {  // the workers end before this function does, whatever it throws
    std::vector<std::thread>& pool;
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    ~Join() {
      {
        std::lock_guard lock(mu);
        stop = true;
      }
      cv.notify_all();
      for (auto& t : pool) t.join();
    }
  } join{pool, mu, cv, stop};
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);

  for (size_t i = 0; i < n_docs; ++i) {
    throw_if_interrupted("data prepare");
    Slot doc;
    {
      std::unique_lock lock(mu);
      while (!slots[i % window].ready) {
        cv.wait_for(lock, std::chrono::milliseconds(100));
        lock.unlock();
        throw_if_interrupted("data prepare");
        progress.update(bytes, out.tokens(), i);
        lock.lock();
      }
      doc = std::move(slots[i % window]);
      slots[i % window] = Slot{};
      ++written;
    }
    cv.notify_all();
    if (doc.error) std::rethrow_exception(doc.error);
    out.append(doc.ids.data(), doc.ids.size(), opt.texts[i]);
    bytes += doc.bytes;
    progress.update(bytes, out.tokens(), i + 1);
  }
}

// CPU seconds of the process so far, every thread's.
double process_cpu_seconds() {
  rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

PrepareResult prepare_tokens(const Tokenizer& tok, const PrepareOptions& opt) {
  // Refuse before creating anything: every input must be there and readable (checked without
  // opening it: a FIFO's writer sends its text once, to the one open that reads it), the output
  // directory must exist.
  for (const std::string& in : opt.texts) {
    struct stat st {};
    if (::stat(in.c_str(), &st) != 0 || ::access(in.c_str(), R_OK) != 0)
      throw UserError(strprintf("cannot open text file '%s': %s", in.c_str(), strerror(errno)));
    if (S_ISDIR(st.st_mode)) throw UserError(strprintf("text file '%s' is a directory", in.c_str()));
  }
  const std::filesystem::path parent = std::filesystem::path(opt.out).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
    throw UserError(strprintf("output directory '%s' for token file '%s' does not exist", parent.c_str(),
                              opt.out.c_str()));

  const double cpu_start = process_cpu_seconds();
  ShardWriter out(opt, tok.vocab_size() > 65536);
  Progress progress(opt.progress, opt.texts.size());
  PrepareResult r;
  if (std::string_view(tok.kind()) == "byte") {
    stream_bytes(opt, out, progress, r.bytes);
  } else {
    const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    encode_parallel(tok, opt, std::min<int>(threads, static_cast<int>(std::max<size_t>(1, opt.texts.size()))), out,
                    progress, r.bytes);
  }
  progress.done(r.bytes, out.tokens());
  r.files = out.commit();
  r.tokens = out.tokens();
  r.seconds = progress.seconds();
  r.cpu_seconds = process_cpu_seconds() - cpu_start;
  return r;
}

uint64_t prepare_token_file(const std::vector<std::string>& text_files, const std::string& out_path) {
  PrepareOptions opt;
  opt.texts = text_files;
  opt.out = out_path;
  return prepare_tokens(*load_tokenizer("byte"), opt).tokens;
}

}  // namespace zero3d
