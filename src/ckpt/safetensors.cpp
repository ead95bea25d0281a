#include "ckpt/safetensors.h"

#include <algorithm>
#include <cstring>

#include "config/json_tree.h"
#include "core/check.h"

namespace zero3d {

Safetensors parse_safetensors(const std::string& file, const std::string& where) {
  uint64_t n = 0;
  if (file.size() >= 8) std::memcpy(&n, file.data(), 8);
  if (file.size() < 8 || n > file.size() - 8)
    throw UserError(strprintf("%s is not a safetensors file, or a truncated one: %zu bytes, its first 8 give a header "
                              "of %llu", where.c_str(), file.size(), (unsigned long long)n));
  Safetensors st;
  st.header = config_json::parse_text(file.substr(8, n), where + ": the header");
  if (!st.header.is_object()) throw UserError(where + ": the header is not a JSON object");
  st.data = file.data() + 8 + n;
  st.data_bytes = file.size() - 8 - n;
  return st;
}

StEntry st_entry(const nlohmann::json& header, const std::string& name, const std::string& where, uint64_t data_bytes) {
  if (!header.contains(name)) throw UserError(strprintf("%s has no tensor '%s'", where.c_str(), name.c_str()));
  const nlohmann::json& h = header[name];
  StEntry e;
  const nlohmann::json* dtype = h.is_object() && h.contains("dtype") ? &h["dtype"] : nullptr;
  const nlohmann::json* shape = h.is_object() && h.contains("shape") ? &h["shape"] : nullptr;
  const nlohmann::json* off = h.is_object() && h.contains("data_offsets") ? &h["data_offsets"] : nullptr;
  auto whole = [](const nlohmann::json& v) { return v.is_number_unsigned(); };
  if (!dtype || !dtype->is_string() || !shape || !shape->is_array() || !std::all_of(shape->begin(), shape->end(), whole) ||
      !off || !off->is_array() || off->size() != 2 || !whole((*off)[0]) || !whole((*off)[1]))
    throw UserError(strprintf("%s: tensor '%s' has no valid header entry (a dtype, a shape and two data_offsets): %s",
                              where.c_str(), name.c_str(), config_json::show(h).c_str()));
  e.dtype = dtype->get<std::string>();
  e.elem = e.dtype == "F32" ? 4 : e.dtype == "BF16" || e.dtype == "F16" ? 2 : 0;
  e.shape = shape->get<std::vector<int64_t>>();
  e.begin = (*off)[0].get<uint64_t>(), e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes)
    throw UserError(strprintf("%s: tensor '%s' lies at bytes [%llu, %llu) of the data, which holds %llu: the file is "
                              "truncated or corrupt",
                              where.c_str(), name.c_str(), (unsigned long long)e.begin, (unsigned long long)e.end,
                              (unsigned long long)data_bytes));
  return e;
}

}  // namespace zero3d
