// ckpt/safetensors.h: the safetensors format's reader (the Hugging Face weights format:
// 8 bytes of header length, a JSON header naming each tensor's dtype, shape and byte range, the
// data), every field checked, so a truncated or corrupt file is a UserError in zero3d's words.
// checkpoint.init_from reads through it (ckpt/hf.h); the fuzz harness tests/fuzz drives it alone.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero3d {

struct Safetensors {
  nlohmann::json header;  // an object: tensor name -> entry, and __metadata__
  const char* data = nullptr;  // into the file's bytes given to parse_safetensors
  size_t data_bytes = 0;
};
// `file`: the whole file's bytes (kept alive by the caller); `where` starts every error.
Safetensors parse_safetensors(const std::string& file, const std::string& where);

// One tensor's header entry, checked: its dtype (F32, BF16 or F16: 4 or 2 bytes; another: 0), shape
// and byte range inside the data.
struct StEntry {
  std::string dtype;
  size_t elem = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
StEntry st_entry(const nlohmann::json& header, const std::string& name, const std::string& where, uint64_t data_bytes);

}  // namespace zero3d
