#include "app/args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

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

}  // namespace zero3d
