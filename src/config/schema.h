// config/schema.h: the table of every config key (ours and DeepSpeed's), one entry per key.
// An entry says what the key accepts, its default, what it means, when it applies, what zero3d
// does with it, and (when honoured) the Config member it is stored in, by member pointer: the
// member's initializer in config.h is the default, so no key is declared twice.
//
// What zero3d does with a key (Status):
//   honoured   stored in Config and acted on;
//   fixed      accepted at the values of the one behaviour zero3d has (contiguous_gradients: true),
//              refused at any other with what zero3d does instead;
//   no_effect  accepted, cannot change the result here (GPU-only, libraries we do not have):
//              listed in one notice at start when present;
//   refused    present at all is an error naming what to use instead.
#pragma once
#include <climits>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace zero3d::config_schema {

using json = nlohmann::json;

enum class Kind { Integer, Number, Bool, String, Choice, Betas, StringList, Object, Any };
enum class Status { honoured, fixed, no_effect, refused };

constexpr double kIntMax = INT_MAX;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Another key's resolved value, for defaults and "auto" values that depend on it.
using Lookup = std::function<json(const std::string&)>;

struct Key {
  std::string path;  // dotted, e.g. "optimizer.params.lr"
  Kind kind = Kind::Any;
  json def;          // normalised default; null = none (required, derived, or not applicable)
  std::string doc;
  double lo = -kInf, hi = kInf;  // Integer/Number range; lo_open makes it lo < x
  bool lo_open = false;
  std::vector<std::string> choices;  // Choice, in the order of the enum stored
  std::vector<std::string> refused_choices;  // Choice: DeepSpeed's other values, refused with `instead`
  bool nocase = false;               // Choice: matched ignoring case, stored as spelled here
  bool nonempty = false;             // String: "" is invalid
  bool required = false;             // required whenever it applies
  bool auto_is_value = false;        // "auto" is one of its values (checkpoint.load), not the placeholder
  // String: names files the run reads (Files::list: comma-separated, as data.train). In a preset
  // (config/presets.h) a relative one is the preset tree's; the values in `words` name no file.
  enum class Files { none, one, list } files = Files::none;
  std::vector<std::string> words;
  std::string when_key;              // applies only when when_key's value is one of when_values
  std::vector<std::string> when_values;
  Status status = Status::honoured;
  std::vector<json> accepted;  // fixed: the accepted values besides the default
  std::string instead;         // fixed/refused: what zero3d does, or what to use instead
  std::function<json(const Lookup&)> def_fn;   // a default that depends on other keys
  std::function<json(const Lookup&)> auto_fn;  // "auto" when the run config has no value: derived
  std::string auto_doc;                        // how auto_fn derives it
  std::function<void(Config&, const json&)> store;  // honoured: put the normalised value in Config

  Key range(double l, double h, bool open = false) const;
  Key need() const;
  Key no_default() const;
  Key only_when(std::string key, std::vector<std::string> values) const;
  Key ignore_case() const;
  Key non_empty() const;
  Key reads_files(Files f, std::vector<std::string> not_files = {}) const;
  Key derived_default(std::function<json(const Lookup&)> f) const;
  Key auto_from(std::string how, std::function<json(const Lookup&)> f) const;
  Key also_accept(std::vector<json> values) const;
  Key refuse_values(std::vector<std::string> values, std::string what_instead) const;
};

// Builders for the keys zero3d does not honour (status fixed, no_effect, refused); the kind comes
// from the default's JSON type.
Key only(std::string path, json def, std::string instead, std::vector<json> also = {});
Key inert(std::string path, json def, std::string why);
Key refuse(std::string path, std::string instead);
// A DeepSpeed section with an "enabled" switch that zero3d does not implement: accepted (without
// effect) while disabled, refused when enabled; its other keys are taken as they are.
Key switched_off(std::string path, std::string instead);
// DeepSpeed's keys that zero3d does not honour (config/schema_deepspeed.cpp).
std::vector<Key> deepspeed_keys();

const std::vector<Key>& schema();
const Key* find_key(const std::string& path);
// Every proper prefix of a key path ("optimizer", "optimizer.params", ...).
const std::set<std::string>& sections();
// Every key path and section, for suggestions.
const std::vector<std::string>& all_names();

// DeepSpeed's old names, rewritten to the current ones before anything else looks at the tree
// (as DeepSpeed's pydantic models do with `deprecated=True, new_param=...`).
struct Alias {
  std::string old_path, new_path;
  std::function<json(const json&)> value;  // old value -> new value; null: nothing to set
};
const std::vector<Alias>& aliases();

// Checks `v` against `k`; the normalised value (integers as int64, numbers as double, choices as
// spelled in the schema), or null when `v` is not valid.
json normalise(const Key& k, const json& v);
// What a key accepts, for error messages: "a positive integer", "one of \"AdamW\", \"Adam\"".
std::string valid_text(const Key& k);
const char* status_text(Status s);

}  // namespace zero3d::config_schema
