// The ZeRO engine in process, without the model, verifiable on every rank (nccl-tests style):
// for every stage x precision x reduce_scatter x overlap_comm x persistence, two micro-batches of
// synthetic gradients go through the ParamStore protocol in the model's order, then one step.
// - Gradients are small integers times 2^-10, so every sum (over micro-batches, over ranks, in
//   fp32 or 16 bits) is exact whatever the reduction order: each rank's parameters must then equal,
//   bit for bit, one AdamW step of a single-process reference on the summed gradient (mixed
//   precision: the 16-bit rounding of that reference).
// - The gradient norm counts every element once: equal to the reference's within 1e-9.
// - The checkpoint pieces: save_pieces() of all ranks tile every tensor exactly once,
//   load_pieces() once per rank at stage 0 and exactly once over the group from stage 1 on; the
//   runs each rank counts in the checksums cover every logical element exactly once, for both.
// - Every acquired unit's bf16 copy (bf16 runs only) widens to its fp32 parameters bit for bit.
// - Offload: with the optimizer state (and, at stage 3, the parameter slices) in swap files, small
//   sub-groups, few buffers and ratio < 1, three steps give bitwise the same parameters, norms and
//   optimizer state as the same engine in memory; so does an offloaded engine loaded from the
//   in-memory one's state (a resume), one step later. The same with the engine on device memory
//   (the walled backend) and its optimizer state in host memory or a swap file, updated on the CPU.
// Failures are summed over the world into the exit code.
// usage: mpirun -np N test_zero_engine
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/host/gemm.h"  // onednn_has_bf16
#include "kernels/math/dtype.h"
#include "model/init_weights.h"
#include "model/param_store.h"
#include "optim/adamw.h"
#include "zero/engine.h"

using namespace zero3d;

namespace {

int failures = 0, checks = 0, world_rank = 0;

void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: FAIL %s\n", world_rank, what.c_str());
  }
}

ModelConfig tiny() {
  ModelConfig m;
  m.vocab_size = 64, m.seq_len = 16, m.n_layer = 2, m.n_head = 2, m.d_model = 32;
  return m;
}

// Rank r's gradient of element k of tensor t in micro-batch mb: an integer in [-6, 6] times 2^-10.
float grad_of(int r, int t, size_t k, int mb) {
  return static_cast<float>(static_cast<int>((r * 7 + t * 5 + k * 3 + mb * 11) % 13) - 6) * 0x1p-10f;
}

// Adds this rank's synthetic gradient of every tensor of `unit` into its gradient buffer.
void add_grads(const FlatLayout& L, int unit, float* g, int r, int mb) {
  const Unit& u = L.units[unit];
  for (size_t t = 0; t < L.tensors.size(); ++t) {
    const ParamInfo& p = L.tensors[t];
    if (p.unit != unit) continue;
    for (size_t k = 0; k < p.size; ++k) g[p.offset - u.offset + k] += grad_of(r, static_cast<int>(t), k, mb);
  }
}

// add_grads on a unit's gradient in the backend's memory (device memory: through the host).
void add_unit_grads(Backend& be, const FlatLayout& L, int unit, float* g, int r, int mb) {
  std::vector<float> h(L.units[unit].size);
  be.copy_to_host(h.data(), g, h.size() * sizeof(float));
  add_grads(L, unit, h.data(), r, mb);
  be.copy_from_host(g, h.data(), h.size() * sizeof(float));
}

// One micro-batch through the ParamStore protocol in the order GPT::forward/backward use it
// (one pipeline stage): the head's gradients are taken in forward, unit 0 stays acquired to the end.
// Every acquire also checks the unit's bf16 copy (ParamStore::acquired_bf16), where the store
// lends one: widened, its bits are those of the fp32 parameters (the gemm_only tensors' only
// where the store widens those). Counted here per micro-batch.
int bf16_copies = 0;

