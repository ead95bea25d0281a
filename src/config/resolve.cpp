// config/resolve.cpp: from files and --set to a Config. Order of work:
//   1. read the run config; overlay the DeepSpeed file (a section naming another optimizer or
//      scheduler type replaces the run config's section; a concrete batch key replaces the run
//      config's three batch keys); apply --set overrides in order; remember who set each key;
//   2. rewrite DeepSpeed's old key names to the current ones;
//   3. reject unknown keys (naming the nearest valid one), wrong types and ranges;
//   4. resolve "auto" (the run config's value, else a derived one, else the default);
//   5. apply the schema's verdict: keys for another optimizer/scheduler type, values zero3d does
//      not implement, refused keys; collect the keys accepted without effect for one notice;
//   6. required keys, DeepSpeed's batch arithmetic, the model's cross-key rules;
//   7. store every honoured key in Config, and write the resolved tree with each value's source.
#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "config/config.h"
#include "config/json_tree.h"
#include "config/schema.h"
#include "core/check.h"

namespace zero3d {
namespace {

using namespace config_json;
using namespace config_schema;

int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

const char* const kBatchKeys[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"};

bool is_batch_key(const std::string& p) {
  return std::find(std::begin(kBatchKeys), std::end(kBatchKeys), p) != std::end(kBatchKeys);
}

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Remembers, for every node of `tree` under `prefix`, which source set it.
void record_origin(const json& tree, const std::string& prefix, size_t source, std::map<std::string, size_t>& origin) {
  if (!prefix.empty()) origin[prefix] = source;
  if (!tree.is_object()) return;
  for (auto it = tree.begin(); it != tree.end(); ++it) record_origin(*it, join(prefix, it.key()), source, origin);
}

// Recursive object merge: `overlay` wins; objects merge key by key.
void merge_into(json& base, const json& overlay) {
  for (auto it = overlay.begin(); it != overlay.end(); ++it) {
    auto b = base.find(it.key());
    if (b != base.end() && b->is_object() && it->is_object())
      merge_into(*b, *it);
    else
      base[it.key()] = *it;
  }
}

class Resolver {
 public:
  Resolver(const ConfigSources& sources, int world_size) : src_(sources), world_size_(world_size) {}

  Config run() {
    read_sources();
    apply_aliases();
    check_refused_choices();
    check_tree(user_, "");
    normalise_present();
    resolve_auto();
    check_applicability();
    check_status();
    check_required();
    Config c;
    resolve_batch();
    check_model();
    fill(c);
    return c;
  }

 private:
  // Where a key came from: the index in sources_ of its file or the --set that set it (or set the
  // section holding it); -1 when nothing did.
  int source_of(const std::string& path) const {
    for (std::string p = path; !p.empty(); p = parent_of(p)) {
      auto it = origin_.find(p);
      if (it != origin_.end()) return static_cast<int>(it->second);
    }
    return -1;
  }
  // An error about `paths` starts with the source applied last among them (an override beats
  // the DeepSpeed file beats the run config), or the run config when none of them was set.
  [[noreturn]] void fail(std::initializer_list<std::string> paths, const std::string& msg) const {
    int source = 0;
    for (const std::string& p : paths) source = std::max(source, source_of(p));
    throw UserError(one_line(sources_[source] + ": " + msg));
  }
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const { fail({path}, msg); }

  void read_sources() {
    user_ = read_file(src_.config_file, "config file");
    if (!src_.preset_root.empty()) rebase_preset_files(user_);
    base_ = user_;
    sources_.push_back(src_.config_file);
    if (!src_.deepspeed_file.empty()) {
      json ds = read_file(src_.deepspeed_file, "DeepSpeed config file");
      // A ds_config is written whole: another optimizer or scheduler type brings its own params...
      for (const char* section : {"optimizer", "scheduler"}) {
        const json *mine = find(user_, std::string(section) + ".type"), *theirs = find(ds, std::string(section) + ".type");
        if (mine && theirs && mine->is_string() && theirs->is_string() &&
            lower(mine->get<std::string>()) != lower(theirs->get<std::string>()))
          user_.erase(section);
      }
      // ...and a concrete batch key replaces the run config's three (the rest derived as DeepSpeed does).
      bool concrete = false;
      for (const char* k : kBatchKeys)
        if (ds.contains(k) && !is_auto(ds[k])) concrete = true;
      if (concrete) {
        batch_replaced_ = true;
        for (const char* k : kBatchKeys) user_.erase(k);
      }
    }
    record_origin(user_, "", 0, origin_);
    if (!src_.deepspeed_file.empty()) {
      json ds = read_file(src_.deepspeed_file, "DeepSpeed config file");
      merge_into(user_, ds);
      sources_.push_back(src_.deepspeed_file);
      record_origin(ds, "", sources_.size() - 1, origin_);
    }
    for (const std::string& o : src_.overrides) apply_override(o);
  }

  // A preset's relative file paths (data.train: "input/data/train.bin") are its tree's, not the
  // working directory's: only those the preset file itself sets (not --set, not --deepspeed).
  void rebase_preset_files(json& tree) const {
    for (const Key& k : schema()) {
      json* v = k.files == Key::Files::none ? nullptr : find(tree, k.path);
      if (!v || !v->is_string()) continue;  // a wrong type is reported by the checks below
      std::string out;
      const std::string text = v->get<std::string>();
      for (size_t at = 0;;) {
        const size_t comma = k.files == Key::Files::list ? text.find(',', at) : std::string::npos;
        std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        const size_t b = item.find_first_not_of(" \t");
        if (b != std::string::npos && item[b] != '/' &&
            std::find(k.words.begin(), k.words.end(), item.substr(b)) == k.words.end())  // " byte" is a word too
          item = src_.preset_root + "/" + item.substr(b);
        out += item;
        if (comma == std::string::npos) break;
        out += ',';
        at = comma + 1;
      }
      *v = out;
    }
  }

  void apply_override(const std::string& o) {
    std::string label = "--set " + show_key(o);
    if (!valid_utf8(o))  // it becomes JSON (the resolved config, the checkpoint's), which is UTF-8
      throw UserError(one_line(label + ": not UTF-8 text (a config is JSON, whose text is UTF-8)"));
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError(one_line(strprintf(
          "malformed override '%s': expected KEY=VALUE, e.g. --set optimizer.params.lr=3e-4", label.c_str())));
    std::string key = o.substr(0, eq);
    if (!settable(key)) throw UserError(one_line(label + ": " + unknown_key_message(key)));
    json value = parse_value(o.substr(eq + 1), label);
    if (!set(user_, key, value)) {
      std::string blocked = key;
      while (!blocked.empty() && (!find(user_, parent_of(blocked)) || find(user_, parent_of(blocked))->is_object()))
        blocked = parent_of(blocked);
      throw UserError(one_line(strprintf("%s: cannot set '%s' because '%s' is %s, not an object", label.c_str(),
                                         key.c_str(), parent_of(blocked).c_str(),
                                         show(*find(user_, parent_of(blocked))).c_str())));
    }
    for (auto it = origin_.lower_bound(key + "."); it != origin_.end() && it->first.rfind(key + ".", 0) == 0;)
      it = origin_.erase(it);
    sources_.push_back(label);
    record_origin(value, key, sources_.size() - 1, origin_);
  }

  // A key --set may name: a schema key or section, a key inside a whole-section key (a switched-off
  // DeepSpeed feature such as tensorboard.enabled), or an old name or a key under one (bfloat16.enabled).
  static bool settable(const std::string& key) {
    if (find_key(key) || sections().count(key)) return true;
    for (std::string p = key; !p.empty(); p = parent_of(p)) {
      if (alias_of(p)) return true;
      if (const Key* k = find_key(p); k && k->kind == Kind::Object) return true;
    }
    return false;
  }

  static const Alias* alias_of(const std::string& path) {
    for (const Alias& a : aliases())
      if (a.old_path == path) return &a;
    return nullptr;
  }

  // Old name -> new name, as DeepSpeed maps it; both given and different is an error.
  void apply_aliases() {
    struct Renamed {
      const Alias* alias;
      json old, now;
    };
    std::vector<Renamed> found;  // all read first: one old name may feed two new ones
    for (const Alias& a : aliases())
      if (const json* old = find(user_, a.old_path); old && !(old->is_object() && a.new_path.starts_with(a.old_path)))
        found.push_back({&a, *old, a.value(*old)});
    for (const Renamed& r : found) erase(user_, r.alias->old_path);
    for (const Renamed& r : found) {
      const Alias& a = *r.alias;
      if (r.now.is_null()) continue;
      if (const json* cur = find(user_, a.new_path); cur && *cur != r.now)
        fail({a.old_path, a.new_path},
             strprintf("'%s' (DeepSpeed's old name for '%s') = %s contradicts '%s' = %s; keep one", a.old_path.c_str(),
                       a.new_path.c_str(), show(r.old).c_str(), a.new_path.c_str(), show(*cur).c_str()));
      const int source = source_of(a.old_path);
      set(user_, a.new_path, r.now);
      origin_[a.new_path] = static_cast<size_t>(std::max(source, 0));
      renamed_[a.new_path] = a.old_path;
    }
  }

  // DeepSpeed's optimizers and schedulers zero3d does not implement: said before their params
  // would be reported as unknown keys.
  void check_refused_choices() {
    for (const Key& k : schema()) {
      const json* v = k.refused_choices.empty() ? nullptr : find(user_, k.path);
      if (!v || !v->is_string()) continue;
      for (const std::string& c : k.refused_choices)
        if (lower(c) == lower(v->get<std::string>()))
          fail(k.path, strprintf("%s \"%s\" is a DeepSpeed choice zero3d does not implement: %s", k.path.c_str(),
                                 v->get<std::string>().c_str(), k.instead.c_str()));
    }
  }

  // "unknown config key 'x' (did you mean 'y'?)", or the keys valid in the nearest section.
  static std::string unknown_key_message(const std::string& path) {
    std::string msg = "unknown config key '" + show_key(path) + "'";
    if (std::string best = nearest(path, all_names()); !best.empty()) return msg + " (did you mean '" + best + "'?)";
    std::string parent = parent_of(path);
    while (!parent.empty() && !sections().count(parent)) {
      if (find_key(parent)) return msg + " ('" + parent + "' takes a value, not nested keys)";
      parent = parent_of(parent);
    }
    std::set<std::string> here;
    for (const std::string& c : all_names())
      if (parent_of(c) == parent) here.insert(leaf_of(c));
    std::string list;
    for (const std::string& h : here) list += (list.empty() ? "" : ", ") + h;
    if (parent.empty()) return msg + " (valid top-level keys: " + list + ")";
    return msg + " (valid keys in '" + parent + "': " + list + ")";
  }

  // Every key in the user's tree must be a schema key or a section; sections must be objects.
  void check_tree(const json& node, const std::string& prefix) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string path = join(prefix, it.key());
      if (find_key(path)) continue;
      if (sections().count(path)) {
        if (!it->is_object())
          fail(path, strprintf("'%s' must be an object {...}, got %s", show_key(path).c_str(), show(*it).c_str()));
        check_tree(*it, path);
        continue;
      }
      fail(path, unknown_key_message(path));
    }
  }

