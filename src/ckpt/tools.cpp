#include "ckpt/tools.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "ckpt/dir.h"
#include "ckpt/format.h"
#include "ckpt/hf.h"
#include "ckpt/tokenizer_record.h"
#include "config/json_tree.h"
#include "storage/hdf5_posix.h"
#include "model/gpt.h"

namespace zero3d {

static_assert(std::endian::native == std::endian::little, "checkpoint data and safetensors are little-endian");

namespace {

constexpr hsize_t kBlockElems = hsize_t(1) << 20;  // verify reads about this many elements at a time

struct CheckpointFile {
  std::string path;  // for messages
  Hid file;
};

// Opens the checkpoint DIR_OR_FILE names, through zero3d's POSIX driver (storage/hdf5_posix.h).
// Callers hold a QuietHdf5. A file that is there but no HDF5 file is a corrupt checkpoint (exit 4)
// for verify, a bad input (exit 2) for the others; a failed read is the storage's (exit 10).
CheckpointFile open_checkpoint(const std::string& dir_or_file, bool verifying = false) {
  CheckpointFile c{checkpoint_file(dir_or_file), Hid()};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(c.path, ec))
    throw UserError(strprintf("checkpoint '%s' %s", c.path.c_str(),
                              std::filesystem::exists(c.path, ec) ? "is not a file" : "does not exist"));
  clear_io_error();
  c.file = Hid(H5Fopen(c.path.c_str(), H5F_ACC_RDONLY, posix_file_access().get()));
  if (!c.file.valid() && !io_error().empty())
    throw RunError(strprintf("checkpoint '%s' could not be read: %s", c.path.c_str(), io_error().c_str()),
                   kExitReadFailed);
  if (!c.file.valid()) {
    const std::string what = strprintf("checkpoint '%s' cannot be opened: not an HDF5 file, or truncated or corrupt",
                                       c.path.c_str());
    if (verifying) throw RunError(what, kExitInconsistent);
    throw UserError(what);
  }
  std::string format;
  if (!read_attr(c.file.get(), "format", format) || format != "zero3d-checkpoint")
    throw UserError(strprintf("'%s' is an HDF5 file but not a zero3d checkpoint (attribute 'format' is not "
                              "\"zero3d-checkpoint\")",
                              c.path.c_str()));
  return c;
}

enum class Elem { f32, u16, other };

struct DatasetInfo {
  std::string path;
  std::vector<hsize_t> dims;
  Elem elem = Elem::other;
  size_t elem_size = 0;
  std::string half;   // the "dtype" attribute of a uint16 dataset: bfloat16 or float16
  std::string dtype;  // for people: float32, uint16 (bfloat16), ...
  hsize_t count() const {
    hsize_t n = 1;
    for (hsize_t d : dims) n *= d;
    return n;
  }
  hsize_t rows() const { return dims.empty() ? 1 : dims[0]; }  // a row: the elements of one first index
  hsize_t row_size() const { return dims.empty() ? 1 : count() / std::max<hsize_t>(dims[0], 1); }
  uint64_t bytes() const { return count() * elem_size; }
  std::string shape() const {
    std::string s;
    for (hsize_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
    return s.empty() ? "scalar" : s;
  }
};

DatasetInfo describe(hid_t ds, const std::string& path) {
  DatasetInfo d;
  d.path = path;
  Hid space(H5Dget_space(ds)), type(H5Dget_type(ds));
  const int nd = H5Sget_simple_extent_ndims(space.get());
  d.dims.resize(std::max(nd, 0));
  if (nd > 0) H5Sget_simple_extent_dims(space.get(), d.dims.data(), nullptr);
  const H5T_class_t cls = H5Tget_class(type.get());
  d.elem_size = H5Tget_size(type.get());
  if (cls == H5T_FLOAT && d.elem_size == 4) {
    d.elem = Elem::f32;
    d.dtype = "float32";
  } else if (cls == H5T_INTEGER && d.elem_size == 2 && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    d.elem = Elem::u16;
    d.dtype = read_attr(ds, "dtype", d.half) ? "uint16 (" + d.half + ")" : "uint16";
  } else {
    d.dtype = strprintf("other (HDF5 class %d, %zu bytes)", int(cls), d.elem_size);
  }
  return d;
}

// Every dataset's path: by group, and within a group in model order (wte, wpe, h.0..., ln_f;
// names the model does not know last).
std::vector<std::string> dataset_paths(const CheckpointFile& c) {
  std::vector<std::string> paths;
  auto visit = [](hid_t group, const char* name, const H5L_info_t* info, void* out) -> herr_t {
    if (info->type != H5L_TYPE_HARD) return 0;
    Hid obj(H5Oopen(group, name, H5P_DEFAULT));
    if (obj.valid() && H5Iget_type(obj.get()) == H5I_DATASET)
      static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name);
    return 0;
  };
  if (H5Lvisit(c.file.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &paths) < 0)
    throw UserError(strprintf("checkpoint '%s': its groups cannot be listed (corrupt file)", c.path.c_str()));
  std::map<std::string, int> order;
  if (const auto m = model_of(c.file.get()))
    for (const ParamInfo& p : gpt_param_table(*m)) order[p.name] = p.id;
  auto key = [&](const std::string& p) {
    const size_t slash = p.rfind('/');
    const std::string leaf = p.substr(slash + 1);
    return std::make_tuple(p.substr(0, slash), order.contains(leaf) ? order[leaf] : INT_MAX, leaf);
  };
  std::sort(paths.begin(), paths.end(), [&](const std::string& a, const std::string& b) { return key(a) < key(b); });
  return paths;
}

// What verify learns of a dataset's values: their checksum, and the ones that are not finite
// numbers (a run that diverged saved them).
struct DatasetSum {
  uint64_t sum = 0;
  uint64_t nonfinite = 0, first_nonfinite = 0;
};

// Reads rows [r0, r0 + k) of dataset d into buf and adds their checksum (ckpt/checkpoint.h) and
// non-finite values to s. Returns false when HDF5 cannot read them.
template <typename T>
bool read_rows(hid_t ds, const DatasetInfo& d, hsize_t r0, hsize_t k, std::vector<T>& buf, DatasetSum& s) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>);
  const hid_t mem_type = std::is_same_v<T, float> ? H5T_NATIVE_FLOAT : H5T_NATIVE_UINT16;
  const hsize_t n = k * d.row_size();
  buf.resize(n);
  if (n == 0) return true;
  if (d.dims.empty()) {
    if (H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) return false;
  } else {
    Hid fspace(H5Dget_space(ds));
    std::vector<hsize_t> start(d.dims.size(), 0), count = d.dims;
    start[0] = r0;
    count[0] = k;
    Hid mspace(H5Screate_simple(1, &n, nullptr));
    if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
        H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) < 0)
      return false;
  }
  s.sum += checksum_run(r0 * d.row_size(), buf.data(), n);
  // 16 bits: all exponent bits set is inf or nan, in bf16 (8 of them) as in fp16 (5).
  const uint16_t exp16 = d.half == "float16" ? 0x7C00 : 0x7F80;
  for (hsize_t i = 0; i < n; ++i) {
    bool bad;
    if constexpr (std::is_same_v<T, float>) bad = !std::isfinite(buf[i]);
    else bad = (buf[i] & exp16) == exp16;
    if (bad && s.nonfinite++ == 0) s.first_nonfinite = r0 * d.row_size() + i;
  }
  return true;
}