void micro_batch(ParamStore& s, int r, int mb, Backend* device = nullptr) {
  auto add = [&](int unit, float* g) {
    if (device) add_unit_grads(*device, s.layout(), unit, g, r, mb);
    else add_grads(s.layout(), unit, g, r, mb);
  };
  const FlatLayout& L = s.layout();
  auto acquire = [&](int unit) {
    const float* p = s.acquire_params(unit);
    const uint16_t* p16 = s.acquired_bf16(unit);
    if (!p16) return;
    ++bf16_copies;
    const size_t n = L.units[unit].size;
    std::vector<float> f(n);
    std::vector<uint16_t> h(n);
    if (device) {
      device->copy_to_host(f.data(), p, n * sizeof(float));
      device->copy_to_host(h.data(), p16, n * sizeof(uint16_t));
    } else {
      std::memcpy(f.data(), p, n * sizeof(float));
      std::memcpy(h.data(), p16, n * sizeof(uint16_t));
    }
    bool same = true;
    for (const ParamInfo& t : L.tensors) {
      if (t.unit != unit || (t.gemm_only && !s.fp32_gemm_weights())) continue;
      const size_t at = t.offset - L.units[unit].offset;
      for (size_t k = at; k < at + t.size; ++k)
        same &= math::float_bits(math::float_from_bf16(h[k])) == math::float_bits(f[k]);
    }
    check(same, "unit " + std::to_string(unit) + ": its bf16 copy widens to its fp32 parameters");
  };
  const int last = static_cast<int>(L.units.size()) - 1;
  acquire(0);
  for (int u = 1; u < last; ++u) acquire(u), s.release_params(u);
  acquire(last);
  float* dfinal = s.acquire_grads(last);
  float* demb = s.acquire_grads(0);
  s.release_params(last);
  s.release_params(0);
  acquire(last);
  add(last, dfinal);
  s.grads_done(last);
  s.release_params(last);
  for (int u = last - 1; u >= 1; --u) {
    acquire(u);
    add(u, s.acquire_grads(u));
    s.grads_done(u);
    s.release_params(u);
  }
  add(0, demb);
  s.grads_done(0);
}

float round16(float x, Dtype16 t) {
  return t == Dtype16::fp16 ? math::float_from_fp16(math::fp16_from_float(x))
                            : math::float_from_bf16(math::bf16_from_float(x));
}

// Every element of every tensor covered `want` times by the triples (tensor, begin, size) of all ranks.
void check_cover(const FlatLayout& L, std::vector<uint64_t> flat, ProcessGroup& world, int want,
                 const std::string& what) {
  std::vector<uint64_t> all;
  std::vector<uint64_t> counts;
  world.all_gather_u64({flat.size()}, counts);
  size_t longest = 0;
  for (uint64_t c : counts) longest = std::max<size_t>(longest, c);
  flat.resize(longest, ~uint64_t{0});  // pad so every rank sends the same count
  world.all_gather_u64(flat, all);
  std::vector<std::vector<int>> cover(L.tensors.size());
  for (size_t t = 0; t < L.tensors.size(); ++t) cover[t].assign(L.tensors[t].size, 0);
  for (size_t i = 0; i + 2 < all.size(); i += 3) {
    if (all[i] == ~uint64_t{0}) continue;
    for (size_t k = all[i + 1]; k < all[i + 1] + all[i + 2]; ++k) ++cover[all[i]][k];
  }
  bool ok = true;
  for (const auto& c : cover)
    for (int n : c) ok &= n == want;
  check(ok, what);
}

// The pieces' local elements, then (once over the group) the logical runs they count in checksums.
// Without tensor parallelism a tensor's logical and local elements are the same, and its logical
// id is its index.
void check_tiling(const FlatLayout& L, const std::vector<CheckpointPiece>& mine, ProcessGroup& world, int want,
                  const std::string& what) {
  std::vector<uint64_t> pieces, runs;
  for (const CheckpointPiece& p : mine) {
    check(p.tensor == L.tensors[p.piece.tensor].id, what + ": logical id");
    pieces.insert(pieces.end(), {uint64_t(p.piece.tensor), p.piece.begin, p.piece.size});
    for (const LogicalRun& r : p.counted) runs.insert(runs.end(), {uint64_t(p.tensor), r.first, r.n});
  }
  check_cover(L, pieces, world, want, what);
  check_cover(L, runs, world, 1, what + ": checksum runs count every element once");
}

