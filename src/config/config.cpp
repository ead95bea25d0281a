// config/config.cpp: the schema table and the resolver. Order of work: read the run config, overlay
// the DeepSpeed file, apply --set overrides (remembering which source set each key, so an error
// names it), reject unknown keys, check types and ranges, check which keys apply to the chosen
// optimizer/scheduler, reject recognised-but-not-yet-honoured settings, check required keys and the
// cross-key rules (batch arithmetic, head size), then fill Config and the resolved JSON.
#include "config/config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "core/check.h"

namespace zero3d {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The schema: every key a user can write, its type and range, its default (DeepSpeed's code
// default where DeepSpeed has the key), whether this version honours it, and a one-line doc.
// ---------------------------------------------------------------------------------------------

enum class Kind { Integer, Number, Bool, String, Choice, Betas };

constexpr double kIntMax = INT_MAX;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Key {
  std::string path;  // dotted, e.g. "optimizer.params.lr"
  Kind kind = Kind::Number;
  json def;  // normalised default; null = none (required, derived, or not applicable)
  std::string doc;
  double lo = -kInf, hi = kInf;  // Integer/Number range; lo_open makes it lo < x
  bool lo_open = false;
  std::vector<std::string> choices;  // Choice
  bool nonempty = false;             // String: "" is invalid
  bool honoured = true;              // false: recognised; only the default is accepted for now
  bool required = false;             // required whenever it applies
  std::string when_key;              // applies only when when_key's value is one of when_values
  std::vector<std::string> when_values;


  Key not_yet() const {
    Key k = *this;
    k.honoured = false;
    return k;
  }
  Key need() const {
    Key k = *this;
    k.required = true;
    return k;
  }
  Key only_when(std::string key, std::vector<std::string> values) const {
    Key k = *this;
    k.when_key = std::move(key);
    k.when_values = std::move(values);
    return k;
  }
};

Key integer(std::string path, json def, double lo, double hi, std::string doc) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Integer, k.def = std::move(def), k.doc = std::move(doc);
  k.lo = lo, k.hi = hi;
  return k;
}
Key number(std::string path, json def, double lo, double hi, std::string doc, bool lo_open = false) {
  Key k = integer(std::move(path), std::move(def), lo, hi, std::move(doc));
  k.kind = Kind::Number, k.lo_open = lo_open;
  return k;
}
Key boolean(std::string path, json def, std::string doc) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Bool, k.def = std::move(def), k.doc = std::move(doc);
  return k;
}
Key string(std::string path, json def, std::string doc, bool nonempty = false) {
  Key k;
  k.path = std::move(path), k.kind = Kind::String, k.def = std::move(def), k.doc = std::move(doc);
  k.nonempty = nonempty;
  return k;
}
Key choice(std::string path, json def, std::vector<std::string> choices, std::string doc) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Choice, k.def = std::move(def), k.doc = std::move(doc);
  k.choices = std::move(choices);
  return k;
}
Key betas(std::string path, json def, std::string doc) {
  Key k;
  k.path = std::move(path), k.kind = Kind::Betas, k.def = std::move(def), k.doc = std::move(doc);
  return k;
}