// The checksum and non-finite values of the whole dataset, a block of rows at a time; nullopt
// when a read fails.
template <typename T>
std::optional<DatasetSum> dataset_checksum(hid_t ds, const DatasetInfo& d) {
  const hsize_t block = std::max<hsize_t>(1, kBlockElems / std::max<hsize_t>(d.row_size(), 1));
  std::vector<T> buf;
  DatasetSum s;
  for (hsize_t r = 0; r < d.rows(); r += block)
    if (!read_rows(ds, d, r, std::min(block, d.rows() - r), buf, s)) return std::nullopt;
  return s;
}

std::string mib(uint64_t bytes) { return strprintf("%.2f MiB", double(bytes) / (1 << 20)); }

}  // namespace

int ckpt_inspect(const std::string& dir_or_file) {
  QuietHdf5 quiet;
  const CheckpointFile c = open_checkpoint(dir_or_file);
  log_info("checkpoint %s", c.path.c_str());
  std::map<std::string, std::string> v;
  for (const auto& [field, text] : header_text(c.file.get())) v[field->name] = text;
  log_info("  %-16sworld %s = tp %s x pp %s x dp %s, ZeRO-%s, %s", "layout at save", v["world_size"].c_str(),
           v["tp"].c_str(), v["pp"].c_str(), v["dp"].c_str(), v["zero_stage"].c_str(), v["precision"].c_str());
  log_info("  %-16sn_layer %s, n_head %s, d_model %s, vocab_size %s, seq_len %s", "model", v["n_layer"].c_str(),
           v["n_head"].c_str(), v["d_model"].c_str(), v["vocab_size"].c_str(), v["seq_len"].c_str());
  // Every root attribute in the format's order (the long config and algorithm text by size).
  for (const auto& [field, text] : header_text(c.file.get())) {
    const bool is_long = text.size() > 100;
    const int width = std::max<int>(16, static_cast<int>(std::strlen(field->name)) + 1);
    log_info("  %-*s%s", width, field->name, is_long ? strprintf("(%zu characters: %s)", text.size(), field->meaning).c_str()
                                                : text.c_str());
  }

  const std::vector<std::string> paths = dataset_paths(c);
  int width = 7;
  for (const std::string& p : paths) width = std::max(width, int(p.size()));
  log_info("  %-*s  %-18s  %-12s  %12s", width, "dataset", "dtype", "shape", "bytes");
  uint64_t total = 0;
  for (const std::string& p : paths) {
    Hid ds = open_checkpoint_dataset(c.file.get(), c.path, p);
    const DatasetInfo d = describe(ds.get(), p);
    log_info("  %-*s  %-18s  %-12s  %12llu", width, p.c_str(), d.dtype.c_str(), d.shape().c_str(),
             (unsigned long long)d.bytes());
    total += d.bytes();
  }
  log_info("  total: %zu datasets, %llu bytes (%s)", paths.size(), (unsigned long long)total, mib(total).c_str());
  return 0;
}