void run_case(Backend& be, ProcessGroup& world, int stage, Precision precision, bool reduce_scatter, bool overlap,
              int64_t persistence) {
  const ModelConfig m = tiny();
  ZeroConfig z;
  z.stage = stage, z.reduce_scatter = reduce_scatter, z.overlap_comm = overlap;
  z.reduce_bucket_size = z.allgather_bucket_size = 3000;  // several buckets per block
  z.stage3_param_persistence_threshold = persistence;
  z.stage3_max_live_parameters = 1;  // the fewest slots: gathers and releases all the time
  OptimizerConfig opt;
  opt.weight_decay = 0.1;
  const std::string name = "stage " + std::to_string(stage) + " " + name_of(precision) +
                           (reduce_scatter ? " reduce_scatter" : " all-reduce") + (overlap ? " overlap" : "") +
                           " persist<" + std::to_string(persistence);
  const int p = world.size();
  const uint64_t seed = 99;
  const double lr = 1e-3;

  ZeroEngine engine(be, world, m, z, opt, precision);
  engine.init_weights(seed);
  engine.begin_step(2);
  bf16_copies = 0;
  for (int mb = 0; mb < 2; ++mb) micro_batch(engine, world.rank(), mb);
  check((bf16_copies > 0) == (precision == Precision::bf16), name + ": bf16 copies lent in bf16 runs only");
  check(engine.fp32_gemm_weights() == !(precision == Precision::bf16 && be.bf16_gemm()),
        name + ": the matrices stay bf16 only with bf16 GEMMs on bf16 weights");
  engine.finish_gradients();
  const double norm_sq = engine.grad_norm_sq();
  engine.optimizer_step(lr);
  engine.gather_updated_params();

  // The single-process reference: the same initial weights, the sum of every rank's gradients.
  const FlatLayout ref = make_flat_layout(gpt_param_table(m), 1, size_t(1) << 30);
  std::vector<float> params(ref.total), grads(ref.total, 0.0f);
  gpt_initial_params(ref, m.n_layer, seed, 0, ref.total, params.data());
  double want_sq = 0;
  std::vector<DecaySegment> segments;
  size_t at = 0;
  for (size_t t = 0; t < ref.tensors.size(); ++t) {
    const ParamInfo& q = ref.tensors[t];
    if (q.offset > at) segments.push_back({at, q.offset - at, false});
    segments.push_back({q.offset, q.size, q.decay});
    at = q.offset + q.size;
    for (size_t k = 0; k < q.size; ++k) {
      float g = 0;
      for (int r = 0; r < p; ++r)
        for (int mb = 0; mb < 2; ++mb) g += grad_of(r, static_cast<int>(t), k, mb);
      grads[q.offset + k] = g;
      want_sq += static_cast<double>(g) * g;
    }
  }
  if (ref.total > at) segments.push_back({at, ref.total - at, false});
  DeviceBuffer<float> dparams(be, ref.total), dgrads(be, ref.total);
  be.copy_from_host(dparams.data(), params.data(), ref.total * sizeof(float));
  be.copy_from_host(dgrads.data(), grads.data(), ref.total * sizeof(float));
  AdamW adam(be, opt, ref.total);
  adam.step(dparams.data(), dgrads.data(), lr, segments);
  be.copy_to_host(params.data(), dparams.data(), ref.total * sizeof(float));

  check(std::fabs(norm_sq - want_sq) <= 1e-9 * want_sq,
        name + ": gradient norm^2 " + std::to_string(norm_sq) + " vs " + std::to_string(want_sq));
  const FlatLayout& L = engine.layout();
  size_t differ = 0;
  for (int u = 0; u < static_cast<int>(L.units.size()); ++u) {
    const float* w = engine.acquire_params(u);
    const uint16_t* w16 = engine.acquired_bf16(u);  // the matrices' only copy with bf16 GEMMs
    for (size_t t = 0; t < L.tensors.size(); ++t) {
      const ParamInfo& q = L.tensors[t];
      if (q.unit != u) continue;
      for (size_t k = 0; k < q.size; ++k) {
        float want = params[ref.tensors[t].offset + k];
        if (precision != Precision::fp32) want = round16(want, engine.dtype16());
        const size_t i = q.offset - L.units[u].offset + k;
        const float got = q.gemm_only && !engine.fp32_gemm_weights() ? math::float_from_bf16(w16[i]) : w[i];
        differ += std::memcmp(&got, &want, sizeof got) != 0;
      }
    }
    engine.release_params(u);
  }
  check(differ == 0, name + ": " + std::to_string(differ) + " parameters differ from the reference");
  check_tiling(L, engine.save_pieces(), world, 1, name + ": save pieces tile every tensor once");
  check_tiling(L, engine.load_pieces(), world, stage == 0 ? p : 1, name + ": load pieces");
}

