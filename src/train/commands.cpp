#include "train/commands.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "config/config.h"
#include "core/check.h"
#include "core/log.h"
#include "data/loader.h"
#include "ckpt/tools.h"
#include "train/bench.h"
#include "train/machine.h"
#include "train/dry_run.h"
#include "parallel/watchdog.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"
#include "train/job.h"
#include "train/plan.h"
#include "train/stop_signal.h"
#include "train/trainer.h"
#include "parallel/groups.h"
#include "storage/checks.h"
#include <algorithm>
#include <array>
#include <filesystem>
#include <optional>

namespace zero3d {

// Value of option `name` at a[i]; advances i. Throws when the value is missing (the next argument
// is another option: `--set --deepspeed x.json` must not set a key named "--deepspeed").
std::string option_value(const Args& a, size_t& i, const char* usage) {
  if (i + 1 >= a.size() || a[i + 1].starts_with("--"))
    throw UserError(strprintf("option %s needs a value\n%s", a[i].c_str(), usage));
  return a[++i];
}

// The comma-separated items of s ("a,b,,c": a, b, "", c).
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

namespace {

const char* kTrainUsage =
    "usage: zero3d train CONFIG.json [options]\n"
    "  Train a GPT model as described by CONFIG.json (see README.md, \"Configuration\").\n"
    "options:\n"
    "  --set KEY=VALUE      override one config key (dotted path, JSON value); repeatable\n"
    "  --deepspeed FILE     overlay a DeepSpeed ds_config.json on the run config\n"
    "  --run-dir DIR        where config.json and metrics.jsonl go (default runs/<date-time>)\n"
    "  --backend NAME       host, cuda or auto (default auto: cuda when built and a GPU is present)\n"
    "  --peak-flops X       peak FLOP/s for MFU (default: known GPU peak, else the CPU's FMA peak x cores)\n"
    "  --dry-run[=json]     resolve and check everything as the run would, then print its arithmetic and\n"
    "                       stop, writing nothing: parameters, tokens, model FLOPs, the FLOP/s it assumes per\n"
    "                       rank (ZERO3D_FLOPS_PER_RANK, else 40% of a known peak, else 1e10 for a CPU\n"
    "                       rank) and the time, a resume's progress, the Slurm job's time left; =json: one\n"
    "                       JSON object\n"
    "  --ranks N            with --dry-run: plan for N ranks (default: the MPI world size)\n"
    "  --help-config        alone: every config key with its type, default, status and meaning; after\n"
    "                       CONFIG (and --deepspeed, --set): every resolved value and where it came from\n";

const char* kDataUsage =
    "usage: zero3d data prepare TEXT... --out FILE.bin\n"
    "  Tokenize text files byte by byte (vocabulary 256) into one llm.c token file.\n";

const char* kBenchUsage =
    "usage: zero3d bench gemm [--sizes N,N,...] [--seconds S] [--config FILE] [--backend NAME]\n"
    "       zero3d bench kernels [--config FILE] [--seconds S] [--levels LIST]\n"
    "       zero3d bench io [--dir DIR] [--bytes N]\n"
    "       zero3d bench comm [--min-bytes N] [--max-bytes N] [--factor F] [--ops LIST] [--types LIST] [--group N]\n"
    "       zero3d bench machine [--out FILE] [--seconds S] [--nvme-path DIR]\n"
    "  gemm: the GEMM rates a training run gets. Names the CPU, the ISA level of the host loops, the\n"
    "        GEMM libraries and the ISA they run, measures one thread's FMA peak, then GFLOP/s per\n"
    "        square size N (C = A B^T; default 512,1024,2048,4096; at least S seconds each, default 1)\n"
    "        and per GEMM of one training micro-batch of the model in FILE (default\n"
    "        input/bench-cpu.json when it exists): every linear layer's forward (fwd), input\n"
    "        gradient (dx) and weight gradient (dW), and the fused causal attention. Columns: zero3d\n"
    "        (what training runs: compute.gemm=auto), onednn, cblas (the CBLAS linked in) and bf16\n"
    "        (oneDNN; inputs rounded to bf16, fp32 accumulation). Under mpirun every rank measures at\n"
    "        once (a node's load) and rank 0 prints its own rates.\n"
    "  kernels: every host kernel of a training step at one micro-batch of FILE's model (default\n"
    "        input/bench-cpu.json when it exists, else input/gpt-tiny.json), at each ISA level of\n"
    "        LIST (default: every level this CPU runs, e.g. avx512,avx2,sse2): its rate and that\n"
    "        rate against its bound, FLOPs / the level's FMA peak (attention) or bytes / the copy\n"
    "        bandwidth (the rest; over 100%: the data stayed in cache); GELU and the cross-entropy's\n"
    "        softmax need an exp per element, and where the level's exp rate is the slower roof the\n"
    "        cell is against that and marked *. S seconds per cell (0.3).\n"
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
    "        the shared-memory pipelining grain (comm.shm_chunk_bytes). Exit 1 on any wrong element.\n"
    "  machine: the rates zero3d plan --machine prices a layout with, every rank measuring at once (run\n"
    "        it with the ranks per node a job will use, on one node or more): GEMM FLOP/s at GPT-2 block\n"
    "        shapes, the fused attention's FLOP/s, copy bandwidth, AdamW's bytes/s, each collective's\n"
    "        latency and bus bandwidth over a node's ranks (from 64 KiB and 32 MiB) and, on more than one\n"
    "        node, over all of them (the inter-node rates); with --nvme-path, the rates a rank writes and reads\n"
    "        swap files there (256 MiB a rank, as offload to nvme drives them); into FILE (default machine.json).\n";

const char* kCkptUsage =
    "usage: zero3d ckpt inspect CKPT\n"
    "       zero3d ckpt verify CKPT\n"
    "       zero3d ckpt export CKPT --out MODEL.safetensors [--weights master|model] [--format safetensors|hf]\n"
    "  CKPT: a checkpoint file (step_XXXXXXXX.h5), or a checkpoint directory meaning the one its 'latest' names.\n"
    "  inspect  print the step, the layout at save, the model shape, the optimizer state and every dataset\n"
    "  verify   recompute every dataset's checksum; exit code 4 when any differs, is missing or unreadable\n"
    "  export   write the model weights as safetensors (GPT-2 names without 'transformer.', matrices (out, in)):\n"
    "           --weights master (default) the fp32 master weights, F32; model: the weights computed with,\n"
    "           as stored (F32, BF16 or F16)\n"
    "           --format hf: --out names a directory; config.json and model.safetensors as Hugging Face\n"
    "           transformers loads them (GPT2LMHeadModel or LlamaForCausalLM)\n"
    "  Runs on rank 0 alone; one process is enough.\n";

bool wants_help(const Args& a) {
  for (const auto& s : a)
    if (s == "--help" || s == "-h") return true;
  return false;
}

double parse_double(const std::string& s, const char* what) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0)) throw UserError(strprintf("%s must be a positive number, got '%s'", what, s.c_str()));
  return v;
}