int ckpt_verify(const std::string& dir_or_file) {
  QuietHdf5 quiet;
  const CheckpointFile c = open_checkpoint(dir_or_file, /*verifying=*/true);
  bool io_failed = false;
  const std::vector<std::string> paths = dataset_paths(c);
  std::vector<std::pair<std::string, std::string>> failures;  // (dataset, what is wrong)
  // Every tensor load_checkpoint needs must be there (and /model, which export reads).
  if (const auto m = model_of(c.file.get())) {
    std::string precision;
    read_attr(c.file.get(), "precision", precision);
    for (const DatasetSpec& d : checkpoint_datasets(*m, precision != "fp32"))
      if (std::find(paths.begin(), paths.end(), d.path) == paths.end()) failures.push_back({d.path, "is missing"});
  } else {
    failures.push_back({"/", "has no valid model shape attributes (n_layer, n_head, d_model, vocab_size, seq_len)"});
  }
  uint64_t bytes = 0;
  for (const std::string& p : paths) {
    throw_if_interrupted("ckpt verify");
    Hid ds(H5Dopen2(c.file.get(), p.c_str(), H5P_DEFAULT));
    if (!ds.valid()) {
      failures.push_back({p, "cannot be opened (corrupt file)"});
      continue;
    }
    const DatasetInfo d = describe(ds.get(), p);
    bytes += d.bytes();
    uint64_t stored = 0;
    if (d.elem == Elem::other) {
      failures.push_back({p, "is " + d.dtype + ", which the format does not checksum"});
      continue;
    }
    if (!read_attr(ds.get(), "checksum", stored)) {
      failures.push_back({p, "has no checksum attribute"});
      continue;
    }
    const std::optional<DatasetSum> sum =
        d.elem == Elem::f32 ? dataset_checksum<float>(ds.get(), d) : dataset_checksum<uint16_t>(ds.get(), d);
    if (!sum && !io_error().empty())
      io_failed = true, failures.push_back({p, "cannot be read: " + io_error() + " (the storage failed)"});
    else if (!sum)
      failures.push_back({p, "cannot be read (corrupt or truncated file)"});
    else if (sum->sum != stored)
      failures.push_back({p, strprintf("fails its checksum (stored %016llx, data gives %016llx)",
                                       (unsigned long long)stored, (unsigned long long)sum->sum)});
    else if (sum->nonfinite > 0)
      failures.push_back({p, strprintf("holds %llu non-finite values (inf or nan; the first is element %llu): the run "
                                       "had diverged when it saved this checkpoint",
                                       (unsigned long long)sum->nonfinite, (unsigned long long)sum->first_nonfinite)});
  }
  for (const auto& [p, what] : failures)
    log_info("checkpoint '%s': dataset '%s' %s", c.path.c_str(), p.c_str(), what.c_str());
  if (!failures.empty())
    throw RunError(strprintf("checkpoint '%s' fails verification: %zu problem%s in %zu datasets (see above)",
                             c.path.c_str(), failures.size(), failures.size() == 1 ? "" : "s", paths.size()),
                   io_failed ? kExitReadFailed : kExitInconsistent);
  log_info("checkpoint '%s': all %zu datasets match their checksums, every value finite (%llu bytes, %s)", c.path.c_str(), paths.size(),
           (unsigned long long)bytes, mib(bytes).c_str());
  return 0;
}

