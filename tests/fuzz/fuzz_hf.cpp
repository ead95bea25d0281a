// The Hugging Face directory reader of checkpoint.init_from (ckpt/hf_import.cpp, ckpt/safetensors.cpp):
// config.json against this run's model, then model.safetensors' header, every tensor's dtype,
// shape and byte range, and every value. Input: config.json, then "--- model.safetensors" and the
// file's bytes; a section "--- llama" makes the run's model the tiny Llama (else the tiny GPT-2).
// Seeds: both families exported in F32, BF16 and F16 as `zero3d ckpt export --format hf` lays
// them out (hf_config, hf_tensors).
#include <cstring>

#include "ckpt/hf.h"
#include "fuzz.h"
#include "kernels/math/dtype.h"
#include "tiny_models.h"

namespace {

using namespace zero3d;

std::string safetensors_of(const ModelConfig& m, const char* dtype) {
  const size_t es = std::strcmp(dtype, "F32") == 0 ? 4 : 2;
  nlohmann::ordered_json header;
  std::string data;
  float x = 0.01f;
  for (const HfTensor& t : hf_tensors(m)) {
    const size_t n = static_cast<size_t>(t.rows * t.cols);
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape()}, {"data_offsets", {data.size(), data.size() + n * es}}};
    for (size_t i = 0; i < n; ++i, x = -x * 1.01f) {
      if (es == 4) {
        data.append(reinterpret_cast<const char*>(&x), 4);
      } else {
        const uint16_t u = std::strcmp(dtype, "BF16") == 0 ? math::bf16_from_float(x) : math::fp16_from_float(x);
        data.append(reinterpret_cast<const char*>(&u), 2);
      }
    }
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + text + data;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const std::string dir = fuzz::seed_request(); !dir.empty()) {
    for (const bool llama : {false, true}) {
      const ModelConfig m = llama ? fuzz::tiny_llama() : fuzz::tiny_gpt2();
      for (const char* dtype : {"F32", "BF16", "F16"}) {
        std::map<std::string, std::string> parts{{"", hf_config(m, "float32").dump(2) + "\n"},
                                                 {"model.safetensors", safetensors_of(m, dtype)}};
        if (llama) parts["llama"] = "";
        fuzz::write_seed(dir, std::string(llama ? "llama_" : "gpt2_") + dtype, fuzz::join_sections(parts));
      }
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = fuzz::sections(std::string_view(reinterpret_cast<const char*>(data), size));
  const ModelConfig m = parts.count("llama") ? fuzz::tiny_llama() : fuzz::tiny_gpt2();
  fuzz::put_file("config.json", parts[""]);
  fuzz::put_file("model.safetensors", parts["model.safetensors"]);
  fuzz::expect_user_errors([&] {
    const auto w = read_hf_weights(fuzz::scratch_dir(), m);
    for (const auto& [name, values] : w->tensors)
      for (float v : values)
        if (!std::isfinite(v)) __builtin_trap();  // the reader promises finite weights
  });
  return 0;
}