// Whether `name` (--backend) makes the CUDA backend here.
bool is_cuda(const std::string& name) {
#if defined(ZERO3D_HAVE_CUDA)
  return name == "cuda" || (name == "auto" && cuda_device_count() > 0);
#else
  return name == "cuda";
#endif
}

// local_rank: among the ranks of this node; it picks the GPU (round robin over the visible ones).
// host.bf16_gemm applies to either backend.
std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank, const HostOptions& host = {}) {
  if (name != "auto" && name != "host" && name != "cuda")
    throw UserError(strprintf("--backend must be host, cuda or auto, got '%s'", name.c_str()));
#if defined(ZERO3D_HAVE_CUDA)
  if (is_cuda(name)) {
    if (cuda_device_count() == 0) throw UserError("--backend cuda: no CUDA device is visible to this process");
    return make_cuda_backend(local_rank % cuda_device_count(), host.bf16_gemm);
  }
#else
  (void)local_rank;
  if (name == "cuda") throw UserError("--backend cuda: this zero3d was built without the CUDA backend (ZERO3D_CUDA=OFF or no toolkit found)");
#endif
  if (const char* e = std::getenv("ZERO3D_DEVICE_WALLS"); e && std::string(e) == "1") return make_walled_backend(host);
  return make_host_backend(host);
}