CheckpointModel read_checkpoint_model(const std::string& dir_or_file) {
  QuietHdf5 quiet;
  const CheckpointFile c = open_checkpoint(dir_or_file);
  CheckpointModel out;
  std::string precision;
  const std::optional<ModelConfig> m = model_of(c.file.get());
  if (!read_attr(c.file.get(), "precision", precision) || !read_attr(c.file.get(), "step", out.step) || !m)
    throw UserError(strprintf("checkpoint '%s' lacks its precision, step or model shape attributes (corrupt file)",
                              c.path.c_str()));
  out.model = *m;
  out.file = c.path;
  read_attr(c.file.get(), "tokenizer", out.tokenizer);  // absent in checkpoints before it: unknown
  const std::string group = precision != "fp32" ? "/optimizer/master" : "/model";
  for (const ParamInfo& p : gpt_param_table(*m)) {
    const std::string path = group + "/" + p.name;
    Hid ds = open_checkpoint_dataset(c.file.get(), c.path, path);
    const DatasetInfo d = describe(ds.get(), path);
    DatasetSum sum;
    uint64_t stored = 0;
    std::vector<float> t;
    if (d.elem != Elem::f32 || d.count() != p.size || !read_rows(ds.get(), d, 0, d.rows(), t, sum) ||
        !read_attr(ds.get(), "checksum", stored) || stored != sum.sum)
      throw UserError(strprintf("checkpoint '%s': dataset '%s' is not %zu float32 values matching its checksum "
                                "(zero3d ckpt verify says what is wrong)",
                                c.path.c_str(), path.c_str(), p.size));
    out.tensors.push_back(std::move(t));
  }
  return out;
}

