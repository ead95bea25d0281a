// The checkpoint's metadata reader: the root attributes as a load (ckpt/reader.cpp) and `zero3d
// ckpt inspect/verify/export` read them (read_header, header_text, model_of), the saved model
// against this run's (check_saved_model: shape, then the architecture JSON) and the fp16 loss
// scaler's JSON state (check_state, load_state). The HDF5 library's own parsing of a file is not
// zero3d's to fuzz: the harness writes the attributes into an in-memory HDF5 file and zero3d reads
// them back. Input: one attribute a line, "NAME TYPE VALUE", TYPE one of str (a fixed-length
// string, as zero3d writes), vstr (variable-length), i64, u64, i8, f64; a NAME's second line is
// ignored. Seeds: the headers zero3d writes for the tiny GPT-2 and Llama (fp32, fp16).
#include <hdf5.h>

#include <set>
#include <sstream>

#include "ckpt/format.h"
#include "fuzz.h"
#include "model/gpt.h"
#include "tiny_models.h"
#include "zero/loss_scaler.h"

namespace {

using namespace zero3d;

std::string header_text_of(const ModelConfig& m, bool fp16) {
  CheckpointHeader h;
  h.format = kCheckpointFormat, h.format_version = kCheckpointFormatVersion, h.zero3d_version = "fuzz";
  h.step = 20, h.optimizer_steps = 19, h.data_cursor = 160, h.seed = 1234;
  h.world_size = 8, h.tp = 2, h.pp = 2, h.dp = 2, h.zero_stage = 3, h.precision = fp16 ? "fp16" : "fp32";
  h.n_layer = m.n_layer, h.n_head = m.n_head, h.d_model = m.d_model, h.vocab_size = m.vocab_size, h.seq_len = m.seq_len;
  h.architecture = architecture_of(m).dump();
  h.config = R"({"train_batch_size":8,"model":{"n_layer":1}})";
  Fp16Config f;
  f.enabled = fp16;
  h.loss_scaler = LossScaler(f).save_state();
  h.lr_scheduler = R"({"type":"WarmupCosineLR","last_batch_iteration":19})";
  h.rng = "counter-based splitmix64 keyed by seed 1234: the seed is the whole state";
  h.checksum_algorithm = kChecksumAlgorithm;
  std::string out;
  for (const HeaderField& field : kHeaderFields)
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(h.*member)>;
          const char* type = std::is_same_v<T, std::string> ? "str" : std::is_same_v<T, int64_t> ? "i64" : "u64";
          std::ostringstream value;
          value << h.*member;
          out += std::string(field.name) + " " + type + " " + value.str() + "\n";
        },
        field.member);
  return out;
}

// One attribute on the root group; false when HDF5 refuses it (a name it cannot hold).
bool put_attribute(hid_t file, const std::string& name, const std::string& type, const std::string& value) {
  hid_t t = -1;
  std::string s = value;
  const char* vs = s.c_str();
  int64_t i64 = 0;
  uint64_t u64 = 0;
  int8_t i8 = 0;
  double f64 = 0;
  const void* data = nullptr;
  if (type == "str") {
    t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, std::max<size_t>(1, s.size()));
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    data = s.c_str();
  } else if (type == "vstr") {
    t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    data = &vs;
  } else if (type == "i64" || type == "i8") {
    i64 = std::strtoll(s.c_str(), nullptr, 10), i8 = static_cast<int8_t>(i64);
    t = H5Tcopy(type == "i64" ? H5T_NATIVE_INT64 : H5T_NATIVE_INT8);
    data = type == "i64" ? static_cast<const void*>(&i64) : &i8;
  } else if (type == "u64") {
    u64 = std::strtoull(s.c_str(), nullptr, 10);
    t = H5Tcopy(H5T_NATIVE_UINT64), data = &u64;
  } else if (type == "f64") {
    f64 = std::strtod(s.c_str(), nullptr);
    t = H5Tcopy(H5T_NATIVE_DOUBLE), data = &f64;
  } else {
    return false;
  }
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(file, name.c_str(), t, space, H5P_DEFAULT, H5P_DEFAULT);
  const bool ok = a >= 0 && H5Awrite(a, t, data) >= 0;
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  H5Tclose(t);
  return ok;
}

void read_as_zero3d_does(hid_t f) {
  const std::string path = "fuzz.h5";
  (void)header_text(f);
  if (const std::optional<ModelConfig> m = model_of(f)) {  // what inspect and verify do with it
    (void)gpt_param_table(*m);
    (void)checkpoint_datasets(*m, true);
  }
  fuzz::expect_user_errors([&] {
    const CheckpointHeader h = read_header(f, path);
    (void)h.layout();
    for (const ModelConfig& m : {fuzz::tiny_gpt2(), fuzz::tiny_llama()})
      fuzz::expect_user_errors([&] { check_saved_model(h, m, path); });
    LossScaler::check_state(h.loss_scaler);
    Fp16Config dynamic;
    dynamic.enabled = true;
    LossScaler(dynamic).load_state(h.loss_scaler);
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the harness's own refused attributes are not news
  if (const std::string dir = fuzz::seed_request(); !dir.empty()) {
    fuzz::write_seed(dir, "gpt2_fp32", header_text_of(fuzz::tiny_gpt2(), false));
    fuzz::write_seed(dir, "gpt2_fp16", header_text_of(fuzz::tiny_gpt2(), true));
    fuzz::write_seed(dir, "llama_fp32", header_text_of(fuzz::tiny_llama(), false));
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, 1 << 16, 0);  // in memory, never written
  const hid_t f = H5Fcreate("fuzz.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (f < 0) __builtin_trap();
  std::set<std::string> names;
  std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(' '), b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (b == std::string::npos) continue;
    const std::string name = line.substr(0, a);
    if (name.empty() || !names.insert(name).second) continue;
    put_attribute(f, name, line.substr(a + 1, b - a - 1), line.substr(b + 1));
  }
  read_as_zero3d_does(f);
  H5Fclose(f);
  return 0;
}