  void normalise_present() {
    for (const Key& k : schema()) {
      const json* v = find(user_, k.path);
      // null: unset (DeepSpeed's None), where the default is none too: no value, or no path ("")
      if (!v || (v->is_null() && ((k.def.is_null() && !k.def_fn) || (k.kind == Kind::String && k.def == ""))))
        continue;
      const bool value_auto = k.auto_is_value || std::find(k.choices.begin(), k.choices.end(), "auto") != k.choices.end();
      if (is_auto(*v) && !value_auto) {
        auto_.insert(k.path);
        continue;
      }
      json n = normalise(k, *v);
      if (n.is_null())
        fail(k.path, strprintf("%s must be %s, got %s", k.path.c_str(), valid_text(k).c_str(), show(*v).c_str()));
      value_[k.path] = n;
    }
  }

  // "auto" (DeepSpeed's and the Hugging Face integration's placeholder): the run config's value for
  // the key; else, for batch keys, derived from the others; else the key's derivation; else its default.
  void resolve_auto() {
    for (const std::string& path : auto_) {
      const Key& k = *find_key(path);
      const json* mine = find(base_, path);
      if (mine && !is_auto(*mine) && !(is_batch_key(path) && batch_replaced_)) {
        json n = normalise(k, *mine);
        if (n.is_null())
          fail(path, strprintf("%s must be %s, got %s", path.c_str(), valid_text(k).c_str(), show(*mine).c_str()));
        value_[path] = n;
        auto_source_[path] = "auto: the value in " + src_.config_file;
      } else if (is_batch_key(path)) {
        auto_source_[path] = "auto: derived";  // resolve_batch derives it like an unset key
      } else if (k.auto_fn) {
        value_[path] = normalise(k, k.auto_fn([this](const std::string& p) { return value(p); }));
        if (value_[path].is_null()) fail(path, strprintf("%s = \"auto\" derives an invalid value", path.c_str()));
        auto_source_[path] = "auto: " + k.auto_doc;
      } else {
        auto_source_[path] = "auto: the default";  // value() falls back to it
        if (default_of(k).is_null() && k.required)
          fail(path, strprintf("%s is \"auto\" but the run config has no value for it and zero3d cannot derive one "
                               "(%s: %s)", path.c_str(), valid_text(k).c_str(), k.doc.c_str()));
      }
    }
  }

