// config/json_tree.h: the JSON side of the config: reading a file strictly (a position for every
// syntax error, a duplicate key or an out-of-range number is an error, as in DeepSpeed), dotted
// paths into a tree, and the "did you mean" for a mistyped key.
// Invariant: nothing here knows the schema; callers pass the candidate keys in.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero3d::config_json {

using json = nlohmann::json;

// JSON is nested at most this deep (objects and arrays): deeper input is refused while it is read,
// before a tree is built (a config or a header nests 4 levels; 100000 crashed the reader).
constexpr int kMaxJsonDepth = 64;

// `text` as JSON; throws UserError starting with `what` and saying why in zero3d's words (line and
// column of a syntax error, a duplicate key's dotted path, too deep, a number beyond a double).
json parse_text(const std::string& text, const std::string& what);

// The object in `path` (parse_text's checks, and a non-object top level is an error). `what` names
// the file's role ("config file").
json read_file(const std::string& path, const char* what);

// `text` as JSON for --set; a text that is not JSON is a string (paths, names like WarmupLR).
// Throws UserError for a number that does not fit a double (1e400). `label` starts the error.
json parse_value(const std::string& text, const std::string& label);

// The node at "a.b.c", or nullptr.
const json* find(const json& root, const std::string& dotted);
json* find(json& root, const std::string& dotted);
// Sets "a.b.c" = v, creating objects on the way; false when a node on the way is not an object.
bool set(json& root, const std::string& dotted, json v);
// Removes "a.b.c"; true when it was there.
bool erase(json& root, const std::string& dotted);
// Every leaf path under `root` (an empty object counts as a leaf).
std::vector<std::string> leaf_paths(const json& root, const std::string& prefix = "");

std::string leaf_of(const std::string& dotted);
std::string parent_of(const std::string& dotted);
std::string join(const std::string& prefix, const std::string& key);

// The best of `candidates` for a mistyped `path`: same leaf elsewhere, a dropped or added word,
// or the smallest edit distance within a third of the name; "" when none is close.
std::string nearest(const std::string& path, const std::vector<std::string>& candidates);

// JSON as zero3d writes it (files, checkpoint attributes, --json lines): a path's bytes that are not
// UTF-8 (a Linux file name is bytes) written as U+FFFD, where the JSON writer would throw.
template <class J>
std::string to_text(const J& j, int indent = -1) {
  return j.dump(indent, ' ', false, J::error_handler_t::replace);
}
// Whether s is UTF-8 text (as a JSON string must be).
bool valid_utf8(const std::string& s);
// A value for an error message: compact, one line, at most 60 characters (bytes that are not
// UTF-8 shown as U+FFFD).
std::string show(const json& v);
// A key or path for an error message: as is up to 80 characters, else cut and its length said.
std::string show_key(const std::string& key);
std::string one_line(std::string s);
std::string quoted_list(const std::vector<std::string>& v);
std::string fmt_num(double x);

}  // namespace zero3d::config_json
