// config/json_tree.cpp: strict JSON reading, dotted paths, and the nearest-key suggestion.
#include "config/json_tree.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/check.h"
#include "core/posix_io.h"

namespace zero3d::config_json {
namespace {

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> words_of(const std::string& name) {
  std::vector<std::string> w;
  size_t start = 0;
  for (size_t u = name.find('_');; u = name.find('_', start)) {
    w.push_back(name.substr(start, u == std::string::npos ? std::string::npos : u - start));
    if (u == std::string::npos) return w;
    start = u + 1;
  }
}

// Words the candidate adds when it contains every word of `name` ("warmup_steps" ->
// "warmup_num_steps": 1), or SIZE_MAX: catches a dropped word, which costs many characters.
size_t extra_words(const std::string& name, const std::string& candidate) {
  std::vector<std::string> a = words_of(name), b = words_of(candidate);
  for (const std::string& w : a)
    if (std::find(b.begin(), b.end(), w) == b.end()) return SIZE_MAX;
  return b.size() - std::min(b.size(), a.size());
}

// Line and column (1-based) of byte index `idx` in `text`.
std::pair<size_t, size_t> position(const std::string& text, size_t idx) {
  idx = std::min(idx, text.size());
  size_t line = 1 + std::count(text.begin(), text.begin() + idx, '\n');
  size_t nl = idx == 0 ? std::string::npos : text.rfind('\n', idx - 1);
  return {line, nl == std::string::npos ? idx + 1 : idx - nl};
}

// nlohmann's text: "[json.exception.parse_error.101] parse error at line 1, column 5: <reason>".
std::string reason_of(const std::string& what) {
  size_t col = what.find("column ");
  size_t colon = col == std::string::npos ? std::string::npos : what.find(": ", col);
  if (colon != std::string::npos) return what.substr(colon + 2);
  size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

struct TooDeep {};

// Parses `text`, refusing a key repeated in one object (Python's json keeps the last one;
// DeepSpeed passes an object_pairs_hook that refuses it, and so do we). A number beyond a double
// is nlohmann's out_of_range 406.
json parse_strict(const std::string& text, std::string& duplicate) {
  std::vector<std::pair<std::string, std::set<std::string>>> objects;  // (path, keys seen) per open object
  std::string pending_key;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth >= kMaxJsonDepth)
      throw TooDeep();
    switch (ev) {
      case json::parse_event_t::object_start:
        objects.push_back({objects.empty() ? "" : join(objects.back().first, pending_key), {}});
        break;
      case json::parse_event_t::object_end:
        objects.pop_back();
        break;
      case json::parse_event_t::key:
        pending_key = parsed.get<std::string>();
        if (!objects.back().second.insert(pending_key).second && duplicate.empty())
          duplicate = join(objects.back().first, pending_key);
        break;
      case json::parse_event_t::array_start:
        pending_key += "[]";  // objects inside arrays: named after the array
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, cb);
}

}  // namespace

json parse_text(const std::string& text, const std::string& what) {
  json j;
  std::string duplicate;
  try {
    j = parse_strict(text, duplicate);
  } catch (const TooDeep&) {
    throw UserError(strprintf("%s: invalid JSON: objects and arrays nested deeper than %d levels", what.c_str(),
                              kMaxJsonDepth));
  } catch (const json::parse_error& e) {
    // e.byte counts the characters read, the offending one included: its 0-based index is byte-1.
    auto [line, column] = position(text, e.byte > 0 ? e.byte - 1 : 0);
    throw UserError(one_line(strprintf("%s: invalid JSON at line %zu, column %zu: %s", what.c_str(), line, column,
                                       reason_of(e.what()).c_str())));
  } catch (const json::exception& e) {  // out_of_range 406: a number beyond a double
    throw UserError(one_line(strprintf("%s: invalid JSON: %s (numbers must fit a 64-bit double)", what.c_str(),
                                       reason_of(e.what()).c_str())));
  }
  if (!duplicate.empty())
    throw UserError(strprintf("%s: key '%s' appears twice in one object (JSON keys must be unique; DeepSpeed "
                              "refuses this too)",
                              what.c_str(), show_key(duplicate).c_str()));
  return j;
}

json read_file(const std::string& path, const char* what) {
  const std::string text = read_text_file(path, what);
  json j = parse_text(text, path);
  if (!j.is_object())
    throw UserError(strprintf("%s: the top level must be a JSON object {...}, got %s", path.c_str(), j.type_name()));
  return j;
}

json parse_value(const std::string& text, const std::string& label) {
  try {
    std::string duplicate;
    json v = parse_strict(text, duplicate);
    if (!duplicate.empty())
      throw UserError(one_line(label + ": key '" + show_key(duplicate) + "' appears twice in one object"));
    return v;
  } catch (const json::parse_error&) {
    return text;  // not JSON: a raw string
  } catch (const TooDeep&) {
    throw UserError(strprintf("%s: objects and arrays nested deeper than %d levels", label.c_str(), kMaxJsonDepth));
  } catch (const json::out_of_range& e) {
    throw UserError(one_line(label + ": " + reason_of(e.what()) + " (numbers must fit a 64-bit double)"));
  }
}

const json* find(const json& root, const std::string& dotted) {
  const json* node = &root;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

json* find(json& root, const std::string& dotted) {
  return const_cast<json*>(find(static_cast<const json&>(root), dotted));
}

bool set(json& root, const std::string& dotted, json v) {
  json* node = &root;
  size_t start = 0;
  for (size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', start)) {
    json& next = (*node)[dotted.substr(start, dot - start)];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) return false;
    node = &next;
    start = dot + 1;
  }
  (*node)[dotted.substr(start)] = std::move(v);
  return true;
}

bool erase(json& root, const std::string& dotted) {
  json* parent = dotted.find('.') == std::string::npos ? &root : find(root, parent_of(dotted));
  return parent && parent->is_object() && parent->erase(leaf_of(dotted)) > 0;
}

std::vector<std::string> leaf_paths(const json& root, const std::string& prefix) {
  std::vector<std::string> out;
  if (!root.is_object() || root.empty()) {
    if (!prefix.empty()) out.push_back(prefix);
    return out;
  }
  for (auto it = root.begin(); it != root.end(); ++it) {
    std::vector<std::string> sub = leaf_paths(*it, join(prefix, it.key()));
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::string leaf_of(const std::string& p) {
  size_t i = p.rfind('.');
  return i == std::string::npos ? p : p.substr(i + 1);
}
std::string parent_of(const std::string& p) {
  size_t i = p.rfind('.');
  return i == std::string::npos ? "" : p.substr(0, i);
}
std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// Over full dotted paths and over leaf names (so a top-level "lr" finds optimizer.params.lr), or by
// words dropped from a leaf name ("warmup_steps" finds warmup_num_steps); ties go to the smaller
// full-path distance.
std::string nearest(const std::string& path, const std::vector<std::string>& candidates) {
  std::string leaf = leaf_of(path);
  size_t limit = std::max<size_t>(1, leaf.size() / 3);
  std::string best;
  size_t best_score = SIZE_MAX, best_full = SIZE_MAX;
  for (const std::string& c : candidates) {
    // An edit distance is at least the difference in length: a name far longer than every candidate
    // (a 5 MB key) costs no quadratic comparison.
    const std::string c_leaf = leaf_of(c);
    const size_t by_len = std::min(std::max(path.size(), c.size()) - std::min(path.size(), c.size()),
                                   std::max(leaf.size(), c_leaf.size()) - std::min(leaf.size(), c_leaf.size()));
    const size_t words = extra_words(leaf, c_leaf);
    const bool near = by_len <= limit || words <= 2;
    const size_t full = near ? levenshtein(path, c) : SIZE_MAX, by_leaf = near ? levenshtein(leaf, c_leaf) : SIZE_MAX;
    size_t score = std::min(full, by_leaf);
    if (score > limit) score = SIZE_MAX;
    if (words <= 2) score = std::min(score, words);
    if (score == SIZE_MAX) continue;
    if (score < best_score || (score == best_score && full < best_full)) best = c, best_score = score, best_full = full;
  }
  return best;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

std::string show(const json& v) {
  std::string s = to_text(v);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string show_key(const std::string& key) {
  if (key.size() <= 80) return key;
  return key.substr(0, 60) + strprintf("... (%zu characters)", key.size());
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string quoted_list(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s;
}

std::string fmt_num(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<long long>(x));
  return json(x).dump();
}

}  // namespace zero3d::config_json