  bool present(const std::string& path) const { return value_.count(path) > 0; }

  json default_of(const Key& k) const {
    if (k.def_fn) return k.def_fn([this](const std::string& p) { return value(p); });
    return k.def;
  }

  // The value after defaults (null when unset and without default).
  json value(const std::string& path) const {
    auto it = value_.find(path);
    if (it != value_.end()) return it->second;
    return default_of(*find_key(path));
  }

  bool applies(const Key& k) const {
    if (k.when_key.empty()) return true;
    std::string sel = value(k.when_key).get<std::string>();
    return std::find(k.when_values.begin(), k.when_values.end(), sel) != k.when_values.end();
  }

  void check_applicability() {
    for (const Key& k : schema()) {
      if (!present(k.path) || applies(k)) continue;
      std::string sel = value(k.when_key).get<std::string>();
      std::string takes;
      for (const Key& o : schema())
        if (o.when_key == k.when_key &&
            std::find(o.when_values.begin(), o.when_values.end(), sel) != o.when_values.end())
          takes += (takes.empty() ? "" : ", ") + leaf_of(o.path);
      if (sel.empty())
        fail({k.path, k.when_key}, strprintf("config key '%s' needs %s to be set (it applies to %s)", k.path.c_str(),
                                             k.when_key.c_str(), quoted_list(k.when_values).c_str()));
      const std::string others = takes.empty() ? "" : strprintf("; \"%s\" takes: %s", sel.c_str(), takes.c_str());
      fail({k.path, k.when_key},
           strprintf("config key '%s' does not apply to %s \"%s\" (it applies to %s%s)", k.path.c_str(),
                     k.when_key.c_str(), sel.c_str(), quoted_list(k.when_values).c_str(), others.c_str()));
    }
    for (const json& op : value("comms_logger.prof_ops"))
      if (!std::set<std::string>{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv"}.count(
              op.get<std::string>()))
        fail("comms_logger.prof_ops",
             strprintf("comms_logger.prof_ops: unknown collective %s (zero3d's: all_reduce, reduce_scatter, "
                       "all_gather, broadcast, send, recv)", show(op).c_str()));
    // DeepSpeed's communication_data_type: zero3d reduces in the training precision, so only that one.
    if (present("communication_data_type")) {
      const std::string want = value("fp16.enabled") == true   ? "fp16"
                               : value("bf16.enabled") == true ? "bf16"
                                                               : "fp32";
      std::string got = value_.at("communication_data_type").is_string()
                            ? value_.at("communication_data_type").get<std::string>() : "";
      if (got == "bfp16") got = "bf16";
      if (got != want)
        fail("communication_data_type",
             strprintf("communication_data_type %s: zero3d reduces gradients in the training precision (%s here); "
                       "remove it or set it to \"%s\"", show(value_.at("communication_data_type")).c_str(),
                       want.c_str(), want.c_str()));
    }
    if (value("fp16.enabled") == true && value("bf16.enabled") == true)
      fail({"fp16.enabled", "bf16.enabled"}, "fp16.enabled and bf16.enabled are both true; choose one precision");
    // Offload (DeepSpeed's rules, except that NVMe optimizer offload works from stage 1, not only 3).
    const json stage = value("zero_optimization.stage");
    for (const char* what : {"offload_optimizer", "offload_param"}) {
      const std::string key = std::string("zero_optimization.") + what;
      const json device = value(key + ".device");
      if (device == "none") continue;
      const std::string named =  // DeepSpeed's old name too, when the config used it (cpu_offload)
          key + ".device" + (renamed_.count(key + ".device") ? " ('" + renamed_.at(key + ".device") + "')" : "");
      if (std::string(what) == "offload_param" && stage != 3)
        fail({key + ".device", "zero_optimization.stage"},
             strprintf("%s = %s needs zero_optimization.stage 3 (stages 0-2 keep every parameter on every rank; "
                       "offload the optimizer state with offload_optimizer instead)", named.c_str(),
                       show(device).c_str()));
      if (stage == 0)
        fail({key + ".device", "zero_optimization.stage"},
             strprintf("%s = %s needs zero_optimization.stage 1, 2 or 3 (stage 0 does not partition the optimizer "
                       "state)", named.c_str(), show(device).c_str()));
      if (device == "nvme" && (value(key + ".nvme_path").is_null() || value(key + ".nvme_path") == ""))
        fail({key + ".nvme_path", key + ".device"},
             strprintf("%s.device = \"nvme\" needs %s.nvme_path: a directory on the storage to swap to", key.c_str(),
                       key.c_str()));
    }

    // DeepSpeed silently forces adam_w_mode on for AdamW; refuse the contradiction instead.
    if (value("optimizer.type") == "AdamW" && value("optimizer.params.adam_w_mode") == false)
      fail({"optimizer.params.adam_w_mode", "optimizer.type"},
           "optimizer.params.adam_w_mode=false contradicts optimizer.type \"AdamW\" (always decoupled weight decay); "
           "use optimizer.type \"Adam\" for L2 weight decay");
  }