// Everything a step leaves behind on this rank, as bytes: the parameters the model reads (unit
// by unit), and the optimizer state of every owned piece.
std::vector<float> snapshot(ZeroEngine& e, Backend& be) {
  std::vector<float> out;
  const FlatLayout& L = e.layout();
  for (int u = 0; u < static_cast<int>(L.units.size()); ++u) {
    std::vector<float> w(L.units[u].size);
    be.copy_to_host(w.data(), e.acquire_params(u), w.size() * sizeof(float));
    out.insert(out.end(), w.begin(), w.end());
    e.release_params(u);
  }
  for (const CheckpointPiece& p : e.load_pieces())
    for (auto kind : {ZeroEngine::State::master, ZeroEngine::State::exp_avg, ZeroEngine::State::exp_avg_sq}) {
      std::vector<float> v(p.piece.size);
      e.read_state(kind, p.piece, v.data());
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

double one_step(ZeroEngine& e, int rank, double lr, Backend* device = nullptr) {
  e.begin_step(2);
  for (int mb = 0; mb < 2; ++mb) micro_batch(e, rank, mb, device);
  e.finish_gradients();
  const double norm_sq = e.grad_norm_sq();
  e.optimizer_step(lr);
  e.gather_updated_params();
  return norm_sq;
}

// The in-memory engine on `be` against the same engine with its optimizer state offloaded to
// `where` (and stage 3's slices to `params`) on `off_be`: the host backend, or the
// walled backend whose "device" memory the host cannot touch (then the state is in host memory
// and Adam runs on the CPU, zero/host_link.h).
void run_offload_case(Backend& be, Backend& off_be, ProcessGroup& world, int stage, Precision precision,
                      OffloadDevice where, OffloadDevice params, double ratio, const std::string& dir) {
  const bool device = off_be.memory_kind() == MemKind::device;
  Backend* dev = device ? &off_be : nullptr;
  const ModelConfig m = tiny();
  ZeroConfig z;
  z.stage = stage, z.overlap_comm = true;
  z.reduce_bucket_size = z.allgather_bucket_size = 3000;
  z.stage3_param_persistence_threshold = 100;  // some persistent buckets beside the swapped slices
  z.stage3_max_live_parameters = 1;
  OptimizerConfig opt;
  opt.weight_decay = 0.1;
  ZeroConfig off = z;
  off.sub_group_size = 2000;  // several sub-groups: rounded up to 2048 elements when swapped
  off.offload_optimizer = {where, dir, 3, ratio};
  off.offload_param = {params, dir, 3, 1.0};
  SwapFiles swap;
  if (where == OffloadDevice::nvme) swap.optimizer = dir + "/optimizer." + std::to_string(world.rank());
  if (params == OffloadDevice::nvme) swap.param = dir + "/param." + std::to_string(world.rank());
  swap.aio.block_size = 8192;  // several blocks per transfer
  swap.aio.thread_count = 2;
  std::filesystem::create_directories(dir);  // the last swap file out removes it
  const std::string name = std::string(device ? "device " : "") + "offload " +
                           (where == OffloadDevice::nvme ? "nvme" : "cpu") + " stage " + std::to_string(stage) + " " +
                           name_of(precision) + (params == OffloadDevice::nvme  ? " +params nvme"
                                                  : params == OffloadDevice::cpu ? " +params cpu"
                                                                                 : "") +
                           " ratio " + std::to_string(ratio);
  ZeroEngine mem(be, world, m, z, opt, precision);
  ZeroEngine swapped(off_be, world, m, off, opt, precision, 1, 0, 1, 0, swap);
  if (where == OffloadDevice::nvme) check(swapped.memory().swapped > 0, name + ": something is swapped");
  if (device) check(swapped.memory().host > 0, name + ": the state is in host memory");
  check(swapped.memory().optimizer < mem.memory().optimizer, name + ": less optimizer state in memory");
  mem.init_weights(7);
  swapped.init_weights(7);
  check(snapshot(mem, be) == snapshot(swapped, off_be), name + ": initial state");
  for (int step = 1; step <= 3; ++step) {
    const double a = one_step(mem, world.rank(), 1e-3 * step);
    bf16_copies = 0;
    const double b = one_step(swapped, world.rank(), 1e-3 * step, dev);
    check((bf16_copies > 0) == (precision == Precision::bf16), name + ": bf16 copies lent in bf16 runs only");
    check(a == b, name + ": gradient norm at step " + std::to_string(step));
    check(snapshot(mem, be) == snapshot(swapped, off_be), name + ": parameters and state after step " + std::to_string(step));
  }
  // A resume: the in-memory engine's state loaded into a fresh offloaded one.
  ZeroEngine resumed(off_be, world, m, off, opt, precision, 1, 0, 1, 0, swap);
  for (const CheckpointPiece& p : mem.load_pieces())
    for (auto kind : {ZeroEngine::State::master, ZeroEngine::State::exp_avg, ZeroEngine::State::exp_avg_sq}) {
      std::vector<float> v(p.piece.size);
      mem.read_state(kind, p.piece, v.data());
      resumed.write_state(kind, p.piece, v.data());
    }
  resumed.finish_load(mem.optimizer_steps());
  check(snapshot(mem, be) == snapshot(resumed, off_be), name + ": loaded state");
  one_step(mem, world.rank(), 5e-3);
  one_step(resumed, world.rank(), 5e-3, dev);
  check(snapshot(mem, be) == snapshot(resumed, off_be), name + ": a step after the load");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  {
    auto be = make_host_backend();
    // Every collective through the node's shared memory, whatever its size (the collectives test
    // holds it against MPI's; the training tests run the default mix).
    comm_context().collectives = CollectiveImpl::shm;
    comm_context().shm_chunk_bytes = 4096;  // many rounds per bucket
    auto world = ProcessGroup::world();
    for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16})
      for (int stage = 0; stage <= 3; ++stage)
        for (bool rs : {true, false})
          for (bool overlap : {false, true})
            for (int64_t persist : {int64_t{0}, int64_t{1000}}) {
              if (stage < 3 && persist != 0) continue;  // persistence is a stage-3 notion
              run_case(*be, *world, stage, precision, rs, overlap, persist);
            }
    // bf16 GEMMs: the matrices are lent in bf16 only (never widened); the rest as before.
    if (onednn_has_bf16()) {
      HostOptions bf16_gemm;
      bf16_gemm.bf16_gemm = true;
      auto be16 = make_host_backend(bf16_gemm);
      for (int stage = 0; stage <= 3; ++stage) run_case(*be16, *world, stage, Precision::bf16, true, true, stage == 3 ? 1000 : 0);
    }
    // Offload: swap files in a directory of this rank's.
    char tmpl[] = "/tmp/zero3d_offload_XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (int stage = 1; stage <= 3; ++stage)
        for (bool params_too : {false, true})
          for (double ratio : {1.0, 0.5}) {
            if (params_too && (stage != 3 || ratio != 1.0)) continue;
            run_offload_case(*be, *be, *world, stage, precision, OffloadDevice::nvme,
                             params_too ? OffloadDevice::nvme : OffloadDevice::none, ratio, dir);
          }
    run_offload_case(*be, *be, *world, 3, Precision::fp16, OffloadDevice::nvme, OffloadDevice::nvme, 1.0, dir);
    // Offload from device memory: the walled backend's, staged by the collectives as a GPU's.
    auto walled = make_walled_backend();
    world->use_device_memory(walled->device_memory(), false);
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (int stage = 1; stage <= 3; ++stage) {
        run_offload_case(*be, *walled, *world, stage, precision, OffloadDevice::cpu, OffloadDevice::none, 1.0, dir);
        run_offload_case(*be, *walled, *world, stage, precision, OffloadDevice::nvme, OffloadDevice::none, 0.5, dir);
      }
    for (Precision precision : {Precision::fp32, Precision::bf16})
      for (OffloadDevice params : {OffloadDevice::cpu, OffloadDevice::nvme})
        run_offload_case(*be, *walled, *world, 3, precision, OffloadDevice::cpu, params, 1.0, dir);
    world->use_device_memory(nullptr, false);
    std::error_code ec;
    check(!std::filesystem::exists(dir, ec), "swap files (and their directory) removed with their engines");
    std::filesystem::remove_all(dir, ec);
  }
  int total = failures, all_checks = checks;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &all_checks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0) std::printf("zero engine: %d checks, %d failed\n", all_checks, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