const std::vector<std::string> kWarmupSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = {
      // Batch (DeepSpeed rule: any two determine the third; train = micro * gas * dp).
      integer("train_batch_size", nullptr, 1, kIntMax, "sequences per optimizer step over all data-parallel ranks"),
      integer("train_micro_batch_size_per_gpu", nullptr, 1, kIntMax, "sequences per rank per forward/backward"),
      integer("gradient_accumulation_steps", nullptr, 1, kIntMax, "micro-batches accumulated per optimizer step"),
      integer("steps_per_print", 10, 1, kIntMax, "optimizer steps between progress lines"),
      number("gradient_clipping", 0.0, 0, kInf, "max global gradient norm; 0 disables clipping"),
      number("comm_timeout_s", 600.0, 0, kInf, "watchdog: abort when a collective has not completed after this many seconds", true),
      boolean("wall_clock_breakdown", false, "print forward/backward/step timings"),
      integer("train_steps", nullptr, 1, kIntMax, "optimizer steps to run").need(),
      integer("seed", 1234, 0, kInf, "seed for parameter init and data order"),

      // Optimizer (DeepSpeed "optimizer" section; FusedAdam defaults).
      choice("optimizer.type", "AdamW", {"AdamW", "Adam"}, "AdamW, or Adam (decoupled decay unless adam_w_mode=false)"),
      number("optimizer.params.lr", 1e-3, 0, kInf, "base learning rate"),
      betas("optimizer.params.betas", json::array({0.9, 0.999}), "Adam moment decay rates [beta1, beta2]"),
      number("optimizer.params.eps", 1e-8, 0, kInf, "Adam denominator epsilon", /*lo_open=*/true),
      number("optimizer.params.weight_decay", 0.01, 0, kInf, "weight decay (decoupled in AdamW mode)"),
      boolean("optimizer.params.adam_w_mode", true,
              "Adam only: true = decoupled decay (AdamW), false = L2 in the gradient"),
      boolean("optimizer.params.bias_correction", true, "Adam bias correction of the moments"),

      // Scheduler (deepspeed/runtime/lr_schedules.py; params belong to the chosen type).
      choice("scheduler.type", "", {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"},
             "LR schedule; \"\" = constant lr"),
      number("scheduler.params.warmup_min_lr", 0.0, 0, kInf, "lr at the start of warmup")
          .only_when("scheduler.type", {"WarmupLR", "WarmupDecayLR"}),
      number("scheduler.params.warmup_max_lr", 0.001, 0, kInf, "lr at the end of warmup")
          .only_when("scheduler.type", {"WarmupLR", "WarmupDecayLR"}),
      integer("scheduler.params.warmup_num_steps", 1000, 1, kIntMax, "warmup length in optimizer steps")
          .only_when("scheduler.type", kWarmupSchedulers),
      choice("scheduler.params.warmup_type", "log", {"log", "linear"}, "warmup curve")
          .only_when("scheduler.type", kWarmupSchedulers),
      integer("scheduler.params.total_num_steps", nullptr, 1, kIntMax, "schedule length in optimizer steps")
          .need()
          .only_when("scheduler.type", {"WarmupDecayLR", "WarmupCosineLR"}),
      number("scheduler.params.warmup_min_ratio", 0.0, 0, 1, "lr ratio at the start of warmup")
          .only_when("scheduler.type", {"WarmupCosineLR"}),
      number("scheduler.params.cos_min_ratio", 0.0001, 0, 1, "lr ratio at the end of the cosine decay")
          .only_when("scheduler.type", {"WarmupCosineLR"}),

      // Mixed precision (deepspeed/runtime/precision_config.py).
      boolean("fp16.enabled", false, "fp16 mixed precision (16-bit weights and gradients, fp32 master and Adam)"),
      number("fp16.loss_scale", 0.0, 0, kInf, "static loss scale; 0 = dynamic"),
      integer("fp16.initial_scale_power", 16, 0, 1000, "initial dynamic scale 2^power"),
      integer("fp16.loss_scale_window", 1000, 1, kIntMax, "steps without overflow before raising the scale"),
      integer("fp16.hysteresis", 2, 1, kIntMax, "overflows tolerated before lowering the scale"),
      boolean("fp16.consecutive_hysteresis", false, "refill hysteresis after a good step"),
      number("fp16.min_loss_scale", 1.0, 0, kInf, "lower bound of the dynamic scale", true),
      boolean("fp16.continue_at_min_scale", false,
              "ours: on an overflow at min_loss_scale skip the step and go on instead of stopping (DeepSpeed stops)"),
      boolean("bf16.enabled", false, "bf16 mixed precision (16-bit weights and gradients, fp32 master and Adam)"),

      // ZeRO (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig): only stage 0 for now.
      integer("zero_optimization.stage", 0, 0, 3, "0 off, 1 optimizer states, 2 +gradients, 3 +parameters"),
      boolean("zero_optimization.contiguous_gradients", true, "copy gradients into a contiguous buffer").not_yet(),
      boolean("zero_optimization.overlap_comm", nullptr, "overlap gradient reduction with backward"),
      integer("zero_optimization.reduce_bucket_size", 500000000, 1, kInf, "elements reduced at a time"),
      integer("zero_optimization.allgather_bucket_size", 500000000, 1, kInf, "elements allgathered at a time"),
      boolean("zero_optimization.reduce_scatter", true, "reduce-scatter instead of allreduce for gradients"),
      integer("zero_optimization.consistency_check_interval", 0, 0, kIntMax,
              "ours: every N steps compare a hash of every replicated parameter across the dp group; 0 = off"),
      boolean("zero_optimization.allgather_partitions", true, "allgather (not broadcasts) of updated parameters")
          .not_yet(),
      integer("zero_optimization.stage3_prefetch_bucket_size", 50000000, 0, kInf,
              "parameter elements gathered ahead of use (the next unit, when it fits)"),
      integer("zero_optimization.stage3_max_live_parameters", 1000000000, 0, kInf,
              "gathered parameter elements kept at once (at least what one step needs)"),
      integer("zero_optimization.stage3_max_reuse_distance", 1000000000, 0, kInf,
              "keep a gathered unit if its next use is fewer than this many elements away"),
      integer("zero_optimization.stage3_param_persistence_threshold", 100000, 0, kInf,
              "tensors smaller than this stay whole on every rank"),

      // Activation checkpointing: DeepSpeed's section (deepspeed/runtime/activation_checkpointing/config.py);
      // `enabled` is ours (in DeepSpeed the model calls checkpoint() itself).
      boolean("activation_checkpointing.enabled", false, "ours: recompute each block's forward in backward"),
      boolean("activation_checkpointing.partition_activations", false, "shard checkpoints across tp").not_yet(),
      boolean("activation_checkpointing.cpu_checkpointing", false, "offload checkpoints to the CPU").not_yet(),
      boolean("activation_checkpointing.contiguous_memory_optimization", false, "copy checkpoints to one buffer")
          .not_yet(),
      integer("activation_checkpointing.number_checkpoints", nullptr, 1, kIntMax, "checkpoints per forward")
          .not_yet(),
      boolean("activation_checkpointing.synchronize_checkpoint_boundary", false, "synchronise at checkpoints")
          .not_yet(),
      boolean("activation_checkpointing.profile", false, "profile checkpoint timings").not_yet(),

      // Layout: dp = world_size / (tp_size * pp_size).
      integer("tensor_parallel.tp_size", 1, 1, kIntMax, "tensor-parallel group size (Megatron-style)"),
      integer("pipeline_parallel.pp_size", 1, 1, kIntMax, "pipeline stages (1F1B schedule)"),

      // zero3d's own sections.
      integer("model.vocab_size", nullptr, 1, kIntMax, "vocabulary size (embedding rows)").need(),
      integer("model.seq_len", nullptr, 1, kIntMax, "context length in tokens").need(),
      integer("model.n_layer", nullptr, 1, kIntMax, "transformer blocks").need(),
      integer("model.n_head", nullptr, 1, kIntMax, "attention heads (must divide d_model)").need(),
      integer("model.d_model", nullptr, 1, kIntMax, "residual stream width").need(),
      string("data.train", nullptr, "llm.c token file for training", /*nonempty=*/true).need(),
      string("data.val", "", "llm.c token file for validation; \"\" = none"),
      integer("data.val_interval", 0, 0, kIntMax, "steps between validation passes; 0 = only at the end"),
      integer("data.val_batches", 8, 1, kIntMax, "micro-batches per validation pass"),
      number("run.max_minutes", 0.0, 0, kInf,
             "wall-time budget from start: checkpoint and exit 6 at the last step boundary where another step and "
             "a checkpoint still fit; 0 = none (under Slurm the job's end time is a budget too)"),
      string("checkpoint.dir", "", "checkpoint directory; \"\" = <run dir>/checkpoints"),
      choice("compute.gemm", "auto", {"auto", "onednn", "cblas"},
             "host GEMM library: oneDNN (ISA picked at run time), the CBLAS linked in (a site's tuned BLAS), or "
             "auto (oneDNN; weight gradients on an OpenBLAS that runs its own kernels for this CPU)"),
      choice("compute.bf16_gemm", "auto", {"auto", "on", "off"},
             "with bf16.enabled: GEMMs in bf16 with fp32 accumulation (on), in fp32 on the 16-bit weights "
             "widened (off), or auto (bf16 where oneDNN has native bf16 and measures it faster at start)"),
      integer("checkpoint.save_interval", 0, 0, kIntMax,
              "steps between checkpoints (and one at the last step); 0 = none"),
      integer("checkpoint.keep_last", 0, 0, kIntMax, "newest checkpoints kept; 0 = all"),
      string("checkpoint.load", "none",
             "\"none\", \"auto\" (the directory's latest, falling back to older valid ones) or a checkpoint "
             "file or directory", /*nonempty=*/true),
  };
  return keys;
}