  // The schema's verdict on DeepSpeed keys zero3d does not honour.
  void check_status() {
    for (const Key& k : schema()) {
      if (k.status == Status::honoured || (!present(k.path) && !auto_.count(k.path))) continue;
      const std::string named = renamed_.count(k.path) ? " ('" + renamed_.at(k.path) + "')" : "";
      if (k.status == Status::refused)
        fail(k.path, strprintf("'%s'%s is a DeepSpeed key zero3d does not implement: %s", k.path.c_str(), named.c_str(),
                               k.instead.c_str()));
      if (k.status == Status::no_effect) {
        if (!k.instead.empty()) no_effect_.push_back(k.path);
        continue;
      }
      if (!present(k.path)) continue;  // fixed, "auto": the default, which zero3d implements
      const json& v = value_.at(k.path);
      if (k.kind == Kind::Object) {  // a switched-off DeepSpeed feature
        if (v.contains("enabled") && v["enabled"] == true)
          fail(k.path + ".enabled", strprintf("'%s.enabled' = true: a DeepSpeed feature zero3d does not implement: %s",
                                              k.path.c_str(), k.instead.c_str()));
        continue;
      }
      bool ok = v == k.def;
      for (const json& a : k.accepted) ok = ok || normalise(k, a) == v;
      if (!ok)
        fail(k.path, strprintf("'%s'%s = %s is a DeepSpeed setting zero3d does not implement (zero3d: %s); remove it "
                               "or set it to %s",
                               k.path.c_str(), named.c_str(), show(v).c_str(), k.instead.c_str(),
                               k.def.is_null() ? "null" : show(k.def).c_str()));
    }
  }

