// app/bench.cpp: zero3d bench gemm, kernels, io, comm and machine: the command lines of the
// measurements in src/bench/.
#include <filesystem>
#include <memory>
#include <optional>

#include "app/commands.h"
#include "bench/comm.h"
#include "bench/gemm.h"
#include "bench/kernels.h"
#include "bench/machine.h"
#include "bench/rates.h"
#include "config/config.h"
#include "config/presets.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/job.h"
#include "storage/checks.h"

namespace zero3d {

namespace {

const char* kBenchUsage =
    "usage: zero3d bench gemm [--sizes N,N,...] [--seconds S] [--config FILE] [--backend NAME]\n"
    "       zero3d bench kernels [--config FILE] [--seconds S] [--levels LIST | --backend NAME]\n"
    "       zero3d bench io [--dir DIR] [--bytes N]\n"
    "       zero3d bench comm [--min-bytes N] [--max-bytes N] [--factor F] [--iters N] [--ops LIST] [--types LIST]\n"
    "                         [--group N]\n"
    "       zero3d bench machine [--out FILE] [--seconds S] [--nvme-path DIR]\n"
    "  gemm: the GEMM rates a training run gets. Names the CPU, the ISA level of the host loops, the\n"
    "        GEMM libraries and the ISA they run, measures one thread's FMA peak, then GFLOP/s per\n"
    "        square size N (C = A B^T; default 512,1024,2048,4096; at least S seconds each, default 1)\n"
    "        and per GEMM of one training micro-batch of the model in FILE (default\n"
    "        input/bench-cpu.json when it exists): every linear layer's forward (fwd), input\n"
    "        gradient (dx) and weight gradient (dW), and the fused causal attention (S/4 seconds a\n"
    "        cell). Columns: zero3d (what training runs: compute.gemm=auto), onednn, cblas (the CBLAS\n"
    "        linked in) and bf16 (oneDNN; inputs rounded to bf16, fp32 accumulation). Under mpirun\n"
    "        every rank measures at once (a node's load) and rank 0 prints its own rates.\n"
    "  kernels: every host kernel of a training step at one micro-batch of FILE's model (default\n"
    "        input/bench-cpu.json when it exists, else the bench-cpu preset), at each ISA level of\n"
    "        LIST (default: every level this CPU runs, e.g. avx512,avx2,sse2): its rate and that\n"
    "        rate against its bound, FLOPs / the level's FMA peak (attention) or bytes / the copy\n"
    "        bandwidth (the rest; over 100%: the data stayed in cache); GELU and the cross-entropy's\n"
    "        softmax need an exp per element, and where the level's exp rate is the slower roof the\n"
    "        cell is against that and marked *. S seconds per cell (0.3). With --backend NAME (host,\n"
    "        cuda, kokkos, auto; or FILE's compute.backend, when not host or auto) every kernel and GEMM\n"
    "        of that micro-batch on that backend instead (cuda: in\n"
    "        bf16, attention through cuDNN where it loads): time per call, TFLOP/s against the\n"
    "        device's peak (a known GPU's dense bf16 peak) or GB/s against its copy bandwidth.\n"
    "  io:   collective MPI-IO write rate of N bytes (default 1 GiB) over all ranks into a new file in\n"
    "        DIR (default .), synced to disk: the raw baseline for the checkpoint bandwidth.\n"
    "  comm: the collectives, nccl-tests style: for each of LIST (default all_reduce,reduce_scatter,\n"
    "        all_gather) and type (default float,bf16; also half), sizes from --min-bytes (1024) to\n"
    "        --max-bytes (268435456), each F (4) times the last: time per call, algbw and busbw (GB/s),\n"
    "        and the wrong elements summed over the ranks, through MPI and through shared memory side by\n"
    "        side (shared memory twice: on private buffers, two copies, and on comm buffers the other\n"
    "        ranks read in place, one copy, as training's), with the memcpy rate of the same run and the\n"
    "        size from which shared memory (comm buffers) wins (set\n"
    "        comm.shm_min_bytes to it). --group N: groups of N consecutive ranks at once. --chunk-bytes:\n"
    "        the shared-memory pipelining grain (comm.shm_chunk_bytes). --iters N: N calls a size (default:\n"
    "        as many as move 2 GB, 3 to 1000). Exit 1 on any wrong element.\n"
    "  machine: the rates zero3d plan --machine prices a layout with, every rank measuring at once (run\n"
    "        it with the ranks per node a job will use, on one node or more): GEMM FLOP/s at GPT-2 block\n"
    "        shapes, the fused attention's FLOP/s, copy bandwidth, AdamW's bytes/s, each collective's\n"
    "        latency and bus bandwidth over a node's ranks (from 64 KiB and 32 MiB) and, on more than one\n"
    "        node, over all of them (the inter-node rates); with --nvme-path, the rates a rank writes and reads\n"
    "        swap files there (256 MiB a rank, as offload to nvme drives them); into FILE (default machine.json).\n";

// zero3d bench io [--dir DIR] [--bytes N]
int bench_io_command(const Args& a) {
  std::string dir = ".";
  uint64_t bytes = uint64_t{1} << 30;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--dir") dir = option_value(a, i, kBenchUsage);
    else if (a[i] == "--bytes") bytes = parse_bytes(option_value(a, i, kBenchUsage), "--bytes");
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  auto world = ProcessGroup::world();
  const double t = measure_collective_write(world->comm(), dir, bytes);
  log_info("# collective MPI-IO write + sync, %d ranks, %s\n%llu bytes in %.3f s: %.1f MB/s", world->size(),
           dir.c_str(), (unsigned long long)bytes, t, static_cast<double>(bytes) / t / 1e6);
  return 0;
}

// zero3d bench comm [options]: exit 1 on any wrong element.
int bench_comm_command(const Args& a) {
  CommBenchOptions o;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--min-bytes") o.min_bytes = parse_bytes(option_value(a, i, kBenchUsage), "--min-bytes");
    else if (a[i] == "--max-bytes") o.max_bytes = parse_bytes(option_value(a, i, kBenchUsage), "--max-bytes");
    else if (a[i] == "--factor") o.factor = parse_positive(option_value(a, i, kBenchUsage), "--factor");
    else if (a[i] == "--chunk-bytes") o.chunk_bytes = parse_bytes(option_value(a, i, kBenchUsage), "--chunk-bytes");
    else if (a[i] == "--iters") o.iters = static_cast<int>(parse_whole(option_value(a, i, kBenchUsage), "--iters", 1, 1000000));
    else if (a[i] == "--group") o.group_size = static_cast<int>(parse_whole(option_value(a, i, kBenchUsage), "--group", 1, kMaxRanks));
    else if (a[i] == "--ops") o.ops = split_commas(option_value(a, i, kBenchUsage));
    else if (a[i] == "--types") o.types = split_commas(option_value(a, i, kBenchUsage));
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  if (o.factor <= 1) throw UserError("bench comm: --factor must be above 1");
  return bench_comm(o) == 0 ? 0 : 1;
}

// --config's model (a file or a preset's name, config/presets.h), read as a one-rank, stage-0 run.
Config bench_config(const std::string& arg) {
  ConfigSources src;
  set_config_file(src, arg);
  src.overrides = {"zero_optimization.stage=0", "pipeline_parallel.pp_size=1"};
  return load_config(src, 1);
}

// zero3d bench kernels [--config FILE] [--seconds S] [--levels LIST | --backend NAME]
int bench_kernels_command(const Args& a) {
  // The source tree's when run from it, else the preset of this binary's tree (config/presets.h).
  std::string config = std::filesystem::exists("input/bench-cpu.json") ? "input/bench-cpu.json" : "bench-cpu";
  std::string backend;
  double seconds = 0.3;
  std::vector<std::string> levels;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--config") config = option_value(a, i, kBenchUsage);
    else if (a[i] == "--seconds") seconds = parse_positive(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--levels") levels = split_commas(option_value(a, i, kBenchUsage));
    else if (a[i] == "--backend") backend = option_value(a, i, kBenchUsage);
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  if (!backend.empty() && !levels.empty())
    throw UserError("bench kernels: --levels picks the host's ISA levels, --backend one backend: give one of them");
  const Config cfg = bench_config(config);
  // A config whose compute.backend names a backend other than the host's benches that one.
  if (backend.empty() && levels.empty() && cfg.compute.backend != "auto" && cfg.compute.backend != "host")
    backend = cfg.compute.backend;
  if (backend.empty()) {
    bench_kernels(cfg.model, cfg.train_micro_batch_size_per_gpu, config, seconds, levels);
    return 0;
  }
  auto world = ProcessGroup::world();
  const JobInfo job = job_info(*world);
  HostOptions host;
  host.bf16_gemm = backend_is_cuda(backend);  // a GPU's bf16 runs: bf16 GEMMs, cuDNN's attention
  std::unique_ptr<Backend> be = make_backend(backend, job.local_rank, host);
  const PeakFlops peak = mfu_peak(*be, world.get(), job.compute_cores);
  bench_backend_kernels(*be, peak, cfg.model, cfg.train_micro_batch_size_per_gpu, config, seconds);
  return 0;
}

// zero3d bench gemm [--sizes N,N,...] [--seconds S] [--config FILE] [--backend NAME]: on a host
// backend every library side by side (bench_host_gemm), on a device its sgemm alone.
int bench_gemm_command(const Args& a) {
  std::vector<int> sizes = {512, 1024, 2048, 4096};
  double seconds = 1.0;
  std::string backend, config;  // backend: --backend, else the config's compute.backend
  if (FILE* f = std::fopen("input/bench-cpu.json", "r")) {
    std::fclose(f);
    config = "input/bench-cpu.json";
  }
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--seconds") seconds = parse_positive(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--backend") backend = option_value(a, i, kBenchUsage);
    else if (a[i] == "--config") config = option_value(a, i, kBenchUsage);
    else if (a[i] == "--sizes") {
      sizes.clear();
      for (const std::string& item : split_commas(option_value(a, i, kBenchUsage)))
        sizes.push_back(static_cast<int>(parse_whole(item, "each of --sizes", 1, 1 << 16)));
    } else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  auto world = ProcessGroup::world();
  const JobInfo job = job_info(*world);
  std::optional<Config> cfg;
  if (!config.empty()) cfg = bench_config(config);
  backend = (cfg ? cfg->compute : ComputeConfig{}).backend_for(backend);  // no config: the key's default
  std::unique_ptr<Backend> be = make_backend(backend, job.local_rank);
  if (be->kind() != BackendKind::host) {
    log_info("# GEMM C = A B^T, fp32, %s", be->describe().c_str());
    log_info("%8s %12s %12s", "n", "ms/call", "GFLOP/s");
    for (int n : sizes) {
      GemmRate r = measure_gemm(*be, n, n, n, seconds);
      log_info("%8d %12.3f %12.1f", n, r.seconds_per_call * 1e3, r.flops_per_s / 1e9);
    }
    return 0;
  }
  bench_host_gemm(sizes, seconds, cfg ? &*cfg : nullptr, config, job, world->size());
  return 0;
}

// zero3d bench machine: the rates zero3d plan --machine prices a layout's work with, measured by
// every rank at once (within a node, and between nodes when there are several), into a JSON file.
int bench_machine_command(const Args& a) {
  std::string out = "machine.json", nvme_path;
  double seconds = 2;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out") out = option_value(a, i, kBenchUsage);
    else if (a[i] == "--seconds") seconds = parse_positive(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--nvme-path") nvme_path = option_value(a, i, kBenchUsage);
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  auto world = ProcessGroup::world();
  const std::string dir = std::filesystem::absolute(out).parent_path().string();
  // Bad paths before minutes of measuring: the output's directory and the output itself
  // (measure_machine checks --nvme-path before it measures).
  if (const std::string e = probe_writable(dir, world->rank()); !e.empty())
    throw UserError(strprintf("bench machine --out '%s': cannot write in '%s': %s", out.c_str(), dir.c_str(), e.c_str()));
  output_file_path(out, "machine file");
  const JobInfo job = job_info(*world);
  std::unique_ptr<Backend> be = make_backend("auto", job.local_rank);
  const MachineRates m = measure_machine(*be, seconds, nvme_path);
  if (world->rank() != 0) return 0;
  save_machine(m, out);
  std::string links;
  for (const auto& [op, l] : m.collectives)
    links += strprintf("; %s %.1f us + bytes / %.2f GB/s", op.c_str(), l.latency_s * 1e6, l.busbw / 1e9);
  for (const auto& [op, l] : m.inter_node.collectives)
    links += strprintf("; between nodes %s %.1f us + bytes / %.2f GB/s", op.c_str(), l.latency_s * 1e6, l.busbw / 1e9);
  log_info("zero3d bench machine: %s, %d rank(s) a node: GEMM %.1f GFLOP/s, attention %.1f GFLOP/s, copy %.2f GB/s, "
           "AdamW %.2f GB/s a rank%s%s; written to %s",
           m.name.c_str(), m.ranks_per_node, m.gemm_flops / 1e9, m.attention_flops / 1e9, m.copy_bytes / 1e9,
           m.adam_bytes / 1e9, links.c_str(),
           nvme_path.empty() ? ""
                             : strprintf("; swap files under %s: write %.2f GB/s, read %.2f GB/s a rank", nvme_path.c_str(),
                                         m.nvme_write_bytes / 1e9, m.nvme_read_bytes / 1e9).c_str(),
           out.c_str());
  return 0;
}

}  // namespace

int cmd_bench(const Args& a) {
  if (const std::optional<int> rc = usage_exit(a, kBenchUsage)) return *rc;
  if (a[0] == "io") return bench_io_command(a);
  if (a[0] == "comm") return bench_comm_command(a);
  if (a[0] == "kernels") return bench_kernels_command(a);
  if (a[0] == "machine") return bench_machine_command(a);
  if (a[0] != "gemm") throw UserError(strprintf("unknown bench '%s'\n%s", a[0].c_str(), kBenchUsage));
  return bench_gemm_command(a);
}

}  // namespace zero3d
