// train/metrics.h: metrics.jsonl, one JSON object per line, written by rank 0 only.
// Every record has "kind" ("run", "train", "val", later "checkpoint"). Floating-point values are
// written with 17 significant digits (%.17g), enough to round-trip a double exactly, so two runs
// can be compared bit for bit with a text diff. Non-finite values are written as null.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/posix_io.h"

namespace zero3d {

class MetricsRecord {
 public:
  explicit MetricsRecord(const char* kind) { add("kind", kind); }
  MetricsRecord& add(const char* key, double v);
  MetricsRecord& add(const char* key, int64_t v);
  MetricsRecord& add(const char* key, int v) { return add(key, static_cast<int64_t>(v)); }
  MetricsRecord& add(const char* key, bool v);
  MetricsRecord& add(const char* key, const std::string& v);
  MetricsRecord& add(const char* key, const char* v) { return add(key, std::string(v)); }
  MetricsRecord& add_object(const char* key, const nlohmann::ordered_json& v);  // a nested object, as it is
  std::string line() const { return body_ + "}"; }

 private:
  void key(const char* k);
  std::string body_ = "{";
};

std::string json_escape(const std::string& s);
std::string format_double(double v);  // %.17g, "null" for inf/nan
std::string format_hms(double seconds);  // H:MM:SS, rounded; negative counts as 0

class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);  // opens for append; throws UserError on failure
  // One line, written whole or not at all: a line that fails (disk full) is dropped with one
  // warning for the run, and the run goes on (its checkpoints say whether it can).
  void write(const MetricsRecord& r);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  AppendFile file_;
  bool warned_ = false;
};

// A run's metrics.jsonl read back, one record a line with the line's text (blank lines skipped):
// what a resumed run keeps of it, and the rates a dry run reads from it. A line that is not JSON
// is a UserError naming the file and the line: a run does not continue such a file. No file: none.
struct MetricsLine {
  std::string text;
  nlohmann::json record;
};
std::vector<MetricsLine> read_metrics(const std::string& path);

}  // namespace zero3d