  void check_required() {
    for (const Key& k : schema()) {
      if (!k.required || present(k.path) || auto_.count(k.path) || !applies(k)) continue;
      std::string why = k.when_key.empty() ? ""
                                           : strprintf(" for %s \"%s\"", k.when_key.c_str(),
                                                       value(k.when_key).get<std::string>().c_str());
      fail(k.path, strprintf("missing required config key '%s'%s (%s: %s)", k.path.c_str(), why.c_str(),
                             valid_text(k).c_str(), k.doc.c_str()));
    }
  }

  // DeepSpeed's batch rule (runtime/config.py _set_batch_related_parameters), then the check
  // train_batch_size == micro * gas * dp.
  void resolve_batch() {
    if (world_size_ < 1) throw UserError(strprintf("invalid world size %d: need at least one rank", world_size_));
    int64_t tp = value("tensor_parallel.tp_size").get<int64_t>(),
            pp = value("pipeline_parallel.pp_size").get<int64_t>();
    int64_t model_ranks = mul_sat(tp, pp);
    if (world_size_ % model_ranks != 0)
      fail({"tensor_parallel.tp_size", "pipeline_parallel.pp_size"},
           strprintf("the world size %d is not a multiple of tensor_parallel.tp_size %lld * pipeline_parallel.pp_size "
                     "%lld = %lld",
                     world_size_, (long long)tp, (long long)pp, (long long)model_ranks));
    const int64_t dp = world_size_ / model_ranks;
    const std::string dp_why = strprintf("data-parallel size %lld = world size %d / (tp_size %lld * pp_size %lld)",
                                         (long long)dp, world_size_, (long long)tp, (long long)pp);
    const char* kTB = "train_batch_size";
    const char* kMB = "train_micro_batch_size_per_gpu";
    const char* kGA = "gradient_accumulation_steps";
    bool has_tb = present(kTB), has_mb = present(kMB), has_ga = present(kGA);
    int64_t tb = has_tb ? value(kTB).get<int64_t>() : 0;
    int64_t mb = has_mb ? value(kMB).get<int64_t>() : 0;
    int64_t ga = has_ga ? value(kGA).get<int64_t>() : 0;

    auto divide = [&](const char* derived, int64_t divisor, const char* other, int64_t other_value) {
      if (tb % divisor != 0)
        fail({kTB, kMB, kGA},
             strprintf("train_batch_size %lld is not a multiple of %s %lld * data-parallel size %lld = %lld, so "
                       "%s cannot be derived (%s)",
                       (long long)tb, other, (long long)other_value, (long long)dp, (long long)divisor, derived,
                       dp_why.c_str()));
      return tb / divisor;
    };
    if (has_tb && has_mb && has_ga) {
      // all three given: checked below
    } else if (has_tb && has_mb) {
      ga = divide(kGA, mul_sat(mb, dp), kMB, mb);
    } else if (has_tb && has_ga) {
      mb = divide(kMB, mul_sat(ga, dp), kGA, ga);
    } else if (has_mb && has_ga) {
      tb = mul_sat(mul_sat(mb, ga), dp);
    } else if (has_tb) {
      ga = 1;
      mb = divide(kMB, dp, kGA, 1);
    } else if (has_mb) {
      ga = 1;
      tb = mul_sat(mb, dp);
    } else {
      fail({kTB, kMB, kGA},
           "set train_batch_size or train_micro_batch_size_per_gpu (or both): DeepSpeed derives the rest from "
           "train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size");
    }
    int64_t product = mul_sat(mul_sat(mb, ga), dp);
    if (ga < 1 || mb < 1 || tb != product)
      fail({kTB, kMB, kGA},
           strprintf("train_batch_size %lld != train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps "
                     "%lld * data-parallel size %lld = %lld (%s)",
                     (long long)tb, (long long)mb, (long long)ga, (long long)dp, (long long)product, dp_why.c_str()));
    if (tb > INT_MAX)
      fail({kTB, kMB, kGA}, strprintf("train_batch_size %lld is too large (max %d)", (long long)tb, INT_MAX));
    // A rank's activations are indexed by token: a micro-batch holds at most 2^31 - 1 of them.
    const int64_t T = value("model.seq_len").get<int64_t>(), tokens = mul_sat(mb, T);
    if (tokens > INT_MAX)
      fail({kMB, "model.seq_len"},
           strprintf("a micro-batch of %lld sequences of model.seq_len %lld tokens is %lld tokens, more than the %d a "
                     "rank can index: use a smaller train_micro_batch_size_per_gpu (more gradient_accumulation_steps)",
                     (long long)mb, (long long)T, (long long)tokens, INT_MAX));
    for (const char* k : kBatchKeys)
      if (!present(k)) derived_[k] = "derived: train_batch_size = micro * gradient_accumulation_steps * dp (" + dp_why + ")";
    value_[kTB] = tb, value_[kMB] = mb, value_[kGA] = ga;
  }

