#include "train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "config/json_tree.h"
#include "core/check.h"
#include "core/log.h"

namespace zero3d {

std::string format_double(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string format_hms(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  return strprintf("%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += strprintf("\\u%04x", c);
        else out += c;
    }
  }
  return out + "\"";
}

void MetricsRecord::key(const char* k) {
  if (body_.size() > 1) body_ += ", ";
  body_ += json_escape(k) + ": ";
}
MetricsRecord& MetricsRecord::add(const char* k, double v) { key(k); body_ += format_double(v); return *this; }
MetricsRecord& MetricsRecord::add(const char* k, int64_t v) { key(k); body_ += std::to_string(v); return *this; }
MetricsRecord& MetricsRecord::add(const char* k, bool v) { key(k); body_ += v ? "true" : "false"; return *this; }
MetricsRecord& MetricsRecord::add(const char* k, const std::string& v) { key(k); body_ += json_escape(v); return *this; }
MetricsRecord& MetricsRecord::add_object(const char* k, const nlohmann::ordered_json& v) { key(k); body_ += v.dump(); return *this; }

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (const std::string e = file_.open(path); !e.empty())
    throw UserError(strprintf("cannot open metrics file '%s': %s", path.c_str(), e.c_str()));
}
void MetricsLog::write(const MetricsRecord& r) {
  const std::string failed = file_.append(r.line() + "\n");
  if (failed.empty() || warned_) return;
  warned_ = true;
  log_warn("metrics file '%s': a record was not written (%s); the run goes on, and this warning is not repeated",
           path_.c_str(), failed.c_str());
}

std::vector<MetricsLine> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<MetricsLine> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back({line, config_json::parse_text(line, path)});
    } catch (const UserError&) {
      throw UserError(strprintf("%s:%d: not a JSON record; cannot continue this run's metrics", path.c_str(), n));
    }
  }
  return out;
}

}  // namespace zero3d
