#include "io/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "io/ckpt_dir.h"
#include "io/hdf5.h"
#include "model/gpt.h"
#include "optim/lr_schedule.h"

namespace zero3d {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Piece = ZeroEngine::Piece;

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

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- datasets ----

enum class Kind { model, master, exp_avg, exp_avg_sq };

struct DatasetSpec {
  std::string path;
  int tensor;  // index in the whole model's table (= ParamInfo::id)
  Kind kind;
};

const char* group_of(Kind k) {
  switch (k) {
    case Kind::model: return "/model";
    case Kind::master: return "/optimizer/master";
    case Kind::exp_avg: return "/optimizer/exp_avg";
    case Kind::exp_avg_sq: return "/optimizer/exp_avg_sq";
  }
  return "";
}

ZeroEngine::State state_of(Kind k) {
  return k == Kind::exp_avg ? ZeroEngine::State::exp_avg
         : k == Kind::exp_avg_sq ? ZeroEngine::State::exp_avg_sq
                                 : ZeroEngine::State::master;
}

std::vector<DatasetSpec> dataset_specs(const std::vector<ParamInfo>& whole, const std::vector<Kind>& kinds) {
  std::vector<DatasetSpec> out;
  for (Kind k : kinds)
    for (size_t t = 0; t < whole.size(); ++t)
      out.push_back({std::string(group_of(k)) + "/" + whole[t].name, static_cast<int>(t), k});
  return out;
}

std::vector<hsize_t> dims_of(const ParamInfo& p) { return {p.logical_shape.begin(), p.logical_shape.end()}; }

// Checksum contribution of local elements [begin, begin + n) of p, whose values are x.
template <typename T>
uint64_t checksum_piece(const ParamInfo& p, size_t begin, size_t n, const T* x) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n;) {
    const size_t run = std::min(logical_run(p, begin + i), n - i);
    sum += checksum_run(logical_index(p, begin + i), x + i, run);
    i += run;
  }
  return sum;
}

// Select the union of the blocks in a dataset's space. A 1-D tensor's blocks are columns (c0 0,
// cols 1), so HDF5, reading only the first coordinate of each, selects its rows: its elements.
void select_blocks(hid_t space, const std::vector<LogicalBlock>& blocks) {
  if (blocks.empty()) HDF5_CHECK(H5Sselect_none(space));
  bool first = true;
  for (const LogicalBlock& q : blocks) {
    hsize_t start[2] = {q.r0, q.c0}, count[2] = {q.rows, q.cols};
    HDF5_CHECK(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count, nullptr));
    first = false;
  }
}

// One collective transfer of `n` elements between buf and the rectangles of dataset ds (n = 0:
// this rank takes part with an empty selection). Returns the HDF5 status; counts a transfer that
// HDF5 did not do collectively in `independent`.
herr_t transfer(hid_t ds, hid_t mem_type, const std::vector<LogicalBlock>& rects, void* buf, size_t n, bool write,
                hid_t dxpl, int64_t& independent) {
  Hid fspace(H5Dget_space(ds));
  if (!fspace.valid()) return -1;
  select_blocks(fspace.get(), rects);
  const hsize_t mdim = std::max<size_t>(n, 1);
  Hid mspace(H5Screate_simple(1, &mdim, nullptr));
  if (n == 0) HDF5_CHECK(H5Sselect_none(mspace.get()));
  const herr_t status = write ? H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), dxpl, buf)
                              : H5Dread(ds, mem_type, mspace.get(), fspace.get(), dxpl, buf);
  H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
  if (status >= 0 && H5Pget_mpio_actual_io_mode(dxpl, &mode) >= 0 && mode == H5D_MPIO_NO_COLLECTIVE) ++independent;
  return status;
}

Hid mpio_file_access(MPI_Comm comm) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  HDF5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
  HDF5_CHECK(H5Pset_all_coll_metadata_ops(fapl.get(), true));
  HDF5_CHECK(H5Pset_coll_metadata_write(fapl.get(), true));
  return fapl;
}

Hid collective_transfer() {
  Hid dxpl(H5Pcreate(H5P_DATASET_XFER));
  HDF5_CHECK(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE));
  return dxpl;
}

std::string layout_text(int64_t world, int64_t tp, int64_t pp, int64_t dp, int64_t stage, const std::string& precision) {
  return strprintf("world %lld = tp %lld x pp %lld x dp %lld, ZeRO-%lld, %s", (long long)world, (long long)tp,
                   (long long)pp, (long long)dp, (long long)stage, precision.c_str());
}

}  // namespace

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