// bf16.enabled: GEMMs in bf16 (compute.bf16_gemm on), in fp32 (off), or (auto) in bf16 on a GPU
// (its tensor cores) and on a CPU where oneDNN's bf16 GEMM is measured faster than fp32: with AMX (about 4x) and on AMD's avx512_bf16
// (Zen 4/5, about 2x); not on Intel's avx512_bf16 without AMX (about 0.5x: oneDNN 2.6 converts).
// A rule on the CPU's features, not a measurement at start: a verdict that flips with the load
// would break "same config, same layout, same bits". Returns the reason.
std::string choose_bf16_gemm(const Config& cfg, bool cuda, bool& bf16) {
  bf16 = false;
  if (cfg.precision != Precision::bf16) return std::string("fp32 GEMMs (precision ") + name_of(cfg.precision) + ")";
  if (cuda) {
    if (cfg.compute.bf16_gemm == "off") return "fp32 GEMMs on the widened 16-bit weights (compute.bf16_gemm=off)";
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

// Tests: one node made to look like nodes of ZERO3D_RANKS_PER_NODE ranks (the hierarchical
// collectives, bench machine's inter-node rates).
void pretend_nodes() {
  if (const char* e = std::getenv("ZERO3D_RANKS_PER_NODE"); e && *e) comm_context().ranks_per_node = std::atoi(e);
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
  pretend_nodes();
}

// The MFU peak per rank, chosen here only: --peak-flops, else a known GPU's, else (with the world
// group: a run, not --dry-run) on a CPU the FMA peak of its cores, on another device its measured
// sgemm rate. Collective over the world when it measures.
void choose_peak(RunOptions& opt, Backend& be, ProcessGroup* world) {
  if (opt.peak_flops > 0) return;
  if (be.kind() == BackendKind::cuda) {
    opt.peak_flops = known_accelerator_peak(be.describe());
    opt.peak_source = "known bf16 peak of " + be.describe();
  }
  if (opt.peak_flops > 0 || !world) return;  // --dry-run: measured when the run starts
  if (be.kind() == BackendKind::host) {
    // A CPU: the FMA peak of one core (the best window of any rank) x the cores the run computes
    // on. peak_flops is per rank, as MFU divides by the world.
    const double core = world->all_reduce_max(best_fma_peak(0.2));
    const int cores = opt.job.compute_cores;
    opt.peak_flops = core * cores / world->size();
    opt.peak_source = strprintf("FMA peak %s x %d cores: %.1f GFLOP/s per core (the best 2 ms window of any rank), "
                                "%.1f GFLOP/s in all",
                                cpu::select().isa, cores, core / 1e9, core * cores / 1e9);
    return;
  }
  // An accelerator without a known peak: its sgemm rate, rank 0's for every rank.
  GemmRate r = measure_gemm(be, 1024, 1024, 1024, 1.0);
  opt.peak_flops = r.flops_per_s;
  opt.peak_source = strprintf("measured sgemm 1024^3 on rank 0 (%.1f GFLOP/s)", r.flops_per_s / 1e9);
  world->broadcast(host_mem(&opt.peak_flops), sizeof(double), 0);
}

// --dry-run: the config resolved for `ranks` ranks, the backend and the MFU peak chosen as a real
// run chooses them, the data files opened; then the arithmetic, and nothing written. No process
// groups: the MPI world need not have `ranks` ranks.
int train_dry_run(const ConfigSources& src, RunOptions opt, const std::string& backend, int ranks, bool json) {
  const Config cfg = load_config(src, ranks);
  DryRunInputs in;
  in.job = job_info(*ProcessGroup::world());
  HostOptions host;
  host.gemm = cfg.compute.gemm;
  choose_bf16_gemm(cfg, is_cuda(backend), host.bf16_gemm);
  choose_peak(opt, *make_backend(backend, in.job.local_rank, host), nullptr);
  in.config_file = src.config_file;
  in.run_dir = opt.run_dir.empty() ? default_run_dir(in.job) : opt.run_dir;
  in.ranks = ranks;
  in.device = is_cuda(backend);
  in.peak_flops = opt.peak_flops;
  in.peak_source = opt.peak_source;
  if (const char* e = std::getenv("ZERO3D_FLOPS_PER_RANK"); e && *e)
    in.flops_per_rank = parse_double(e, "ZERO3D_FLOPS_PER_RANK");
  const RunPlan plan = plan_run(cfg, in);
  log_info("%s", (json ? plan_json(plan) : format_plan(plan)).c_str());
  return 0;
}

// zero3d train's command line, checked.
struct TrainArgs {
  ConfigSources src;
  RunOptions opt;
  std::string backend = "auto";
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
      const double n = parse_double(option_value(a, i, kTrainUsage), "--ranks");
      if (n != std::floor(n) || n > 1e6)
        throw UserError(strprintf("--ranks must be a whole number of ranks, got '%s'", a[i].c_str()));
      t.ranks = static_cast<int>(n);
    } else if (a[i] == "--set") t.src.overrides.push_back(option_value(a, i, kTrainUsage));
    else if (a[i] == "--deepspeed") t.src.deepspeed_file = option_value(a, i, kTrainUsage);
    else if (a[i] == "--run-dir") t.opt.run_dir = option_value(a, i, kTrainUsage);
    else if (a[i] == "--backend") t.backend = option_value(a, i, kTrainUsage);
    else if (a[i] == "--peak-flops") {
      t.opt.peak_flops = parse_double(option_value(a, i, kTrainUsage), "--peak-flops");
      t.opt.peak_source = "--peak-flops";
    } else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s' for zero3d train\n%s", a[i].c_str(), kTrainUsage));
    else if (t.src.config_file.empty()) t.src.config_file = a[i];
    else throw UserError(strprintf("zero3d train takes one CONFIG file, got a second: '%s'", a[i].c_str()));
  }
  if (t.src.config_file.empty()) throw UserError(strprintf("zero3d train needs a CONFIG file\n%s", kTrainUsage));
  if (t.ranks > 0 && !t.dry_run) throw UserError("--ranks goes with --dry-run (a run takes its ranks from the MPI launch)");
  return t;
}