const Key* find_key(const std::string& path) {
  for (const Key& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

// Sections: every proper prefix of a schema key ("optimizer", "optimizer.params", ...).
const std::set<std::string>& sections() {
  static const std::set<std::string> s = [] {
    std::set<std::string> out;
    for (const Key& k : schema())
      for (size_t i = k.path.find('.'); i != std::string::npos; i = k.path.find('.', i + 1))
        out.insert(k.path.substr(0, i));
    return out;
  }();
  return s;
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

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

// One line, short: errors quote user values.
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
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

// What a key accepts, for error messages: "a positive integer", "one of \"AdamW\", \"Adam\"".
std::string valid_text(const Key& k) {
  switch (k.kind) {
    case Kind::Integer:
      if (k.lo == 1 && (k.hi == kIntMax || k.hi == kInf)) return "a positive integer";
      if (k.lo == 0 && (k.hi == kIntMax || k.hi == kInf)) return "a non-negative integer";
      return strprintf("an integer in [%s, %s]", fmt_num(k.lo).c_str(), fmt_num(k.hi).c_str());
    case Kind::Number:
      if (k.lo == 0 && k.hi == kInf) return k.lo_open ? "a number > 0" : "a number >= 0";
      return strprintf("a number in %s%s, %s]", k.lo_open ? "(" : "[", fmt_num(k.lo).c_str(), fmt_num(k.hi).c_str());
    case Kind::Bool:
      return "true or false";
    case Kind::String:
      return k.nonempty ? "a non-empty string" : "a string";
    case Kind::Choice: {
      std::vector<std::string> named;
      bool empty_ok = false;
      for (const auto& c : k.choices) {
        if (c.empty())
          empty_ok = true;
        else
          named.push_back(c);
      }
      std::string s = "one of " + quoted_list(named);
      if (empty_ok) s += " (or \"\" for none)";
      return s;
    }
    case Kind::Betas:
      return "a pair of numbers [beta1, beta2], each in [0, 1)";
  }
  return "?";
}

// Integer value of a JSON number that is mathematically an integer (5e8 counts, as in pydantic).
bool as_integer(const json& v, int64_t& out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return out = v.get<int64_t>(), true;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    return out = static_cast<int64_t>(u), true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) >= 9.2e18) return false;
    return out = static_cast<int64_t>(d), true;
  }
  return false;
}