  void check_model() {
    auto get = [&](const char* k) { return value(k).get<int64_t>(); };
    // num must be divisible by den: one line naming both keys, their values and why.
    auto divides = [&](const char* num, const char* den, const char* why) {
      if (get(num) % get(den) != 0)
        fail({den, num}, strprintf("%s %lld must be divisible by %s %lld (%s)", num, (long long)get(num), den,
                                   (long long)get(den), why));
    };
    const char *tp = "tensor_parallel.tp_size", *heads = "model.n_head";
    divides("model.d_model", heads, "each head gets d_model / n_head channels");
    divides(heads, tp, "attention heads are split across the tensor-parallel ranks");
    divides(heads, "model.num_key_value_heads", "each key/value head serves the same number of query heads");
    divides("model.num_key_value_heads", tp,
            "each tensor-parallel rank holds whole key/value heads; use a tp_size that divides it");
    divides("model.intermediate_size", tp, "the MLP's hidden units are split across the tensor-parallel ranks");
    const int64_t hd = get("model.d_model") / get(heads);
    if (value("model.position") == "rope" && hd % 2 != 0)
      fail({"model.position", "model.d_model", heads},
           strprintf("rotary embeddings need an even head width; d_model / n_head is %lld", (long long)hd));
    if (value("model.position") == "rope" && value("model.rope_scaling.rope_type") == "llama3" &&
        !(value("model.rope_scaling.high_freq_factor").get<double>() > value("model.rope_scaling.low_freq_factor").get<double>()))
      fail({"model.rope_scaling.high_freq_factor", "model.rope_scaling.low_freq_factor"},
           strprintf("model.rope_scaling.high_freq_factor %g must exceed low_freq_factor %g (llama3 blends the "
                     "frequencies between the two wavelengths they set)",
                     value("model.rope_scaling.high_freq_factor").get<double>(),
                     value("model.rope_scaling.low_freq_factor").get<double>()));
    if (get("model.n_layer") < get("pipeline_parallel.pp_size"))
      fail({"pipeline_parallel.pp_size", "model.n_layer"},
           strprintf("pipeline_parallel.pp_size %lld is larger than model.n_layer %lld (every stage needs a layer)",
                     (long long)get("pipeline_parallel.pp_size"), (long long)get("model.n_layer")));
    const int64_t V = get("model.vocab_size"), pad = get("model.make_vocab_size_divisible_by"),
                  rows = (V + pad - 1) / pad * pad, t = get(tp);
    if (rows % t != 0)
      fail({"model.vocab_size", "model.make_vocab_size_divisible_by", tp},
           strprintf("the embedding's %lld rows (model.vocab_size %lld padded to a multiple of "
                     "model.make_vocab_size_divisible_by %lld) must be divisible by tensor_parallel.tp_size %lld (the "
                     "embedding and LM head are split by rows); set make_vocab_size_divisible_by to a multiple of %lld",
                     (long long)rows, (long long)V, (long long)pad, (long long)t, (long long)t));
    else if (rows - V >= rows / t)
      fail({"model.vocab_size", "model.make_vocab_size_divisible_by", tp},
           strprintf("model.make_vocab_size_divisible_by %lld pads model.vocab_size %lld to %lld rows: %lld of padding, "
                     "a whole tensor-parallel rank's share (%lld rows) or more; pad less",
                     (long long)pad, (long long)V, (long long)rows, (long long)(rows - V), (long long)(rows / t)));
  }

