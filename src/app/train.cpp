// app/train.cpp: zero3d train. The one place that builds a run from its command line: the config
// resolved for the world, the process groups and the watchdog, the backend, the GEMM precision and
// the MFU peak, the memory check, then the trainer (train/trainer.h). --dry-run plans the same run
// (plan/dry_run.h) and writes nothing.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>

#include "app/commands.h"
#include "bench/rates.h"
#include "config/config.h"
#include "config/presets.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"
#include "parallel/groups.h"
#include "parallel/job.h"
#include "parallel/watchdog.h"
#include "plan/dry_run.h"
#include "plan/plan.h"
#include "core/stop_signal.h"
#include "train/trainer.h"

namespace zero3d {

namespace {

const char* kTrainUsage =
    "usage: zero3d train CONFIG.json [options]\n"
    "  Train a GPT model as described by CONFIG.json (see README.md, \"Configuration\").\n"
    "  CONFIG.json: a file, or a preset's name (gpt-tiny: input/gpt-tiny.json of this zero3d's own tree,\n"
    "  installed or the source tree; its data paths are that tree's: input/README.md#presets).\n"
    "options:\n"
    "  --set KEY=VALUE      override one config key (dotted path, JSON value); repeatable\n"
    "  --deepspeed FILE     overlay a DeepSpeed ds_config.json on the run config\n"
    "  --run-dir DIR        where config.json and metrics.jsonl go (default runs/<date-time>)\n"
    "  --backend NAME       host, cuda, kokkos or auto (default compute.backend, auto: cuda when built and a\n"
    "                       GPU is present)\n"
    "  --peak-flops X       peak FLOP/s for MFU (default: known GPU peak, else the CPU's FMA peak x cores)\n"
    "  --dry-run[=json]     resolve and check everything as the run would, then print its arithmetic and\n"
    "                       stop, writing nothing: parameters, tokens, model FLOPs, the FLOP/s it assumes per\n"
    "                       rank (ZERO3D_FLOPS_PER_RANK, else 40% of a known peak, else 1e10 for a CPU\n"
    "                       rank) and the time, a resume's progress, the Slurm job's time left; =json: one\n"
    "                       JSON object\n"
    "  --ranks N            with --dry-run: plan for N ranks (default: the MPI world size)\n"
    "  --help-config        alone: every config key with its type, default, status and meaning; after\n"
    "                       CONFIG (and --deepspeed, --set): every resolved value and where it came from\n";

// bf16.enabled: GEMMs in bf16 (compute.bf16_gemm on), in fp32 (off), or (auto) in bf16 on a GPU
// (its tensor cores) and on a CPU where oneDNN's bf16 GEMM is measured faster than fp32: with AMX (about 4x) and on AMD's avx512_bf16
// (Zen 4/5, about 2x); not on Intel's avx512_bf16 without AMX (about 0.5x: oneDNN 2.6 converts).
// A rule on the CPU's features, not a measurement at start: a verdict that flips with the load
// would break "same config, same layout, same bits". Returns the reason.
std::string choose_bf16_gemm(const Config& cfg, const std::string& backend, bool& bf16) {
  bf16 = false;
  if (cfg.precision != Precision::bf16) return std::string("fp32 GEMMs (precision ") + name_of(cfg.precision) + ")";
  if (backend == "kokkos") return "fp32 GEMMs on the widened 16-bit weights (the kokkos backend's GEMMs are fp32)";
  const bool cuda = backend_is_cuda(backend);
  if (cuda) {
    if (!cfg.cuda_bf16_gemm()) return "fp32 GEMMs on the widened 16-bit weights (compute.bf16_gemm=off)";
    return (bf16 = true), "bf16 GEMMs on the tensor cores, fp32 accumulation (compute.bf16_gemm=" + cfg.compute.bf16_gemm + ")";
  }
  if (cfg.compute.bf16_gemm == "on") {
    if (!onednn_has_bf16())
      throw UserError(strprintf("compute.bf16_gemm=\"on\" needs a CPU where oneDNN runs bf16 GEMMs natively "
                                "(avx512_bf16 or AMX); oneDNN runs %s here: use \"auto\" or \"off\"",
                                onednn_isa().c_str()));
    return (bf16 = true), "bf16 GEMMs (compute.bf16_gemm=on)";
  }
  if (cfg.compute.bf16_gemm == "off") return "fp32 GEMMs on the widened 16-bit weights (compute.bf16_gemm=off)";
  if (!onednn_has_bf16())
    return "fp32 GEMMs on the widened 16-bit weights (compute.bf16_gemm=auto: oneDNN has no native bf16 GEMM here)";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  bf16 = f.amx_bf16 || f.vendor == "AuthenticAMD";
  return bf16 ? std::string("bf16 GEMMs (compute.bf16_gemm=auto: ") + (f.amx_bf16 ? "AMX" : "AMD avx512_bf16") + ")"
              : "fp32 GEMMs on the widened 16-bit weights (compute.bf16_gemm=auto: Intel avx512_bf16 without AMX "
                "runs bf16 GEMMs at about half the fp32 rate)";
}

// The config's communication settings, into the one CommContext every group reads as it is made
// (and the watchdog reads at every wait).
void configure_comm(const Config& cfg) {
  CommContext& comm = comm_context();
  comm.timeout_s = cfg.comm_timeout_s;
  comm.collectives = cfg.comm.collectives == "mpi"   ? CollectiveImpl::mpi
                     : cfg.comm.collectives == "shm" ? CollectiveImpl::shm
                                                     : CollectiveImpl::automatic;
  comm.shm_min_bytes = static_cast<size_t>(cfg.comm.shm_min_bytes);
  comm.shm_chunk_bytes = static_cast<size_t>(cfg.comm.shm_chunk_bytes);
  comm.send_thread = cfg.comm.send_thread;
  comm.device_library = cfg.comm.device_collectives == "auto";
}

// The MFU peak per rank, chosen here only: --peak-flops, else bench/rates.h's mfu_peak (with the
// world group: measured where it must be; without, as a dry run: 0 where it would be measured).
void choose_peak(RunOptions& opt, Backend& be, ProcessGroup* world) {
  if (opt.peak_flops > 0) return;
  const PeakFlops p = mfu_peak(be, world, opt.job.compute_cores);
  opt.peak_flops = p.flops;
  opt.peak_source = p.source;
}

// --dry-run: the config resolved for `ranks` ranks, the backend and the MFU peak chosen as a real
// run chooses them, the data files opened; then the arithmetic, and nothing written. No process
// groups: the MPI world need not have `ranks` ranks.
int train_dry_run(const ConfigSources& src, RunOptions opt, const std::string& backend_flag, int ranks, bool json) {
  const Config cfg = load_config(src, ranks);
  const std::string backend = cfg.compute.backend_for(backend_flag);
  DryRunInputs in;
  in.job = job_info(*ProcessGroup::world());
  HostOptions host;
  host.gemm = cfg.compute.gemm;
  choose_bf16_gemm(cfg, backend, host.bf16_gemm);
  choose_peak(opt, *make_backend(backend, in.job.local_rank, host), nullptr);
  in.config_file = src.config_file;
  in.run_dir = opt.run_dir.empty() ? default_run_dir(in.job) : opt.run_dir;
  in.ranks = ranks;
  in.device = backend_is_cuda(backend);
  in.peak_flops = opt.peak_flops;
  in.peak_source = opt.peak_source;
  if (const char* e = std::getenv("ZERO3D_FLOPS_PER_RANK"); e && *e)
    in.flops_per_rank = parse_positive(e, "ZERO3D_FLOPS_PER_RANK");
  const RunPlan plan = plan_run(cfg, in);
  log_info("%s", (json ? plan_json(plan) : format_plan(plan)).c_str());
  return 0;
}

// zero3d train's command line, checked.
struct TrainArgs {
  ConfigSources src;
  RunOptions opt;
  std::string backend;  // --backend; empty: compute.backend
  bool help_config = false, dry_run = false, json = false;
  int ranks = 0;  // --ranks (with --dry-run); 0: the MPI world's size
};

TrainArgs parse_train_args(const Args& a) {
  TrainArgs t;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--help-config") t.help_config = true;
    else if (a[i] == "--dry-run" || a[i] == "--dry-run=json") {
      t.dry_run = true;
      t.json = a[i] == "--dry-run=json";
    } else if (a[i] == "--ranks") {
      t.ranks = static_cast<int>(parse_whole(option_value(a, i, kTrainUsage), "--ranks", 1, kMaxRanks));
    } else if (a[i] == "--set") t.src.overrides.push_back(option_value(a, i, kTrainUsage));
    else if (a[i] == "--deepspeed") t.src.deepspeed_file = option_value(a, i, kTrainUsage);
    else if (a[i] == "--run-dir") t.opt.run_dir = option_value(a, i, kTrainUsage);
    else if (a[i] == "--backend") t.backend = option_value(a, i, kTrainUsage);
    else if (a[i] == "--peak-flops") {
      t.opt.peak_flops = parse_positive(option_value(a, i, kTrainUsage), "--peak-flops");
      t.opt.peak_source = "--peak-flops";
    } else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s' for zero3d train\n%s", a[i].c_str(), kTrainUsage));
    else if (t.src.config_file.empty()) set_config_file(t.src, a[i]);  // a file, or a preset's name
    else throw UserError(strprintf("zero3d train takes one CONFIG file, got a second: '%s'", a[i].c_str()));
  }
  if (t.src.config_file.empty()) throw UserError(strprintf("zero3d train needs a CONFIG file\n%s", kTrainUsage));
  if (t.ranks > 0 && !t.dry_run) throw UserError("--ranks goes with --dry-run (a run takes its ranks from the MPI launch)");
  return t;
}

// Without --run-dir: rank 0's default (its clock or the job id decides), broadcast so that every
// rank writes to the same folder. Collective over the world.
void agree_run_dir(RunOptions& opt, ProcessGroup& world) {
  if (opt.run_dir.empty()) opt.run_dir = world.broadcast_string(default_run_dir(opt.job), 0);
}

// The run itself: the config resolved for the world, the groups, the watchdog, the backend and the
// MFU peak, then the trainer. Collective over the world.
int run_training(const ConfigSources& src, RunOptions opt, const std::string& backend_flag, int world) {
  // Every rank reads the same files and arguments, so every rank reaches the same verdict here.
  Config cfg = load_config(src, world);
  const std::string backend = cfg.compute.backend_for(backend_flag);
  for (const std::string& n : cfg.notices) log_info("zero3d: notice: %s", n.c_str());
  cpu::use_level(cfg.compute.isa, "compute.isa");
  configure_comm(cfg);
  ProcessGroups groups = ProcessGroups::create(cfg.tp_size, cfg.pp_size);
  struct WatchdogScope {  // stopped (joined) however the run ends
    WatchdogScope() { Watchdog::start(); }
    ~WatchdogScope() { Watchdog::stop(); }
  } watchdog;
  opt.job = job_info(*groups.world);
  agree_run_dir(opt, *groups.world);
  HostOptions host;
  host.gemm = cfg.compute.gemm;
  opt.compute_choice = choose_bf16_gemm(cfg, backend, host.bf16_gemm);
  std::unique_ptr<Backend> be = make_backend(backend, opt.job.local_rank, host);
  groups.use_device_memory(be->device_memory());
  struct DetachDevice {  // the groups' staging buffers and NCCL go before the backend that made them
    ProcessGroups& g;
    ~DetachDevice() { g.use_device_memory(nullptr); }
  } detach{groups};
  if (be->kind() == BackendKind::host && be->describe_gemm().find("cblas") != std::string::npos)
    if (const std::string w = cblas_core_fallback(); !w.empty()) log_info("zero3d: warning: %s", w.c_str());
  choose_peak(opt, *be, groups.world.get());
  refuse_if_over_memory(cfg, src, groups, be->memory_kind());  // before the engine commits its memory
  Trainer trainer(cfg, opt, *be, groups);
  return trainer.run();
}

}  // namespace

int cmd_train(const Args& a) {
  if (wants_help(a)) {
    log_info("%s", kTrainUsage);
    return 0;
  }
  if (a.size() == 1 && a[0] == "--help-config") {
    log_info("%s", describe_config_keys().c_str());
    return 0;
  }
  const TrainArgs t = parse_train_args(a);
  const int world = ProcessGroup::world()->size();
  if (t.dry_run && !t.help_config) return train_dry_run(t.src, t.opt, t.backend, t.ranks > 0 ? t.ranks : world, t.json);
  if (t.help_config) {
    log_info("# %s resolved for %d rank(s): key = value (where it came from)\n%s", t.src.config_file.c_str(), world,
             describe_resolved(load_config(t.src, world)).c_str());
    return 0;
  }
  // From here on SIGUSR1/SIGTERM only ask for a checkpoint and a stop (at the first step boundary),
  // also when they arrive during start-up or a checkpoint load.
  install_stop_handlers();
  return run_training(t.src, t.opt, t.backend, world);
}

}  // namespace zero3d