int ckpt_export(const std::string& dir_or_file, const std::string& out, const std::string& weights,
                const std::string& format, const std::string& tokenizer) {
  if (weights != "master" && weights != "model")
    throw UserError(strprintf("--weights must be master or model, got '%s'", weights.c_str()));
  if (format != "safetensors" && format != "hf")
    throw UserError(strprintf("--format must be safetensors or hf, got '%s'", format.c_str()));
  QuietHdf5 quiet;
  const CheckpointFile c = open_checkpoint(dir_or_file);
  const hid_t f = c.file.get();
  std::string precision;
  int64_t step = 0;
  const std::optional<ModelConfig> m = model_of(f);
  if (!read_attr(f, "precision", precision) || !read_attr(f, "step", step) || !m)
    throw UserError(strprintf("checkpoint '%s' lacks its precision, step or model shape attributes (corrupt file)",
                              c.path.c_str()));
  // The fp32 master lives in /optimizer/master for 16-bit runs, in /model for fp32 runs.
  const std::string group = weights == "master" && precision != "fp32" ? "/optimizer/master" : "/model";

  // What goes out: zero3d's tensors as they are, or Hugging Face's (ckpt/hf.h: parts, transposes).
  std::vector<HfTensor> pieces;
  if (format == "hf") {
    pieces = hf_tensors(*m);
  } else {
    for (const ParamInfo& p : gpt_param_table(*m))
      pieces.push_back({p.name, p.name, 0, p.shape[0], p.shape.size() > 1 ? p.shape[1] : 1, false, p.shape.size() == 1});
  }

  // Pass 1: shapes and dtypes make the header. Pass 2: the data, one source tensor at a time.
  std::map<std::string, DatasetInfo> sources;
  nlohmann::ordered_json header;
  std::set<std::string> dtypes;
  uint64_t offset = 0;
  for (const HfTensor& t : pieces) {
    if (!sources.count(t.source)) {
      const std::string path = group + "/" + t.source;
      Hid ds = open_checkpoint_dataset(c.file.get(), c.path, path);
      sources.emplace(t.source, describe(ds.get(), path));
    }
    const DatasetInfo& d = sources.at(t.source);
    std::string dtype;
    if (d.elem == Elem::f32) dtype = "F32";
    else if (d.elem == Elem::u16 && weights == "model" && d.half == "bfloat16") dtype = "BF16";
    else if (d.elem == Elem::u16 && weights == "model" && d.half == "float16") dtype = "F16";
    else
      throw UserError(strprintf("checkpoint '%s': dataset '%s' is %s; export expects float32%s", c.path.c_str(),
                                d.path.c_str(), d.dtype.c_str(),
                                weights == "model" ? " or uint16 with attribute dtype bfloat16/float16" : ""));
    const uint64_t bytes = static_cast<uint64_t>(t.rows) * t.cols * d.elem_size;
    header[t.name] = {{"dtype", dtype},
                      {"shape", t.shape()},
                      {"data_offsets", nlohmann::ordered_json::array({offset, offset + bytes})}};
    offset += bytes;
    dtypes.insert(dtype);
  }
  header["__metadata__"] = {{"format", "pt"}, {"source", c.path}, {"step", std::to_string(step)}};
  std::string text = config_json::to_text(header);
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

  // --format hf: a directory as transformers' from_pretrained reads it, appearing whole (a failed
  // export leaves the one that was there, or nothing); else one file. Neither leaves a partial .tmp.
  std::optional<AtomicDir> dir;
  std::string file = out, tokenizer_note;
  if (format == "hf") {
    std::vector<std::string> names{"config.json", "model.safetensors"};
    names.insert(names.end(), kHfTokenizerFileNames.begin(), kHfTokenizerFileNames.end());
    dir.emplace(out, "Hugging Face export", names);
    const std::string torch_dtype = *dtypes.begin() == "F32" ? "float32" : *dtypes.begin() == "BF16" ? "bfloat16" : "float16";
    nlohmann::ordered_json config = hf_config(*m, torch_dtype);
    // The tokenizer files beside the weights, so AutoTokenizer and pipeline() read the export as it is.
    std::string record;
    read_attr(f, "tokenizer", record);
    if (record.empty() && tokenizer.empty()) {
      log_warn("checkpoint '%s' records no tokenizer (its run did not set data.tokenizer): the export has no tokenizer "
               "files; give --tokenizer FILE (or byte) to add them",
               c.path.c_str());
      tokenizer_note = ", no tokenizer";
    } else {
      const CheckpointTokenizer t = checkpoint_tokenizer(c.path, record, m->vocab_size, tokenizer);
      for (const HfFile& hf : hf_tokenizer_files(t, m->seq_len, config))
        write_file_atomic(dir->file(hf.name), hf.content, false, "Hugging Face " + hf.name);
      tokenizer_note = ", the " + t.kind + " tokenizer";
    }
    write_file_atomic(dir->file("config.json"), config.dump(2) + "\n", false, "Hugging Face config");
    file = dir->file("model.safetensors");
  }
  AtomicFile o(file, "safetensors file");
  const uint64_t n = text.size();
  o.write(&n, sizeof n);
  o.write(text);
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::string loaded;  // the source tensor in f32 / u16
  std::vector<char> moved;
  for (const HfTensor& t : pieces) {
    throw_if_interrupted("ckpt export");
    const DatasetInfo& d = sources.at(t.source);
    if (loaded != t.source) {
      Hid ds = open_checkpoint_dataset(c.file.get(), c.path, d.path);
      DatasetSum sum;
      uint64_t stored = 0;
      const bool ok = d.elem == Elem::f32 ? read_rows(ds.get(), d, 0, d.rows(), f32, sum)
                                          : read_rows(ds.get(), d, 0, d.rows(), u16, sum);
      if (!ok)
        throw UserError(strprintf("checkpoint '%s': dataset '%s' cannot be read (corrupt or truncated file)",
                                  c.path.c_str(), d.path.c_str()));
      if (!read_attr(ds.get(), "checksum", stored) || stored != sum.sum)
        throw UserError(strprintf("checkpoint '%s': dataset '%s' has no checksum or fails it: the file is corrupt "
                                  "(zero3d ckpt verify lists every bad dataset)",
                                  c.path.c_str(), d.path.c_str()));
      loaded = t.source;
    }
    const char* data = d.elem == Elem::f32 ? reinterpret_cast<const char*>(f32.data())
                                           : reinterpret_cast<const char*>(u16.data());
    const size_t es = d.elem_size, row_bytes = static_cast<size_t>(t.cols) * es;
    const char* first = data + static_cast<size_t>(t.row0) * row_bytes;
    if (!t.transpose) {
      o.write(first, static_cast<size_t>(t.rows) * row_bytes);
      continue;
    }
    moved.resize(static_cast<size_t>(t.rows) * row_bytes);  // (rows, cols) -> (cols, rows)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t col = 0; col < t.cols; ++col)
        std::memcpy(moved.data() + (static_cast<size_t>(col) * t.rows + r) * es,
                    first + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(col) * es, es);
    o.write(moved.data(), moved.size());
  }
  o.commit();
  if (dir) dir->commit();
  std::string dtype_list;
  for (const std::string& t : dtypes) dtype_list += (dtype_list.empty() ? "" : "+") + t;
  log_info("exported %zu tensors (%s weights from %s, %s, %llu bytes of data%s) of step %lld from '%s' to '%s'",
           pieces.size(), weights.c_str(), group.c_str(), dtype_list.c_str(), (unsigned long long)offset,
           format == "hf" ? (", Hugging Face names and config.json" + tokenizer_note).c_str() : "", (long long)step,
           c.path.c_str(), out.c_str());
  return 0;
}

}  // namespace zero3d