// Checks `v` against `k`; returns the normalised value (integers as int64, numbers as double),
// or null when `v` is not valid.
json normalise(const Key& k, const json& v) {
  switch (k.kind) {
    case Kind::Integer: {
      int64_t i = 0;
      if (!as_integer(v, i) || double(i) < k.lo || double(i) > k.hi) return nullptr;
      return i;
    }
    case Kind::Number: {
      if (!v.is_number()) return nullptr;
      double d = v.get<double>();
      if (!std::isfinite(d) || d < k.lo || (k.lo_open && d == k.lo) || d > k.hi) return nullptr;
      return d;
    }
    case Kind::Bool:
      return v.is_boolean() ? v : json(nullptr);
    case Kind::String:
      if (!v.is_string() || (k.nonempty && v.get<std::string>().empty())) return nullptr;
      return v;
    case Kind::Choice:
      if (!v.is_string() || std::find(k.choices.begin(), k.choices.end(), v.get<std::string>()) == k.choices.end())
        return nullptr;
      return v;
    case Kind::Betas: {
      if (!v.is_array() || v.size() != 2) return nullptr;
      json out = json::array();
      for (const json& b : v) {
        if (!b.is_number()) return nullptr;
        double d = b.get<double>();
        if (!(d >= 0.0 && d < 1.0)) return nullptr;
        out.push_back(d);
      }
      return out;
    }
  }
  return nullptr;
}

json::json_pointer pointer_of(const std::string& dotted) {
  std::string p = "/" + dotted;
  std::replace(p.begin(), p.end(), '.', '/');
  return json::json_pointer(p);
}