// ---------------------------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------------------------

CheckpointIO save_checkpoint(const CheckpointRun& run, const std::string& dir, const TrainingState& st, int keep_last,
                             bool stall_halfway) {
  const auto t0 = Clock::now();
  ProcessGroup& world = *run.groups.world;
  const Config& c = run.config;
  ZeroEngine& engine = run.engine;
  const bool mixed = engine.mixed();
  const std::vector<ParamInfo> whole = gpt_param_table(c.model);
  const std::vector<ParamInfo>& local = engine.layout().tensors;

  // This rank's saved piece of each logical tensor (at most one).
  std::vector<std::optional<Piece>> piece_of(whole.size());
  for (const Piece& p : engine.saved_pieces()) piece_of[local[p.tensor].id] = p;

  const std::string final_path = dir + "/" + strprintf("step_%08lld.h5", static_cast<long long>(st.step));
  const std::string tmp = final_path + ".tmp";
  CheckpointIO io;
  io.file = final_path;

  Hid fapl = mpio_file_access(world.comm());
  Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  HDF5_CHECK(file.get());
  {
    const hid_t f = file.get();
    const Topology& topo = run.groups.topo;
    write_attr(f, "format", std::string("zero3d-checkpoint"));
    write_attr(f, "format_version", static_cast<int64_t>(kCheckpointFormatVersion));
    write_attr(f, "zero3d_version", std::string(ZERO3D_VERSION));
    write_attr(f, "step", st.step);
    write_attr(f, "optimizer_steps", st.optimizer_steps);
    write_attr(f, "data_cursor", static_cast<uint64_t>(st.data_cursor));
    write_attr(f, "seed", static_cast<uint64_t>(c.seed));
    write_attr(f, "world_size", static_cast<int64_t>(topo.world));
    write_attr(f, "tp", static_cast<int64_t>(topo.tp));
    write_attr(f, "pp", static_cast<int64_t>(topo.pp));
    write_attr(f, "dp", static_cast<int64_t>(topo.dp));
    write_attr(f, "zero_stage", static_cast<int64_t>(engine.stage()));
    write_attr(f, "precision", std::string(name_of(c.precision)));
    write_attr(f, "n_layer", static_cast<int64_t>(c.model.n_layer));
    write_attr(f, "n_head", static_cast<int64_t>(c.model.n_head));
    write_attr(f, "d_model", static_cast<int64_t>(c.model.d_model));
    write_attr(f, "vocab_size", static_cast<int64_t>(c.model.vocab_size));
    write_attr(f, "seq_len", static_cast<int64_t>(c.model.seq_len));
    write_attr(f, "config", c.resolved.dump());
    nlohmann::json scaler = {{"dynamic", st.loss_scaler_dynamic},
                             {"scale", st.loss_scaler.scale},
                             {"cur_iter", st.loss_scaler.cur_iter},
                             {"last_overflow_iter", st.loss_scaler.last_overflow_iter},
                             {"cur_hysteresis", st.loss_scaler.cur_hysteresis}};
    write_attr(f, "loss_scaler", scaler.dump());
    nlohmann::json sched = {{"type", name_of(c.scheduler.type)},
                            {"applied_steps", st.optimizer_steps},
                            {"next_lr", lr_for_step(c.scheduler, c.optimizer.lr, st.optimizer_steps + 1)}};
    write_attr(f, "lr_scheduler", sched.dump());
    write_attr(f, "rng", strprintf("counter-based splitmix64 keyed by seed %llu: the seed is the whole state",
                                   static_cast<unsigned long long>(c.seed)));
    write_attr(f, "checksum_algorithm", std::string(kChecksumAlgorithm));
    for (const char* g : {"/model", "/optimizer", "/optimizer/master", "/optimizer/exp_avg", "/optimizer/exp_avg_sq"}) {
      if (!mixed && std::string(g) == "/optimizer/master") continue;
      Hid grp(H5Gcreate2(f, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      HDF5_CHECK(grp.get());
    }
  }

  std::vector<Kind> kinds = {Kind::model};
  if (mixed) kinds.push_back(Kind::master);
  kinds.push_back(Kind::exp_avg);
  kinds.push_back(Kind::exp_avg_sq);
  const std::vector<DatasetSpec> specs = dataset_specs(whole, kinds);
  Hid dxpl = collective_transfer();
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  HDF5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  HDF5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  std::vector<uint64_t> sums(specs.size(), 0);
  std::vector<Hid> datasets;
  std::vector<float> buf;
  std::vector<uint16_t> buf16;
  const auto t_loop = Clock::now();
  for (size_t k = 0; k < specs.size(); ++k) {
    if (stall_halfway && k == specs.size() / 2) {
      log_warn("fault injection: rank stalls in the middle of the checkpoint save of step %lld",
                   static_cast<long long>(st.step));
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const DatasetSpec& spec = specs[k];
    const ParamInfo& info = whole[spec.tensor];
    const bool sixteen = spec.kind == Kind::model && mixed;
    const std::vector<hsize_t> dims = dims_of(info);
    Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    Hid ds(H5Dcreate2(file.get(), spec.path.c_str(), sixteen ? H5T_STD_U16LE : H5T_IEEE_F32LE, space.get(),
                      H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    HDF5_CHECK(ds.get());
    std::vector<LogicalBlock> rects;
    size_t n = 0;
    void* data = nullptr;
    const auto ts = Clock::now();
    if (const auto& p = piece_of[spec.tensor]) {
      const ParamInfo& li = local[p->tensor];
      rects = logical_blocks(li, p->begin, p->size);
      n = p->size;
      if (sixteen) {
        buf16.resize(n);
        engine.read_weights16(*p, buf16.data());
        sums[k] = checksum_piece(li, p->begin, n, buf16.data());
        data = buf16.data();
      } else {
        buf.resize(n);
        engine.read_state(state_of(spec.kind), *p, buf.data());
        sums[k] = checksum_piece(li, p->begin, n, buf.data());
        data = buf.data();
      }
    }
    io.stage_s += seconds_since(ts);
    HDF5_CHECK(transfer(ds.get(), sixteen ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT, rects, data, n, /*write=*/true,
                        dxpl.get(), io.independent));
    if (sixteen) write_attr(ds.get(), "dtype", std::string(engine.dtype16() == Dtype16::fp16 ? "float16" : "bfloat16"));
    io.bytes += info.size * (sixteen ? 2 : 4);
    datasets.push_back(std::move(ds));
  }
  world.all_reduce_sum(sums.data(), sums.size());
  for (size_t k = 0; k < specs.size(); ++k) write_attr(datasets[k].get(), "checksum", sums[k]);
  datasets.clear();
  const auto tc = Clock::now();
  io.transfer_s = std::chrono::duration<double>(tc - t_loop).count() - io.stage_s;
  HDF5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));
  file.reset();  // collective close
  // Every rank's part is in the file (any failure above aborted the job): rank 0 commits.
  if (world.rank() == 0) commit_checkpoint(dir, tmp, final_path, keep_last);
  io.commit_s = world.all_reduce_max(seconds_since(tc));
  io.stage_s = world.all_reduce_max(io.stage_s);
  io.transfer_s = world.all_reduce_max(io.transfer_s);
  io.independent = static_cast<int64_t>(world.all_reduce_sum(static_cast<double>(io.independent)));
  io.seconds = world.all_reduce_max(seconds_since(t0));  // also: nobody goes on before the commit
  return io;
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

namespace {

template <typename T>
T need_attr(hid_t f, const std::string& path, const char* name) {
  T v{};
  if (!read_attr(f, name, v))
    throw UserError(strprintf("checkpoint '%s' has no valid attribute '%s' (not a zero3d checkpoint, or corrupt)",
                              path.c_str(), name));
  return v;
}

LoadedCheckpoint load_file(const CheckpointRun& run, const std::string& path) {
  const auto t0 = Clock::now();
  ProcessGroup& world = *run.groups.world;
  const Config& c = run.config;
  ZeroEngine& engine = run.engine;
  QuietHdf5 quiet;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw UserError(strprintf("checkpoint '%s' does not exist", path.c_str()));

  Hid fapl = mpio_file_access(world.comm());
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!file.valid())
    throw UserError(strprintf("checkpoint '%s' is not a readable HDF5 file (truncated or corrupt?)", path.c_str()));
  const hid_t f = file.get();
  if (need_attr<std::string>(f, path, "format") != "zero3d-checkpoint")
    throw UserError(strprintf("'%s' is an HDF5 file but not a zero3d checkpoint", path.c_str()));
  const int64_t version = need_attr<int64_t>(f, path, "format_version");
  if (version > kCheckpointFormatVersion)
    throw UserError(strprintf("checkpoint '%s' has format version %lld; this zero3d reads up to %d (upgrade zero3d)",
                              path.c_str(), (long long)version, kCheckpointFormatVersion));
  const ModelConfig& m = c.model;
  const std::pair<const char*, int> shape[] = {{"n_layer", m.n_layer}, {"n_head", m.n_head}, {"d_model", m.d_model},
                                               {"vocab_size", m.vocab_size}, {"seq_len", m.seq_len}};
  for (auto [key, want] : shape) {
    const int64_t have = need_attr<int64_t>(f, path, key);
    if (have != want)
      throw UserError(strprintf("checkpoint '%s' holds a model with %s = %lld, but this run's model.%s is %d: the "
                                "model shapes must match",
                                path.c_str(), key, (long long)have, key, want));
  }
  LoadedCheckpoint out;
  TrainingState& st = out.state;
  st.step = need_attr<int64_t>(f, path, "step");
  st.optimizer_steps = need_attr<int64_t>(f, path, "optimizer_steps");
  st.data_cursor = need_attr<uint64_t>(f, path, "data_cursor");
  const std::string precision = need_attr<std::string>(f, path, "precision");
  try {
    const auto j = nlohmann::json::parse(need_attr<std::string>(f, path, "loss_scaler"));
    st.loss_scaler_dynamic = j.at("dynamic").get<bool>();
    st.loss_scaler = {j.at("scale").get<double>(), j.at("cur_iter").get<int64_t>(),
                      j.at("last_overflow_iter").get<int64_t>(), j.at("cur_hysteresis").get<int>()};
  } catch (const nlohmann::json::exception& e) {
    throw UserError(strprintf("checkpoint '%s': attribute 'loss_scaler' is not valid (%s)", path.c_str(), e.what()));
  }
  out.saved_layout = layout_text(need_attr<int64_t>(f, path, "world_size"), need_attr<int64_t>(f, path, "tp"),
                                 need_attr<int64_t>(f, path, "pp"), need_attr<int64_t>(f, path, "dp"),
                                 need_attr<int64_t>(f, path, "zero_stage"), precision);

  // The fp32 master lives in /optimizer/master for 16-bit runs, in /model for fp32 runs.
  const bool mixed_file = precision != "fp32";
  const std::vector<ParamInfo> whole = gpt_param_table(m);
  const std::vector<DatasetSpec> specs =
      dataset_specs(whole, {mixed_file ? Kind::master : Kind::model, Kind::exp_avg, Kind::exp_avg_sq});
  std::vector<Hid> datasets;
  std::vector<uint64_t> stored(specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    const DatasetSpec& spec = specs[k];
    Hid ds = open_checkpoint_dataset(f, path, spec.path);
    Hid space(H5Dget_space(ds.get()));
    Hid type(H5Dget_type(ds.get()));
    const int nd = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(std::max(nd, 0));
    if (nd > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    const std::vector<hsize_t> want = dims_of(whole[spec.tensor]);
    if (dims != want || H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != 4) {
      auto show = [](const std::vector<hsize_t>& d) {
        std::string s;
        for (hsize_t x : d) s += (s.empty() ? "" : " x ") + std::to_string(x);
        return s;
      };
      throw UserError(strprintf("checkpoint '%s': dataset '%s' is %s%s, this model expects float32 %s",
                                path.c_str(), spec.path.c_str(), H5Tget_class(type.get()) == H5T_FLOAT ? "" : "not float, ",
                                show(dims).c_str(), show(want).c_str()));
    }
    if (!read_attr(ds.get(), "checksum", stored[k]))
      throw UserError(strprintf("checkpoint '%s': dataset '%s' has no checksum attribute", path.c_str(),
                                spec.path.c_str()));
    datasets.push_back(std::move(ds));
  }

  // Data: every rank reads its owned pieces collectively, in the same dataset order; a failure is
  // recorded and the rank keeps taking part, so nobody is left in a collective.
  const std::vector<ParamInfo>& local = engine.layout().tensors;
  std::vector<std::optional<Piece>> owned(local.size()), saved(local.size());
  for (const Piece& p : engine.owned_pieces()) owned[p.tensor] = p;
  for (const Piece& p : engine.saved_pieces()) saved[p.tensor] = p;
  std::vector<std::vector<int>> local_of(whole.size());  // logical id -> local tensors (wte twice never on one rank)
  for (size_t t = 0; t < local.size(); ++t) local_of[local[t].id].push_back(static_cast<int>(t));
  Hid dxpl = collective_transfer();
  std::vector<uint64_t> sums(specs.size(), 0);
  std::string error;
  std::vector<float> buf;
  for (size_t k = 0; k < specs.size(); ++k) {
    const DatasetSpec& spec = specs[k];
    std::optional<Piece> p;
    for (int t : local_of[spec.tensor])
      if (owned[t]) p = owned[t];
    std::vector<LogicalBlock> rects;
    if (p) rects = logical_blocks(local[p->tensor], p->begin, p->size);
    buf.resize(p ? p->size : 0);
    const auto tr = Clock::now();
    const herr_t status = transfer(datasets[k].get(), H5T_NATIVE_FLOAT, rects, buf.data(), buf.size(), /*write=*/false, dxpl.get(),
                 out.io.independent);
    const auto ts = Clock::now();
    out.io.transfer_s += std::chrono::duration<double>(ts - tr).count();
    if (status < 0) {
      if (error.empty())
        error = strprintf("checkpoint '%s': reading dataset '%s' failed (corrupt or truncated file)", path.c_str(),
                          spec.path.c_str());
      continue;
    }
    if (!p) continue;
    const ParamInfo& li = local[p->tensor];
    if (const auto& s = saved[p->tensor])  // the part this rank counts: every element once over the grid
      sums[k] = checksum_piece(li, s->begin, s->size, buf.data() + (s->begin - p->begin));
    engine.write_state(state_of(spec.kind), *p, buf.data());
    out.io.stage_s += seconds_since(ts);
  }
  for (const DatasetSpec& spec : specs) out.io.bytes += whole[spec.tensor].size * 4;
  if (world.all_reduce_max(static_cast<int64_t>(!error.empty())) != 0)
    throw UserError(error.empty() ? strprintf("checkpoint '%s': another rank failed to read it", path.c_str()) : error);
  world.all_reduce_sum(sums.data(), sums.size());
  for (size_t k = 0; k < specs.size(); ++k)
    if (sums[k] != stored[k])
      throw UserError(strprintf("checkpoint '%s': dataset '%s' fails its checksum (stored %016llx, data gives "
                                "%016llx): the file is corrupt",
                                path.c_str(), specs[k].path.c_str(), (unsigned long long)stored[k],
                                (unsigned long long)sums[k]));
  engine.finish_load(st.optimizer_steps);
  out.io.file = path;
  out.io.stage_s = world.all_reduce_max(out.io.stage_s);
  out.io.transfer_s = world.all_reduce_max(out.io.transfer_s);
  out.io.independent = static_cast<int64_t>(world.all_reduce_sum(static_cast<double>(out.io.independent)));
  out.io.seconds = world.all_reduce_max(seconds_since(t0));
  return out;
}

// load_file on every rank; a UserError on any rank becomes the same UserError on every rank.
std::optional<LoadedCheckpoint> try_load(const CheckpointRun& run, const std::string& path, std::string& error) {
  std::optional<LoadedCheckpoint> out;
  error.clear();
  try {
    run.groups.world->agree([&] { out = load_file(run, path); });
  } catch (const UserError& e) {  // the lowest failing rank's message, on every rank
    error = e.what();
    return std::nullopt;
  }
  return out;
}

}  // namespace

std::optional<LoadedCheckpoint> load_checkpoint(const CheckpointRun& run, LoadMode mode, const std::string& path,
                                                const std::string& dir) {
  if (mode == LoadMode::none) return std::nullopt;
  std::string error;
  if (mode == LoadMode::path) {
    auto loaded = try_load(run, checkpoint_file(path), error);
    if (!loaded) throw UserError(error);
    return loaded;
  }
  // auto: latest first, then the committed checkpoints older than it, newest first.
  std::vector<std::string> candidates;
  int64_t newest = INT64_MAX;
  if (const std::string name = read_latest(dir); !name.empty()) {
    candidates.push_back(dir + "/" + name);
    newest = step_of(name) >= 0 ? step_of(name) : INT64_MAX;
  }
  for (const std::string& c : list_checkpoints(dir))
    if (step_of(c) < newest) candidates.push_back(c);
  if (candidates.empty()) return std::nullopt;
  std::string errors;
  const bool root = run.groups.world->rank() == 0;
  for (const std::string& c : candidates) {
    auto loaded = try_load(run, c, error);
    if (loaded) {
      if (!errors.empty() && root) log_warn("checkpoint: fell back to '%s'", c.c_str());
      return loaded;
    }
    if (root) log_warn("checkpoint: %s; trying an older one", error.c_str());
    errors += "\n  " + error;
  }
  throw UserError(strprintf("checkpoint.load = auto: no checkpoint in '%s' loads:%s", dir.c_str(), errors.c_str()));
}

}  // namespace zero3d
