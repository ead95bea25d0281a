#include "app/args.h"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <map>

#include "core/check.h"
#include "core/log.h"

namespace zero3d {

std::string option_value(const Args& a, size_t& i, const char* usage) {
  if (i + 1 >= a.size() || a[i + 1].starts_with("--"))
    throw UserError(strprintf("option %s needs a value\n%s", a[i].c_str(), usage));
  return a[++i];
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

bool wants_help(const Args& a) {
  for (const auto& s : a)
    if (s == "--help" || s == "-h") return true;
  return false;
}

std::optional<int> usage_exit(const Args& a, const char* usage) {
  if (!a.empty() && !wants_help(a)) return std::nullopt;
  log_info("%s", usage);
  return a.empty() ? kExitUserError : 0;
}

double parse_number(const std::string& s, const char* what) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  throw UserError(strprintf("%s must be a number, got '%s'", what, s.c_str()));
}

double parse_positive(const std::string& s, const char* what) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0)) throw UserError(strprintf("%s must be a positive number, got '%s'", what, s.c_str()));
  return v;
}

int64_t parse_whole(const std::string& s, const char* what, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  const bool digits = !s.empty() && s.find_first_not_of("+-0123456789") == std::string::npos;
  if (!digits || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw UserError(strprintf("%s must be a whole number from %lld to %lld, got '%s'", what, (long long)lo, (long long)hi,
                              s.c_str()));
  return v;
}

uint64_t parse_bytes(const std::string& s, const char* what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  static const std::map<std::string, double> scale = {
      {"", 1}, {"K", 0x1p10}, {"M", 0x1p20}, {"G", 0x1p30}, {"T", 0x1p40},
      {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}};
  const auto it = scale.find(unit);
  const double bytes = it == scale.end() ? 0 : v * it->second;
  if (s.empty() || end == s.c_str() || !(bytes >= 1 && bytes <= 0x1p60))
    throw UserError(strprintf("%s must be a number of bytes from 1 to 1024T (an optional K, M, G or T: powers of 1024), "
                              "got '%s'", what, s.c_str()));
  return static_cast<uint64_t>(bytes);
}

}  // namespace zero3d