  std::string provenance_of(const Key& k) const {
    if (auto it = auto_source_.find(k.path); it != auto_source_.end()) return it->second;
    if (auto it = derived_.find(k.path); it != derived_.end()) return it->second;
    if (present(k.path)) {
      const int s = source_of(k.path);
      std::string from = s < 0 ? "?" : sources_[s];
      if (renamed_.count(k.path)) from += " (as " + renamed_.at(k.path) + ")";
      return from;
    }
    return k.def_fn ? "default (derived)" : "default";
  }

  void fill(Config& c) {
    c.resolved = json::object();
    c.provenance = json::object();
    for (const Key& k : schema()) {
      if (!applies(k)) continue;
      json v = value(k.path);
      if (v.is_null() || (k.status != Status::honoured && !present(k.path))) continue;
      c.resolved[pointer_of(k.path)] = v;
      c.provenance[k.path] = provenance_of(k);
      if (k.store) k.store(c, v);
    }
    c.precision = c.fp16.enabled ? Precision::fp16 : c.bf16_enabled ? Precision::bf16 : Precision::fp32;
    if (!no_effect_.empty()) {
      std::string list;
      for (const std::string& p : no_effect_) list += (list.empty() ? "" : ", ") + p;
      c.notices.push_back("accepted without effect here (see --help-config): " + list);
    }
  }