// Without --run-dir: rank 0's default (its clock or the job id decides), broadcast so that every
// rank writes to the same folder. Collective over the world.
void agree_run_dir(RunOptions& opt, ProcessGroup& world) {
  if (!opt.run_dir.empty()) return;
  opt.run_dir = default_run_dir(opt.job);
  std::vector<char> buf(256, '\0');
  std::copy_n(opt.run_dir.begin(), std::min<size_t>(opt.run_dir.size(), 255), buf.begin());
  world.broadcast(host_mem(buf.data()), buf.size(), 0);
  opt.run_dir = buf.data();
}

// The run itself: the config resolved for the world, the groups, the watchdog, the backend and the
// MFU peak, then the trainer. Collective over the world.
int run_training(const ConfigSources& src, RunOptions opt, const std::string& backend, int world) {
  // Every rank reads the same files and arguments, so every rank reaches the same verdict here.
  Config cfg = load_config(src, world);
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
  opt.compute_choice = choose_bf16_gemm(cfg, is_cuda(backend), host.bf16_gemm);
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

std::string usage_main() {
  return "usage: zero3d COMMAND [options]   (zero3d COMMAND --help for each)\n"
         "commands:\n"
         "  train CONFIG.json       train a GPT model\n"
         "  data prepare TEXT...    make an llm.c token file from text\n"
         "  bench gemm|kernels|io|comm  measure the GEMMs, the host kernels per ISA level, the file\n"
         "                          system's write rate, or the collectives\n"
         "  ckpt inspect|verify|export  look into, check or export a checkpoint\n"
         "  generate CKPT --prompt TEXT  continue a prompt with a checkpoint's model\n"
         "  eval CKPT --tokens FILE  the loss and perplexity of a checkpoint's model on a token file\n"
         "  plan CONFIG --ranks N   which layouts fit: every layout's memory per rank, before the job\n"
         "  --version               print the version and the backends built in\n";
}

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

int cmd_data(const Args& a) {
  if (a.empty() || wants_help(a)) {
    log_info("%s", kDataUsage);
    return a.empty() ? kExitUserError : 0;
  }
  if (a[0] != "prepare") throw UserError(strprintf("unknown data command '%s'\n%s", a[0].c_str(), kDataUsage));
  std::vector<std::string> texts;
  std::string out;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out") out = option_value(a, i, kDataUsage);
    else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kDataUsage));
    else texts.push_back(a[i]);
  }
  if (texts.empty() || out.empty()) throw UserError(strprintf("data prepare needs TEXT files and --out\n%s", kDataUsage));
  for (const std::string& t : texts) {  // the output replaces its file only when done: it must not be an input
    std::error_code ec;
    if (std::filesystem::equivalent(t, out, ec))
      throw UserError(strprintf("data prepare: --out '%s' is also an input text: give another output file", out.c_str()));
  }
  if (ProcessGroup::world()->rank() == 0) {
    uint64_t n = prepare_token_file(texts, out);
    log_info("wrote %llu tokens to %s", static_cast<unsigned long long>(n), out.c_str());
  }
  return 0;
}