const json* find_path(const json& root, const std::string& dotted) {
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

// Remembers, for every node of `tree` under `prefix`, which source set it.
void record_origin(const json& tree, const std::string& prefix, size_t source, std::map<std::string, size_t>& origin) {
  if (!prefix.empty()) origin[prefix] = source;
  if (!tree.is_object()) return;
  for (auto it = tree.begin(); it != tree.end(); ++it) record_origin(*it, join(prefix, it.key()), source, origin);
}

json read_json_file(const std::string& path, const char* what) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw UserError(strprintf("cannot read %s '%s': %s", what, path.c_str(), std::strerror(errno)));
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err) throw UserError(strprintf("cannot read %s '%s': %s", what, path.c_str(), std::strerror(err)));

  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte counts the characters read, the offending one included: its 0-based index is byte-1.
    size_t idx = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    size_t line = 1 + std::count(text.begin(), text.begin() + idx, '\n');
    size_t nl = text.rfind('\n', idx == 0 ? std::string::npos : idx - 1);
    if (idx == 0) nl = std::string::npos;
    size_t column = nl == std::string::npos ? idx + 1 : idx - nl;
    // nlohmann's text: "[json.exception.parse_error.101] parse error at line 1, column 5: <reason>".
    std::string reason = e.what();
    size_t col = reason.find("column ");
    size_t colon = col == std::string::npos ? std::string::npos : reason.find(": ", col);
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    throw UserError(one_line(
        strprintf("%s: invalid JSON at line %zu, column %zu: %s", path.c_str(), line, column, reason.c_str())));
  }
  if (!j.is_object())
    throw UserError(strprintf("%s: the top level must be a JSON object {...}, got %s", path.c_str(), j.type_name()));
  return j;
}

int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// ---------------------------------------------------------------------------------------------
// The resolver
// ---------------------------------------------------------------------------------------------

class Resolver {
 public:
  Resolver(const ConfigSources& sources, int world_size) : src_(sources), world_size_(world_size) {}

  Config run() {
    read_sources();
    check_tree(user_, "");
    normalise_present();
    check_applicability();
    check_not_yet();
    check_required();
    Config c;
    resolve_batch(c);
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
    user_ = read_json_file(src_.config_file, "config file");
    sources_.push_back(src_.config_file);
    record_origin(user_, "", 0, origin_);
    if (!src_.deepspeed_file.empty()) {
      json ds = read_json_file(src_.deepspeed_file, "DeepSpeed config file");
      merge_into(user_, ds);
      sources_.push_back(src_.deepspeed_file);
      record_origin(ds, "", sources_.size() - 1, origin_);
    }
    for (const std::string& o : src_.overrides) apply_override(o);
  }