  static json::json_pointer pointer_of(const std::string& dotted) {
    std::string p = "/" + dotted;
    std::replace(p.begin(), p.end(), '.', '/');
    return json::json_pointer(p);
  }

  const ConfigSources& src_;
  const int world_size_;
  json user_;                             // merged user tree: file, DeepSpeed overlay, overrides
  json base_;                             // the run config file alone, for "auto"
  bool batch_replaced_ = false;           // the DeepSpeed file set a batch key: the run config's are gone
  std::vector<std::string> sources_;      // run config, DeepSpeed file, "--set k=v"..., in order
  std::map<std::string, size_t> origin_;  // dotted path -> index in sources_ of what set it
  std::map<std::string, json> value_;     // normalised values of the keys the user set
  std::set<std::string> auto_;            // keys given as "auto"
  std::map<std::string, std::string> auto_source_, derived_;  // provenance of auto and derived values
  std::map<std::string, std::string> renamed_;                // new path -> the old DeepSpeed name used
  std::vector<std::string> no_effect_;                        // present keys without effect here
};

}  // namespace

Config load_config(const ConfigSources& sources, int world_size) { return Resolver(sources, world_size).run(); }

std::string describe_config_keys() {
  std::string out =
      "# Every key zero3d reads: ours and DeepSpeed's (a ds_config.json overlays the run config with --deepspeed).\n"
      "# A DeepSpeed key is honoured, accepted only at the value zero3d implements, accepted without effect here, or\n"
      "# refused. Any key may be \"auto\" (DeepSpeed/Hugging Face): the run config's value, else a derived one, else\n"
      "# the default. Overlay rules: a ds_config optimizer/scheduler of another type replaces the run config's\n"
      "# section; a ds_config that sets any batch key (not \"auto\") replaces the run config's three, the rest\n"
      "# derived as DeepSpeed does (train_batch_size = micro * gradient_accumulation_steps * dp).\n";
  for (const Key& k : schema()) {
    std::string def = k.required                                ? "required"
                      : k.def_fn                                ? "default derived"
                      : is_batch_key(k.path)                    ? "derived from the other batch keys when unset"
                      : k.def.is_null()                         ? "no default"
                                                                : "default " + k.def.dump();
    if (k.path == "zero_optimization.overlap_comm") def = "default: stage == 3";
    std::string when = k.when_key.empty() ? "" : "; for " + k.when_key + " " + quoted_list(k.when_values);
    std::string status = k.status == Status::honoured ? "" : std::string(" [") + status_text(k.status) + "]";
    std::string what = k.doc.empty() ? k.instead : k.doc;
    if (k.status == Status::fixed) what = "zero3d: " + k.instead;
    if (!k.auto_doc.empty()) what += "; \"auto\": " + k.auto_doc;
    out += strprintf("%-55s %s; %s%s%s. %s\n", k.path.c_str(), valid_text(k).c_str(), def.c_str(), when.c_str(),
                     status.c_str(), what.c_str());
  }
  for (const Alias& a : aliases())
    out += strprintf("%-55s DeepSpeed's old name for %s\n", a.old_path.c_str(), a.new_path.c_str());
  return out;
}

std::string describe_resolved(const Config& c) {
  std::string out;
  for (const std::string& path : leaf_paths(c.resolved)) {
    const json* v = find(c.resolved, path);
    std::string from = c.provenance.contains(path) ? c.provenance[path].get<std::string>() : "";
    out += strprintf("%-55s = %-22s (%s)\n", path.c_str(), v->dump().c_str(), from.c_str());
  }
  for (const std::string& n : c.notices) out += "# " + n + "\n";
  return out;
}

}  // namespace zero3d
