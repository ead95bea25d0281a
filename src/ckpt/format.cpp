#include "ckpt/format.h"

#include <climits>
#include <cstring>

#include "config/json_tree.h"
#include "core/check.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace zero3d {

const char* const kCheckpointFormat = "zero3d-checkpoint";
const char* const kChecksumAlgorithm =
    "sum over the dataset's elements of splitmix64((i << 32) | bits), modulo 2^64, where i is the element's "
    "row-major index in the dataset and bits its stored bits (uint32 for float32, uint16 for 16-bit)";

uint64_t checksum_run(uint64_t first, const float* x, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    sum += splitmix64(((first + i) << 32) | bits);
  }
  return sum;
}
uint64_t checksum_run(uint64_t first, const uint16_t* x, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += splitmix64(((first + i) << 32) | x[i]);
  return sum;
}

// ---- root attributes ----

using H = CheckpointHeader;
constexpr bool kOptional = true;  // HeaderField::optional
const std::vector<HeaderField> kHeaderFields = {
    {"format", &H::format, "\"zero3d-checkpoint\""},
    {"format_version", &H::format_version, "the format's version (this file's layout)"},
    {"zero3d_version", &H::zero3d_version, "the zero3d that wrote it"},
    {"step", &H::step, "global steps taken (skipped fp16 steps included)"},
    {"optimizer_steps", &H::optimizer_steps, "updates applied: Adam's t and the LR schedule's position"},
    {"data_cursor", &H::data_cursor, "global samples consumed"},
    {"seed", &H::seed, "the run's seed"},
    {"world_size", &H::world_size, "ranks at save"},
    {"tp", &H::tp, "tensor-parallel size at save"},
    {"pp", &H::pp, "pipeline-parallel size at save"},
    {"dp", &H::dp, "data-parallel size at save"},
    {"zero_stage", &H::zero_stage, "ZeRO stage at save"},
    {"precision", &H::precision, "fp32, bf16 or fp16"},
    {"n_layer", &H::n_layer, "model shape"},
    {"n_head", &H::n_head, "model shape"},
    {"d_model", &H::d_model, "model shape"},
    {"vocab_size", &H::vocab_size, "model shape"},
    {"seq_len", &H::seq_len, "model shape"},
    {"architecture", &H::architecture, "the architecture keys (JSON); absent in GPT-2 checkpoints before them",
     kOptional},
    {"config", &H::config, "the resolved run config (JSON)"},
    {"loss_scaler", &H::loss_scaler, "the fp16 loss scaler's state (JSON)"},
    {"lr_scheduler", &H::lr_scheduler, "the LR schedule's position (JSON)"},
    {"rng", &H::rng, "the RNG's state"},
    {"checksum_algorithm", &H::checksum_algorithm, "how each dataset's checksum attribute is computed"},
    {"data", &H::data, "the training data's shards and sequences, which the data cursor counts in (JSON); absent "
                       "before zero3d read shards", kOptional},
    {"tokenizer", &H::tokenizer, "the run's tokenizer (JSON: kind, the file beside the checkpoint, its hash); \"\" = unknown",
     kOptional},
};

std::string CheckpointHeader::layout() const {
  return strprintf("world %lld = tp %lld x pp %lld x dp %lld, ZeRO-%lld, %s", (long long)world_size, (long long)tp,
                   (long long)pp, (long long)dp, (long long)zero_stage, precision.c_str());
}

void write_header(hid_t file, const CheckpointHeader& h) {
  for (const HeaderField& f : kHeaderFields)
    std::visit([&](auto member) { write_attr(file, f.name, h.*member); }, f.member);
}

CheckpointHeader read_header(hid_t file, const std::string& path) {
  CheckpointHeader h;
  auto read = [&](const HeaderField& f) {
    std::visit(
        [&](auto member) {
          if (!read_attr(file, f.name, h.*member) && !f.optional)
            throw UserError(strprintf(
                "checkpoint '%s' has no valid attribute '%s' (not a zero3d checkpoint, or corrupt)", path.c_str(),
                f.name));
        },
        f.member);
  };
  read(kHeaderFields[0]);
  if (h.format != kCheckpointFormat)
    throw UserError(strprintf("'%s' is an HDF5 file but not a zero3d checkpoint", path.c_str()));
  read(kHeaderFields[1]);
  if (h.format_version > kCheckpointFormatVersion)
    throw UserError(strprintf("checkpoint '%s' has format version %lld; this zero3d reads up to %d (upgrade zero3d)",
                              path.c_str(), (long long)h.format_version, kCheckpointFormatVersion));
  for (size_t i = 2; i < kHeaderFields.size(); ++i) read(kHeaderFields[i]);
  return h;
}

std::vector<std::pair<const HeaderField*, std::string>> header_text(hid_t file) {
  std::vector<std::pair<const HeaderField*, std::string>> out;
  for (const HeaderField& f : kHeaderFields) {
    std::string text = "(missing)";
    std::visit(
        [&](auto member) {
          std::remove_reference_t<decltype(CheckpointHeader{}.*member)> v{};
          if (!read_attr(file, f.name, v)) return;
          if constexpr (std::is_same_v<decltype(v), std::string>) text = v;
          else text = std::to_string(v);
        },
        f.member);
    out.push_back({&f, text});
  }
  return out;
}

// ---- datasets ----

const char* group_of(StateKind k) {
  switch (k) {
    case StateKind::model: return "/model";
    case StateKind::master: return "/optimizer/master";
    case StateKind::exp_avg: return "/optimizer/exp_avg";
    case StateKind::exp_avg_sq: return "/optimizer/exp_avg_sq";
  }
  return "";
}