  void apply_override(const std::string& o) {
    std::string label = "--set " + o;
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError(
          one_line(strprintf("malformed override '--set %s': expected KEY=VALUE, e.g. "
                             "--set optimizer.params.lr=3e-4",
                             o.c_str())));
    std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    if (!find_key(key) && !sections().count(key)) throw UserError(one_line(label + ": " + unknown_key_message(key)));
    json value;
    try {
      value = json::parse(text);
    } catch (const json::parse_error&) {
      value = text;  // not JSON: a raw string (paths, names like WarmupLR)
    }
    json* node = &user_;
    size_t start = 0;
    for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
      std::string part = key.substr(start, dot - start);
      json& next = (*node)[part];
      if (next.is_null()) next = json::object();
      if (!next.is_object())
        throw UserError(one_line(strprintf("%s: cannot set '%s' because '%s' is %s, not an object", label.c_str(),
                                           key.c_str(), key.substr(0, dot).c_str(), show(next).c_str())));
      node = &next;
      start = dot + 1;
    }
    (*node)[key.substr(start)] = value;
    for (auto it = origin_.lower_bound(key + "."); it != origin_.end() && it->first.rfind(key + ".", 0) == 0;)
      it = origin_.erase(it);
    sources_.push_back(label);
    record_origin(value, key, sources_.size() - 1, origin_);
  }

  // "unknown config key 'x' (did you mean 'y'?)": nearest schema key or section by Levenshtein
  // distance, over full dotted paths and over leaf names (so a top-level "lr" finds
  // optimizer.params.lr), or by words dropped from a leaf name ("warmup_steps" finds
  // warmup_num_steps); ties go to the smaller full-path distance.
  static std::string unknown_key_message(const std::string& path) {
    std::string leaf = leaf_of(path);
    size_t limit = std::max<size_t>(1, leaf.size() / 3);
    std::vector<std::string> candidates(sections().begin(), sections().end());
    for (const Key& k : schema()) candidates.push_back(k.path);
    std::string best;
    size_t best_score = SIZE_MAX, best_full = SIZE_MAX;
    for (const std::string& c : candidates) {
      size_t full = levenshtein(path, c), by_leaf = levenshtein(leaf, leaf_of(c));
      size_t score = std::min(full, by_leaf);
      if (score > limit) score = SIZE_MAX;
      size_t words = extra_words(leaf, leaf_of(c));
      if (words <= 2) score = std::min(score, words);
      if (score == SIZE_MAX) continue;
      if (score < best_score || (score == best_score && full < best_full))
        best = c, best_score = score, best_full = full;
    }
    std::string msg = "unknown config key '" + path + "'";
    if (!best.empty()) return msg + " (did you mean '" + best + "'?)";
    // Nothing close: list what is valid in the nearest enclosing section.
    std::string parent = parent_of(path);
    while (!parent.empty() && !sections().count(parent)) {
      if (find_key(parent)) return msg + " ('" + parent + "' takes a value, not nested keys)";
      parent = parent_of(parent);
    }
    std::set<std::string> here;
    for (const std::string& c : candidates)
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
          fail(path, strprintf("'%s' must be an object {...}, got %s", path.c_str(), show(*it).c_str()));
        check_tree(*it, path);
        continue;
      }
      fail(path, unknown_key_message(path));
    }
  }

  void normalise_present() {
    for (const Key& k : schema()) {
      const json* v = find_path(user_, k.path);
      if (!v) continue;
      json n = normalise(k, *v);
      if (n.is_null())
        fail(k.path, strprintf("%s must be %s, got %s", k.path.c_str(), valid_text(k).c_str(), show(*v).c_str()));
      value_[k.path] = n;
    }
  }

  bool present(const std::string& path) const { return value_.count(path) > 0; }

  // The value after defaults (null when unset and without default).
  json value(const std::string& path) const {
    auto it = value_.find(path);
    if (it != value_.end()) return it->second;
    if (path == "zero_optimization.overlap_comm") return value("zero_optimization.stage") == 3;  // DeepSpeed's rule
    return find_key(path)->def;
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
      fail({k.path, k.when_key},
           strprintf("config key '%s' does not apply to %s \"%s\" (it applies to %s; \"%s\" takes: %s)", k.path.c_str(),
                     k.when_key.c_str(), sel.c_str(), quoted_list(k.when_values).c_str(), sel.c_str(), takes.c_str()));
    }
    if (value("fp16.enabled") == true && value("bf16.enabled") == true)
      fail({"fp16.enabled", "bf16.enabled"}, "fp16.enabled and bf16.enabled are both true; choose one precision");
    // DeepSpeed silently forces adam_w_mode on for AdamW; refuse the contradiction instead.
    if (value("optimizer.type") == "AdamW" && value("optimizer.params.adam_w_mode") == false)
      fail({"optimizer.params.adam_w_mode", "optimizer.type"},
           "optimizer.params.adam_w_mode=false contradicts optimizer.type \"AdamW\" (always decoupled weight decay); "
           "use optimizer.type \"Adam\" for L2 weight decay");
  }

  void check_not_yet() {
    for (const Key& k : schema()) {
      if (k.honoured || !present(k.path)) continue;
      // overlap_comm has no fixed default: DeepSpeed turns it on exactly for stage 3.
      json def = k.path == "zero_optimization.overlap_comm" ? json(value("zero_optimization.stage") == 3) : k.def;
      if (value_.at(k.path) == def) continue;
      fail(k.path, strprintf("config key '%s' = %s is recognised but not supported yet in this version of zero3d; "
                             "remove it or set it to its default %s",
                             k.path.c_str(), show(value_.at(k.path)).c_str(), show(def).c_str()));
    }
  }

  void check_required() {
    for (const Key& k : schema()) {
      if (!k.required || present(k.path) || !applies(k)) continue;
      std::string why = k.when_key.empty() ? ""
                                           : strprintf(" for %s \"%s\"", k.when_key.c_str(),
                                                       value(k.when_key).get<std::string>().c_str());
      fail(k.path, strprintf("missing required config key '%s'%s (%s: %s)", k.path.c_str(), why.c_str(),
                             valid_text(k).c_str(), k.doc.c_str()));
    }
  }

  // DeepSpeed's batch rule (runtime/config.py _set_batch_related_parameters), then the check
  // train_batch_size == micro * gas * dp.
  void resolve_batch(Config& c) {
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
    c.train_batch_size = static_cast<int>(tb);
    c.train_micro_batch_size_per_gpu = static_cast<int>(mb);
    c.gradient_accumulation_steps = static_cast<int>(ga);
    value_[kTB] = tb, value_[kMB] = mb, value_[kGA] = ga;  // derived values go into the resolved config
  }

  void check_model() {
    int64_t d = value("model.d_model").get<int64_t>(), h = value("model.n_head").get<int64_t>();
    if (d % h != 0)
      fail({"model.d_model", "model.n_head"},
           strprintf("model.d_model %lld must be divisible by model.n_head %lld (each head gets d_model / n_head "
                     "channels)",
                     (long long)d, (long long)h));
    const int64_t tp = value("tensor_parallel.tp_size").get<int64_t>(), v = value("model.vocab_size").get<int64_t>();
    if (h % tp != 0)
      fail({"tensor_parallel.tp_size", "model.n_head"},
           strprintf("model.n_head %lld must be divisible by tensor_parallel.tp_size %lld (attention heads are split "
                     "across the tensor-parallel ranks)",
                     (long long)h, (long long)tp));
    const int64_t pp = value("pipeline_parallel.pp_size").get<int64_t>(), L = value("model.n_layer").get<int64_t>();
    if (L < pp)
      fail({"pipeline_parallel.pp_size", "model.n_layer"},
           strprintf("pipeline_parallel.pp_size %lld is larger than model.n_layer %lld (every stage needs a layer)",
                     (long long)pp, (long long)L));
    if (v % tp != 0)
      fail({"tensor_parallel.tp_size", "model.vocab_size"},
           strprintf("model.vocab_size %lld must be divisible by tensor_parallel.tp_size %lld (the embedding and LM "
                     "head are split by vocabulary rows; pad the vocabulary, as llm.c's 50304 does)",
                     (long long)v, (long long)tp));
  }

  void fill(Config& c) {
    json& r = c.resolved;
    r = json::object();
    for (const Key& k : schema()) {
      if (!applies(k)) continue;
      json v = value(k.path);
      if (v.is_null()) continue;  // unset and without default: nothing to write
      r[pointer_of(k.path)] = v;
    }
    auto geti = [&](const char* p) { return static_cast<int>(value(p).get<int64_t>()); };
    auto getd = [&](const char* p) { return value(p).get<double>(); };
    auto gets = [&](const char* p) { return value(p).get<std::string>(); };
    auto getb = [&](const char* p) { return value(p).get<bool>(); };
    c.steps_per_print = geti("steps_per_print");
    c.gradient_clipping = getd("gradient_clipping");
    c.wall_clock_breakdown = getb("wall_clock_breakdown");
    c.train_steps = geti("train_steps");
    c.seed = static_cast<uint64_t>(value("seed").get<int64_t>());
    c.tp_size = geti("tensor_parallel.tp_size");
    c.pp_size = geti("pipeline_parallel.pp_size");
    c.zero.stage = geti("zero_optimization.stage");
    c.zero.overlap_comm = getb("zero_optimization.overlap_comm");
    c.zero.reduce_bucket_size = value("zero_optimization.reduce_bucket_size").get<int64_t>();
    c.zero.allgather_bucket_size = value("zero_optimization.allgather_bucket_size").get<int64_t>();
    c.zero.reduce_scatter = getb("zero_optimization.reduce_scatter");
    c.zero.consistency_check_interval = geti("zero_optimization.consistency_check_interval");
    c.zero.stage3_prefetch_bucket_size = value("zero_optimization.stage3_prefetch_bucket_size").get<int64_t>();
    c.zero.stage3_max_live_parameters = value("zero_optimization.stage3_max_live_parameters").get<int64_t>();
    c.zero.stage3_max_reuse_distance = value("zero_optimization.stage3_max_reuse_distance").get<int64_t>();
    c.zero.stage3_param_persistence_threshold =
        value("zero_optimization.stage3_param_persistence_threshold").get<int64_t>();
    c.comm_timeout_s = getd("comm_timeout_s");
    c.max_minutes = getd("run.max_minutes");
    c.fp16.enabled = getb("fp16.enabled");
    c.fp16.loss_scale = getd("fp16.loss_scale");
    c.fp16.initial_scale_power = geti("fp16.initial_scale_power");
    c.fp16.loss_scale_window = geti("fp16.loss_scale_window");
    c.fp16.hysteresis = geti("fp16.hysteresis");
    c.fp16.consecutive_hysteresis = getb("fp16.consecutive_hysteresis");
    c.fp16.min_loss_scale = getd("fp16.min_loss_scale");
    c.fp16.continue_at_min_scale = getb("fp16.continue_at_min_scale");
    c.activation_checkpointing = getb("activation_checkpointing.enabled");
    c.precision = c.fp16.enabled ? "fp16" : getb("bf16.enabled") ? "bf16" : "fp32";
    c.model.vocab_size = geti("model.vocab_size");
    c.model.seq_len = geti("model.seq_len");
    c.model.n_layer = geti("model.n_layer");
    c.model.n_head = geti("model.n_head");
    c.model.d_model = geti("model.d_model");
    c.data.train = gets("data.train");
    c.data.val = gets("data.val");
    c.data.val_interval = geti("data.val_interval");
    c.data.val_batches = geti("data.val_batches");
    c.optimizer.type = gets("optimizer.type");
    c.optimizer.lr = getd("optimizer.params.lr");
    json b = value("optimizer.params.betas");
    c.optimizer.betas = {b[0].get<double>(), b[1].get<double>()};
    c.optimizer.eps = getd("optimizer.params.eps");
    c.optimizer.weight_decay = getd("optimizer.params.weight_decay");
    c.optimizer.adam_w_mode = getb("optimizer.params.adam_w_mode");
    c.optimizer.bias_correction = getb("optimizer.params.bias_correction");
    c.scheduler.type = gets("scheduler.type");
    c.scheduler.warmup_min_lr = getd("scheduler.params.warmup_min_lr");
    c.scheduler.warmup_max_lr = getd("scheduler.params.warmup_max_lr");
    c.scheduler.warmup_num_steps = geti("scheduler.params.warmup_num_steps");
    c.scheduler.warmup_type = gets("scheduler.params.warmup_type");
    c.scheduler.total_num_steps =
        present("scheduler.params.total_num_steps") ? geti("scheduler.params.total_num_steps") : 0;
    c.scheduler.warmup_min_ratio = getd("scheduler.params.warmup_min_ratio");
    c.scheduler.cos_min_ratio = getd("scheduler.params.cos_min_ratio");
    c.checkpoint.dir = gets("checkpoint.dir");
    c.checkpoint.save_interval = geti("checkpoint.save_interval");
    c.checkpoint.keep_last = geti("checkpoint.keep_last");
    c.checkpoint.load = gets("checkpoint.load");
    c.compute.gemm = gets("compute.gemm");
    c.compute.bf16_gemm = gets("compute.bf16_gemm");
  }

  const ConfigSources& src_;
  const int world_size_;
  json user_;                             // merged user tree: file, DeepSpeed overlay, overrides
  std::vector<std::string> sources_;      // run config, DeepSpeed file, "--set k=v"..., in order
  std::map<std::string, size_t> origin_;  // dotted path -> index in sources_ of what set it
  std::map<std::string, json> value_;     // normalised values of the keys the user set
};

}  // namespace

Config load_config(const ConfigSources& sources, int world_size) { return Resolver(sources, world_size).run(); }

std::string describe_config_keys() {
  std::string out;
  for (const Key& k : schema()) {
    std::string def = k.required        ? "required"
                      : k.def.is_null() ? "derived from the other batch keys when unset"
                                        : "default " + k.def.dump();
    if (k.path == "zero_optimization.overlap_comm") def = "default: stage == 3";
    std::string when = k.when_key.empty() ? "" : "; for " + k.when_key + " " + quoted_list(k.when_values);
    out += strprintf("%-55s %s; %s%s%s. %s\n", k.path.c_str(), valid_text(k).c_str(), def.c_str(), when.c_str(),
                     k.honoured ? "" : " (not yet: only the default)", k.doc.c_str());
  }
  return out;
}

}  // namespace zero3d