namespace {

// A GEMM table's cell: GFLOP/s, or '-' where the library has no such GEMM here.
std::string gemm_column(double rate) { return rate > 0 ? strprintf("%9.1f", rate / 1e9) : strprintf("%9s", "-"); }

// The columns of bench gemm: what training runs (compute.gemm=auto), oneDNN, the CBLAS linked in,
// and oneDNN's bf16 GEMM (nullptr where oneDNN has none).
struct GemmBackends {
  std::unique_ptr<Backend> zero3d, onednn, cblas, bf16;
  std::array<Backend*, 4> columns() const { return {zero3d.get(), onednn.get(), cblas.get(), bf16.get()}; }
};

GemmBackends make_gemm_backends() {
  GemmBackends be;
  HostOptions o;
  be.zero3d = make_host_backend(o);
  o.gemm = "onednn";
  be.onednn = make_host_backend(o);
  o.gemm = "cblas";
  be.cblas = make_host_backend(o);
  o.gemm = "onednn";
  o.bf16_gemm = true;
  // oneDNN 2.6 has no bf16 GEMM below AVX-512: there the column is '-'.
  be.bf16 = onednn_runs_bf16() ? make_host_backend(o) : nullptr;
  return be;
}

// The machine and the libraries: the CPU and its ISA levels, the threads, the GEMM libraries,
// zero3d's plan and why, and what the bf16 column means here.
void log_gemm_setup(const GemmBackends& be, const GemmPlan& plan, const JobInfo& job, int ranks) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const bool native_bf16 = onednn_has_bf16();
  log_info("# CPU: %s (%s family %d model %d): %s%s%s; host loops: %s; %d thread(s) per rank (%s), %d rank(s) "
           "measuring at once",
           f.model.c_str(), f.vendor.c_str(), f.family, f.model_number, f.level().c_str(),
           f.avx512_bf16 ? ", avx512_bf16" : "", f.amx_bf16 ? ", amx_bf16" : "", cpu::select().isa, job.threads,
           job.threads_source.c_str(), ranks);
  log_info("# GEMM libraries: %s (%s); CBLAS: %s", onednn_version().c_str(), onednn_isa().c_str(),
           cblas_name().c_str());
  log_info("# zero3d's plan (compute.gemm=auto): %s; why: %s", be.zero3d->describe_gemm().c_str(), plan.why.c_str());
  if (const std::string w = cblas_core_fallback(); !w.empty()) log_info("# note: %s", w.c_str());
  if (!be.bf16)
    log_info("# note: oneDNN has no bf16 GEMM at %s: the bf16 column is '-' (training with bf16 runs fp32 GEMMs "
             "on the widened weights here)", onednn_isa().c_str());
  else if (!native_bf16)
    log_info("# note: oneDNN has no native bf16 GEMM at %s: the bf16 column is its emulation", onednn_isa().c_str());
}

// The FMA peak of the rank's threads, then square GEMMs of each size through each library.
void bench_square_gemms(const GemmBackends& be, const std::vector<int>& sizes, double seconds, const JobInfo& job) {
  double peak = 0;
#pragma omp parallel reduction(+ : peak)
  peak += best_fma_peak(std::max(0.3, seconds / 2));  // each thread its best window
  log_info("# FMA peak (%s, %d thread(s)): %.1f GFLOP/s", cpu::select().isa, job.threads, peak / 1e9);
  log_info("%8s %12s %12s %9s %9s %9s %7s", "n", "ms/call", "GFLOP/s", "onednn", "cblas", "bf16", "%peak");
  for (int n : sizes) {
    const GemmRate z = measure_gemm(*be.zero3d, n, n, n, seconds);
    const double r1 = measure_gemm(*be.onednn, n, n, n, seconds / 2).flops_per_s;
    const double r2 = measure_gemm(*be.cblas, n, n, n, seconds / 2).flops_per_s;
    const double r3 = be.bf16 ? measure_gemm(*be.bf16, n, n, n, seconds / 2).flops_per_s : 0;
    log_info("%8d %12.3f %12.1f %9.1f %9.1f %s %6.1f%%", n, z.seconds_per_call * 1e3, z.flops_per_s / 1e9, r1 / 1e9,
             r2 / 1e9, gemm_column(r3).c_str(), 100 * z.flops_per_s / peak);
  }
}