namespace {
std::vector<DatasetSpec> datasets_of(const ModelConfig& m, const std::vector<StateKind>& kinds, bool mixed) {
  const std::vector<ParamInfo> whole = gpt_param_table(m);
  std::vector<DatasetSpec> out;
  for (StateKind k : kinds)
    for (const ParamInfo& p : whole)
      out.push_back({std::string(group_of(k)) + "/" + p.name, p.id, k, mixed && k == StateKind::model,
                     {p.logical_shape.begin(), p.logical_shape.end()}});
  return out;
}
}  // namespace

std::vector<DatasetSpec> checkpoint_datasets(const ModelConfig& m, bool mixed) {
  if (mixed) return datasets_of(m, {StateKind::model, StateKind::master, StateKind::exp_avg, StateKind::exp_avg_sq}, true);
  return datasets_of(m, {StateKind::model, StateKind::exp_avg, StateKind::exp_avg_sq}, false);
}

std::vector<DatasetSpec> optimizer_datasets(const ModelConfig& m, bool mixed_file) {
  // The master is read as fp32 whichever group holds it: its kind says where it goes.
  std::vector<DatasetSpec> out =
      datasets_of(m, {mixed_file ? StateKind::master : StateKind::model, StateKind::exp_avg, StateKind::exp_avg_sq},
                  false);
  for (DatasetSpec& d : out)
    if (d.kind == StateKind::model) d.kind = StateKind::master;
  return out;
}

Hid open_checkpoint_dataset(hid_t file, const std::string& file_path, const std::string& dataset) {
  if (H5Lexists(file, dataset.substr(0, dataset.rfind('/')).c_str(), H5P_DEFAULT) <= 0 ||
      H5Lexists(file, dataset.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(strprintf("checkpoint '%s' has no dataset '%s' (the file is incomplete or from another model)",
                              file_path.c_str(), dataset.c_str()));
  Hid ds(H5Dopen2(file, dataset.c_str(), H5P_DEFAULT));
  if (!ds.valid())
    throw UserError(strprintf("checkpoint '%s': dataset '%s' cannot be opened (corrupt file)", file_path.c_str(),
                              dataset.c_str()));
  return ds;
}

namespace {

// The model of a checkpoint's shape and architecture record (`arch`; null where the file has none:
// GPT-2's keys, ModelConfig's defaults, as checkpoints from before the Llama family hold). UserError
// naming `where` when the record does not parse or holds a value no config takes.
ModelConfig saved_model(int vocab_size, int seq_len, int n_layer, int n_head, int d_model, const std::string* arch,
                        const std::string& where) {
  ModelConfig m{vocab_size, seq_len, n_layer, n_head, d_model};
  if (arch) set_architecture(m, config_json::parse_text(*arch, where + "attribute architecture"));
  return m;
}

}  // namespace

void check_saved_model(const CheckpointHeader& h, const ModelConfig& m, const std::string& path) {
  const std::pair<const char*, std::pair<int64_t, int>> shape[] = {{"n_layer", {h.n_layer, m.n_layer}},
                                                                   {"n_head", {h.n_head, m.n_head}},
                                                                   {"d_model", {h.d_model, m.d_model}},
                                                                   {"vocab_size", {h.vocab_size, m.vocab_size}},
                                                                   {"seq_len", {h.seq_len, m.seq_len}}};
  for (auto [key, v] : shape)
    if (v.first != v.second)
      throw UserError(strprintf("checkpoint '%s' holds a model with %s = %lld, but this run's model.%s is %d: the "
                                "model shapes must match",
                                path.c_str(), key, (long long)v.first, key, v.second));
  // The checkpoint's architecture keys on this run's shape (read_header leaves an absent record empty).
  const ModelConfig saved = saved_model(m.vocab_size, m.seq_len, m.n_layer, m.n_head, m.d_model,
                                        h.architecture.empty() ? nullptr : &h.architecture, "checkpoint '" + path + "': ");
  const nlohmann::json have = architecture_of(saved), want = architecture_of(m);
  for (const auto& [key, v] : want.items())
    if (have[key] != v)
      throw UserError(strprintf("checkpoint '%s' holds a model with %s = %s, but this run's model.%s is %s: the "
                                "architectures must match",
                                path.c_str(), key.c_str(), have[key].dump().c_str(), key.c_str(), v.dump().c_str()));
}

std::optional<ModelConfig> model_of(hid_t f) {
  int64_t v[5];
  const char* keys[5] = {"vocab_size", "seq_len", "n_layer", "n_head", "d_model"};
  for (int i = 0; i < 5; ++i)
    if (!read_attr(f, keys[i], v[i]) || v[i] <= 0 || v[i] > INT_MAX) return std::nullopt;
  std::string arch;
  const bool has_arch = read_attr(f, "architecture", arch);
  ModelConfig m;
  try {
    m = saved_model(int(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), has_arch ? &arch : nullptr, "");
  } catch (const UserError&) {
    return std::nullopt;
  }
  // A shape no config resolves to (a damaged file) has no tensor table: whole heads, whole key/value
  // groups, and a file that can hold the datasets of n_layer layers (each in /model and three
  // optimizer groups, every dataset an HDF5 object header of more than 64 bytes).
  hsize_t file_bytes = 0;
  if (m.d_model % m.n_head != 0 || m.n_head % m.kv_heads() != 0 || H5Fget_filesize(f, &file_bytes) < 0 ||
      static_cast<double>(m.n_layer) * 4 * 64 > static_cast<double>(file_bytes))
    return std::nullopt;
  return m;
}

}  // namespace zero3d
