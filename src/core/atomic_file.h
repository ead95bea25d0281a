// core/atomic_file.h: a file that appears whole or not at all. Writes go to PATH.tmp; commit()
// closes it (durable: after fsync of the file) and renames it over PATH (durable: then fsyncs the
// directory, so the rename survives a crash). A writer that throws or dies before commit leaves
// no PATH.tmp behind (the destructor removes it). Every failure is a UserError naming the file.
#pragma once
#include <cstdio>
#include <string>

namespace zero3d {

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

// fsync a file or directory by path (a directory: so the renames in it survive a crash).
void sync_path(const std::string& path);

// The whole text at once.
void write_file_atomic(const std::string& path, const std::string& text, bool durable = false,
                       const std::string& what = "file");

}  // namespace zero3d