// One GEMM shape through each column, calls for at least t seconds each: rate[b] in FLOP/s (0: no
// such library), secs[b] += its seconds per call.
void time_gemm_shape(const GemmBackends& be, const GemmShape& s, double t, double rate[4], double secs[4]) {
  Backend& z = *be.zero3d;  // its buffers serve every library: all are host memory
  const size_t sa = static_cast<size_t>(s.m) * s.k, sb = static_cast<size_t>(s.k) * s.n;
  DeviceBuffer<float> A(z, sa), B(z, sb), C(z, static_cast<size_t>(s.m) * s.n);
  std::vector<float> h(std::max(sa, sb));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  z.copy_from_host(A.data(), h.data(), A.bytes());
  z.copy_from_host(B.data(), h.data(), B.bytes());
  const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  const std::array<Backend*, 4> bes = be.columns();
  for (int b = 0; b < 4; ++b) {
    if (!bes[b]) {
      rate[b] = 0;
      continue;
    }
    const double sec = time_calls(*bes[b], [&] {
      bes[b]->gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, A.data(), lda, B.data(), ldb, static_cast<float>(s.beta),
                   C.data(), s.n);
    }, t);
    rate[b] = 2.0 * s.m * s.n * s.k / sec;
    secs[b] += sec;
  }
}

// The fused attention of one layer: model FLOPs (q k^T and p v over the causal half) per second.
void bench_attention(Backend& be, const ModelConfig& m, int micro, int tp, double t) {
  const int H = m.n_head / tp, Hkv = m.kv_heads() / tp, A = H * m.head_dim(), T = m.seq_len, N = micro * m.seq_len;
  const size_t qkv_floats = static_cast<size_t>(N) * (H + 2 * Hkv) * m.head_dim();
  DeviceBuffer<float> qkv(be, qkv_floats), out(be, static_cast<size_t>(N) * A),
      lse(be, static_cast<size_t>(micro) * H * T), dqkv(be, qkv_floats);
  std::vector<float> h(qkv.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  be.copy_from_host(qkv.data(), h.data(), qkv.bytes());
  const double fwd_flops = 4.0 * micro * A * (T * (T + 1.0) / 2);
  const double tf = time_calls(be, [&] { be.attention_forward(out.data(), lse.data(), qkv.data(), micro, T, H, Hkv, A); }, t);
  const double tb = time_calls(be, [&] {
    be.attention_backward(dqkv.data(), out.data(), out.data(), lse.data(), qkv.data(), micro, T, H, Hkv, A);
  }, t);
  log_info("%-14s %20s %9.1f  (fused, causal: %.2f ms)", "attention fwd", "", fwd_flops / tf / 1e9, tf * 1e3);
  log_info("%-14s %20s %9.1f  (fused, causal, model FLOPs = 2x forward: %.2f ms)", "attention bwd", "",
           2 * fwd_flops / tb / 1e9, tb * 1e3);
}

// Every GEMM of one training micro-batch of `cfg`'s model through each column, the total by time,
// and the fused attention.
void bench_model_gemms(const GemmBackends& be, const GemmPlan& plan, const Config& cfg, const std::string& config,
                       double seconds) {
  const ModelConfig& m = cfg.model;
  const int micro = cfg.train_micro_batch_size_per_gpu, tp = cfg.tp_size, N = micro * m.seq_len;
  log_info("# one micro-batch of %s: micro-batch %d x seq %d = %d tokens, d_model %d, vocab %d, tp %d (GFLOP/s)",
           config.c_str(), micro, m.seq_len, N, m.d_model, m.vocab_size, tp);
  log_info("%-14s %6s %6s %6s %9s %9s %9s %9s  %s", "gemm", "m", "n", "k", "zero3d", "onednn", "cblas", "bf16",
           "zero3d runs");
  const double t = std::max(0.1, seconds / 4);
  double flops = 0, secs[4] = {0, 0, 0, 0};
  for (const GemmShape& s : model_gemm_shapes(m, micro, tp)) {
    double rate[4];
    time_gemm_shape(be, s, t, rate, secs);
    flops += 2.0 * s.m * s.n * s.k;
    const GemmRole role = s.ta ? GemmRole::weight_grad : s.tb ? GemmRole::forward : GemmRole::input_grad;
    log_info("%-14s %6d %6d %6d %9.1f %9.1f %9.1f %s  %s", s.name.c_str(), s.m, s.n, s.k, rate[0] / 1e9, rate[1] / 1e9,
             rate[2] / 1e9, gemm_column(rate[3]).c_str(), gemm_library_name(plan.for_role(role)));
  }
  log_info("%-14s %20s %9.1f %9.1f %9.1f %s", "all (by time)", "", flops / secs[0] / 1e9, flops / secs[1] / 1e9,
           flops / secs[2] / 1e9, gemm_column(be.bf16 ? flops / secs[3] : 0).c_str());
  bench_attention(*be.zero3d, m, micro, tp, t);
}

}  // namespace

