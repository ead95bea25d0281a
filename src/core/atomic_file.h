// core/atomic_file.h: the one way zero3d writes an output: it appears whole or not at all, and it
// never replaces what is not a file (or directory) of its own.
// - AtomicFile: writes go to PATH.tmp; commit() closes it (durable: after fsync of the file) and
//   renames it over PATH (durable: then fsyncs the directory, so the rename survives a crash). A
//   writer that throws or dies before commit leaves no PATH.tmp behind (the destructor removes it).
// - AtomicDir: a directory of files (an export) written into DIR.tmp beside DIR and swapped into
//   place at commit(); what DIR held before is removed only then.
// A target that exists must be a regular file (AtomicFile; a symlink is followed and its target
// replaced) or a directory holding only the names the writer itself writes (AtomicDir): a device
// node, a FIFO, a socket or someone else's directory is refused by name before anything is
// created. Every failure is a UserError naming the file.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

namespace zero3d {

// Where an output file named `path` is written: path itself, or the file a symlink at path names.
// A UserError naming `what` when it exists and is not a regular file.
std::string output_file_path(const std::string& path, const std::string& what);

class AtomicFile {
 public:
  // `what` names the file in errors ("token file", "safetensors file").
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void seek(long offset);  // from the start
  void commit(bool durable = false);
  const std::string& tmp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const char* action) const;
  std::string path_, tmp_, what_;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

class AtomicDir {
 public:
  // `names`: every file the writer may put in it; an existing DIR holding anything else is refused.
  AtomicDir(std::string path, std::string what, std::vector<std::string> names);
  ~AtomicDir();  // before commit: removes DIR.tmp and what is in it
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  std::string file(const std::string& name) const;  // where to write `name` (one of `names`) until commit
  void commit();  // DIR.tmp becomes DIR in one rename (an exchange where DIR exists), then the old is removed

 private:
  std::string path_, tmp_, what_;
  std::vector<std::string> names_;
  bool committed_ = false;
};

// fsync a file or directory by path (a directory: so the renames in it survive a crash).
void sync_path(const std::string& path);

// The whole text at once.
void write_file_atomic(const std::string& path, const std::string& text, bool durable = false,
                       const std::string& what = "file");

}  // namespace zero3d