// zero3d bench gemm on the host: the same GEMMs through each library, side by side.
void bench_host_gemm(const std::vector<int>& sizes, double seconds, const Config* cfg, const std::string& config,
                     const JobInfo& job, int ranks) {
  const GemmBackends be = make_gemm_backends();
  const GemmPlan plan = make_gemm_plan("auto", false);
  log_gemm_setup(be, plan, job, ranks);
  bench_square_gemms(be, sizes, seconds, job);
  if (cfg) bench_model_gemms(be, plan, *cfg, config, seconds);
}

namespace {

// zero3d bench io [--dir DIR] [--bytes N]
int bench_io_command(const Args& a) {
  std::string dir = ".";
  double bytes = 1 << 30;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--dir") dir = option_value(a, i, kBenchUsage);
    else if (a[i] == "--bytes") bytes = parse_double(option_value(a, i, kBenchUsage), "--bytes");
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  auto world = ProcessGroup::world();
  const double t = measure_collective_write(world->comm(), dir, static_cast<uint64_t>(bytes));
  log_info("# collective MPI-IO write + sync, %d ranks, %s\n%.0f bytes in %.3f s: %.1f MB/s", world->size(),
           dir.c_str(), bytes, t, bytes / t / 1e6);
  return 0;
}

// zero3d bench comm [options]: exit 1 on any wrong element.
int bench_comm_command(const Args& a) {
  CommBenchOptions o;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--min-bytes") o.min_bytes = static_cast<size_t>(parse_double(option_value(a, i, kBenchUsage), "--min-bytes"));
    else if (a[i] == "--max-bytes") o.max_bytes = static_cast<size_t>(parse_double(option_value(a, i, kBenchUsage), "--max-bytes"));
    else if (a[i] == "--factor") o.factor = parse_double(option_value(a, i, kBenchUsage), "--factor");
    else if (a[i] == "--chunk-bytes") o.chunk_bytes = static_cast<size_t>(parse_double(option_value(a, i, kBenchUsage), "--chunk-bytes"));
    else if (a[i] == "--group") o.group_size = static_cast<int>(parse_double(option_value(a, i, kBenchUsage), "--group"));
    else if (a[i] == "--ops") o.ops = split_commas(option_value(a, i, kBenchUsage));
    else if (a[i] == "--types") o.types = split_commas(option_value(a, i, kBenchUsage));
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  if (o.factor <= 1) throw UserError("bench comm: --factor must be above 1");
  return bench_comm(o) == 0 ? 0 : 1;
}

// zero3d bench kernels [--config FILE] [--seconds S] [--levels LIST]
int bench_kernels_command(const Args& a) {
  std::string config = std::filesystem::exists("input/bench-cpu.json") ? "input/bench-cpu.json" : "input/gpt-tiny.json";
  double seconds = 0.3;
  std::vector<std::string> levels;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--config") config = option_value(a, i, kBenchUsage);
    else if (a[i] == "--seconds") seconds = parse_double(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--levels") levels = split_commas(option_value(a, i, kBenchUsage));
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  const Config cfg = load_config({config, "", {"zero_optimization.stage=0", "pipeline_parallel.pp_size=1"}}, 1);
  bench_kernels(cfg.model, cfg.train_micro_batch_size_per_gpu, config, seconds, levels);
  return 0;
}

// zero3d bench gemm [--sizes N,N,...] [--seconds S] [--config FILE] [--backend NAME]: on a host
// backend every library side by side (bench_host_gemm), on a device its sgemm alone.
int bench_gemm_command(const Args& a) {
  std::vector<int> sizes = {512, 1024, 2048, 4096};
  double seconds = 1.0;
  std::string backend = "auto", config;
  if (FILE* f = std::fopen("input/bench-cpu.json", "r")) {
    std::fclose(f);
    config = "input/bench-cpu.json";
  }
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--seconds") seconds = parse_double(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--backend") backend = option_value(a, i, kBenchUsage);
    else if (a[i] == "--config") config = option_value(a, i, kBenchUsage);
    else if (a[i] == "--sizes") {
      sizes.clear();
      for (const std::string& item : split_commas(option_value(a, i, kBenchUsage)))
        sizes.push_back(static_cast<int>(parse_double(item, "--sizes entry")));
    } else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  auto world = ProcessGroup::world();
  const JobInfo job = job_info(*world);
  std::optional<Config> cfg;
  if (!config.empty()) cfg = load_config({config, "", {"zero_optimization.stage=0", "pipeline_parallel.pp_size=1"}}, 1);
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

}  // namespace

// zero3d bench machine: the rates zero3d plan --machine prices a layout's work with, measured by
// every rank at once (within a node, and between nodes when there are several), into a JSON file.
int bench_machine_command(const Args& a) {
  std::string out = "machine.json", nvme_path;
  double seconds = 2;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--out") out = option_value(a, i, kBenchUsage);
    else if (a[i] == "--seconds") seconds = parse_double(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--nvme-path") nvme_path = option_value(a, i, kBenchUsage);
    else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  pretend_nodes();
  auto world = ProcessGroup::world();
  const std::string dir = std::filesystem::absolute(out).parent_path().string();
  if (const std::string e = probe_writable(dir, world->rank()); !e.empty())  // before minutes of measuring
    throw UserError(strprintf("bench machine --out '%s': cannot write in '%s': %s", out.c_str(), dir.c_str(), e.c_str()));
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

int cmd_bench(const Args& a) {
  if (a.empty() || wants_help(a)) {
    log_info("%s", kBenchUsage);
    return a.empty() ? kExitUserError : 0;
  }
  if (a[0] == "io") return bench_io_command(a);
  if (a[0] == "comm") return bench_comm_command(a);
  if (a[0] == "kernels") return bench_kernels_command(a);
  if (a[0] == "machine") return bench_machine_command(a);
  if (a[0] != "gemm") throw UserError(strprintf("unknown bench '%s'\n%s", a[0].c_str(), kBenchUsage));
  return bench_gemm_command(a);
}

int cmd_ckpt(const Args& a) {
  if (a.empty() || wants_help(a)) {
    log_info("%s", kCkptUsage);
    return a.empty() ? kExitUserError : 0;
  }
  const std::string& tool = a[0];
  if (tool != "inspect" && tool != "verify" && tool != "export")
    throw UserError(strprintf("unknown ckpt command '%s' (inspect, verify or export)\n%s", tool.c_str(), kCkptUsage));
  std::string path, out, weights = "master", format = "safetensors";
  for (size_t i = 1; i < a.size(); ++i) {
    if (tool == "export" && a[i] == "--out") out = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--weights") weights = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--format") format = option_value(a, i, kCkptUsage);
    else if (a[i].starts_with("-"))
      throw UserError(strprintf("unknown option '%s' for zero3d ckpt %s\n%s", a[i].c_str(), tool.c_str(), kCkptUsage));
    else if (path.empty()) path = a[i];
    else
      throw UserError(strprintf("zero3d ckpt %s takes one checkpoint, got a second: '%s'", tool.c_str(), a[i].c_str()));
  }
  if (path.empty())
    throw UserError(strprintf("zero3d ckpt %s needs a checkpoint file or directory\n%s", tool.c_str(), kCkptUsage));
  if (tool == "export" && out.empty())
    throw UserError(strprintf("zero3d ckpt export needs --out FILE\n%s", kCkptUsage));
  // One reader is enough: the other ranks return 0 and wait in main, which agrees on rank 0's code.
  if (ProcessGroup::world()->rank() != 0) return 0;
  if (tool == "inspect") return ckpt_inspect(path);
  if (tool == "verify") return ckpt_verify(path);
  return ckpt_export(path, out, weights, format);
}

}  // namespace zero3d
