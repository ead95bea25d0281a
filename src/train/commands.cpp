#include "train/commands.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "config/config.h"
#include "core/check.h"
#include "core/log.h"
#include "data/loader.h"
#include "io/ckpt_tools.h"
#include "train/bench.h"
#include "train/job.h"
#include "train/stop_signal.h"
#include "train/trainer.h"
#include "parallel/groups.h"
#include <algorithm>

namespace zero3d {

namespace {

const char* kTrainUsage =
    "usage: zero3d train CONFIG.json [options]\n"
    "  Train a GPT model as described by CONFIG.json (see README.md, \"Configuration\").\n"
    "options:\n"
    "  --set KEY=VALUE      override one config key (dotted path, JSON value); repeatable\n"
    "  --deepspeed FILE     overlay a DeepSpeed ds_config.json on the run config\n"
    "  --run-dir DIR        where config.json and metrics.jsonl go (default runs/<date-time>)\n"
    "  --backend NAME       host, cuda or auto (default auto: cuda when built and a GPU is present)\n"
    "  --peak-flops X       peak FLOP/s for MFU (default: known GPU peak, else measured sgemm rate)\n"
    "  --help-config        list every config key with its type, default and meaning\n";

const char* kDataUsage =
    "usage: zero3d data prepare TEXT... --out FILE.bin\n"
    "  Tokenize text files byte by byte (vocabulary 256) into one llm.c token file.\n";

const char* kBenchUsage =
    "usage: zero3d bench gemm [--sizes N,N,...] [--seconds S] [--backend NAME]\n"
    "       zero3d bench io [--dir DIR] [--bytes N]\n"
    "  gemm: GEMM rate (C = A B^T, fp32) through the BLAS the trainer uses, per square size N.\n"
    "        Default sizes 512,1024,2048,4096; at least S seconds (default 1) per size.\n"
    "  io:   collective MPI-IO write rate of N bytes (default 1 GiB) over all ranks into a new file in\n"
    "        DIR (default .), synced to disk: the raw baseline for the checkpoint bandwidth.\n";

const char* kCkptUsage =
    "usage: zero3d ckpt inspect CKPT\n"
    "       zero3d ckpt verify CKPT\n"
    "       zero3d ckpt export CKPT --out MODEL.safetensors [--weights master|model]\n"
    "  CKPT: a checkpoint file (step_XXXXXXXX.h5), or a checkpoint directory meaning the one its 'latest' names.\n"
    "  inspect  print the step, the layout at save, the model shape, the optimizer state and every dataset\n"
    "  verify   recompute every dataset's checksum; exit code 4 when any differs, is missing or unreadable\n"
    "  export   write the model weights as safetensors (GPT-2 names without 'transformer.', matrices (out, in)):\n"
    "           --weights master (default) the fp32 master weights, F32; model: the weights computed with,\n"
    "           as stored (F32, BF16 or F16)\n"
    "  Runs on rank 0 alone; one process is enough.\n";

bool wants_help(const Args& a) {
  for (const auto& s : a)
    if (s == "--help" || s == "-h") return true;
  return false;
}

// Value of option `name` at a[i]; advances i. Throws when the value is missing.
std::string option_value(const Args& a, size_t& i, const char* usage) {
  if (i + 1 >= a.size()) throw UserError(strprintf("option %s needs a value\n%s", a[i].c_str(), usage));
  return a[++i];
}

double parse_double(const std::string& s, const char* what) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !(v > 0)) throw UserError(strprintf("%s must be a positive number, got '%s'", what, s.c_str()));
  return v;
}

// local_rank: among the ranks of this node; it picks the GPU (round robin over the visible ones).
std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank) {
  if (name != "auto" && name != "host" && name != "cuda")
    throw UserError(strprintf("--backend must be host, cuda or auto, got '%s'", name.c_str()));
#if defined(ZERO3D_HAVE_CUDA)
  if (name == "cuda" || (name == "auto" && cuda_device_count() > 0)) {
    if (cuda_device_count() == 0) throw UserError("--backend cuda: no CUDA device is visible to this process");
    return make_cuda_backend(local_rank % cuda_device_count());
  }
#else
  (void)local_rank;
  if (name == "cuda") throw UserError("--backend cuda: this zero3d was built without the CUDA backend (ZERO3D_CUDA=OFF or no toolkit found)");
#endif
  return make_host_backend();
}

}  // namespace

std::string usage_main() {
  return "usage: zero3d COMMAND [options]   (zero3d COMMAND --help for each)\n"
         "commands:\n"
         "  train CONFIG.json       train a GPT model\n"
         "  data prepare TEXT...    make an llm.c token file from text\n"
         "  bench gemm|io           measure the GEMM rate the trainer gets, or the file system's write rate\n"
         "  ckpt inspect|verify|export  look into, check or export a checkpoint\n"
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
  ConfigSources src;
  RunOptions opt;
  std::string backend = "auto";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--set") src.overrides.push_back(option_value(a, i, kTrainUsage));
    else if (a[i] == "--deepspeed") src.deepspeed_file = option_value(a, i, kTrainUsage);
    else if (a[i] == "--run-dir") opt.run_dir = option_value(a, i, kTrainUsage);
    else if (a[i] == "--backend") backend = option_value(a, i, kTrainUsage);
    else if (a[i] == "--peak-flops") {
      opt.peak_flops = parse_double(option_value(a, i, kTrainUsage), "--peak-flops");
      opt.peak_source = "--peak-flops";
    } else if (a[i].starts_with("-")) throw UserError(strprintf("unknown option '%s' for zero3d train\n%s", a[i].c_str(), kTrainUsage));
    else if (src.config_file.empty()) src.config_file = a[i];
    else throw UserError(strprintf("zero3d train takes one CONFIG file, got a second: '%s'", a[i].c_str()));
  }
  if (src.config_file.empty()) throw UserError(strprintf("zero3d train needs a CONFIG file\n%s", kTrainUsage));
  // From here on SIGUSR1/SIGTERM only ask for a checkpoint and a stop (at the first step boundary),
  // also when they arrive during start-up or a checkpoint load.
  install_stop_handlers();

  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Every rank reads the same files and arguments, so every rank reaches the same verdict here.
  Config cfg = load_config(src, world);
  ProcessGroups groups = ProcessGroups::create(cfg.tp_size, cfg.pp_size);
  opt.job = job_info(*groups.world);
  if (opt.run_dir.empty()) {
    opt.run_dir = default_run_dir(opt.job);  // rank 0's clock (or job id) decides for everyone
    std::vector<char> buf(256, '\0');
    std::copy_n(opt.run_dir.begin(), std::min<size_t>(opt.run_dir.size(), 255), buf.begin());
    groups.world->broadcast(buf.data(), buf.size(), 0);
    opt.run_dir = buf.data();
  }
  std::unique_ptr<Backend> be = make_backend(backend, opt.job.local_rank);
  if (opt.peak_flops <= 0 && be->kind() == BackendKind::cuda) {
    opt.peak_flops = known_accelerator_peak(be->describe());
    opt.peak_source = "known bf16 peak of " + be->describe();
  }
  Trainer trainer(cfg, opt, *be, groups);
  return trainer.run();
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
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    uint64_t n = prepare_token_file(texts, out);
    log_info("wrote %llu tokens to %s", static_cast<unsigned long long>(n), out.c_str());
  }
  return 0;
}

int cmd_bench(const Args& a) {
  if (a.empty() || wants_help(a)) {
    log_info("%s", kBenchUsage);
    return a.empty() ? kExitUserError : 0;
  }
  if (a[0] == "io") {
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
  if (a[0] != "gemm") throw UserError(strprintf("unknown bench '%s'\n%s", a[0].c_str(), kBenchUsage));
  std::vector<int> sizes = {512, 1024, 2048, 4096};
  double seconds = 1.0;
  std::string backend = "auto";
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--seconds") seconds = parse_double(option_value(a, i, kBenchUsage), "--seconds");
    else if (a[i] == "--backend") backend = option_value(a, i, kBenchUsage);
    else if (a[i] == "--sizes") {
      sizes.clear();
      std::string list = option_value(a, i, kBenchUsage);
      size_t pos = 0;
      while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        sizes.push_back(static_cast<int>(parse_double(item, "--sizes entry")));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else throw UserError(strprintf("unknown option '%s'\n%s", a[i].c_str(), kBenchUsage));
  }
  std::unique_ptr<Backend> be = make_backend(backend, job_info(*ProcessGroup::world()).local_rank);
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  log_info("# GEMM C = A B^T, fp32, %s, OPENBLAS_NUM_THREADS=%s", be->describe().c_str(), threads ? threads : "unset");
  log_info("%8s %12s %12s", "n", "ms/call", "GFLOP/s");
  for (int n : sizes) {
    GemmRate r = measure_gemm(*be, n, n, n, seconds);
    log_info("%8d %12.3f %12.1f", n, r.seconds_per_call * 1e3, r.flops_per_s / 1e9);
  }
  return 0;
}

int cmd_ckpt(const Args& a) {
  if (a.empty() || wants_help(a)) {
    log_info("%s", kCkptUsage);
    return a.empty() ? kExitUserError : 0;
  }
  const std::string& tool = a[0];
  if (tool != "inspect" && tool != "verify" && tool != "export")
    throw UserError(strprintf("unknown ckpt command '%s' (inspect, verify or export)\n%s", tool.c_str(), kCkptUsage));
  std::string path, out, weights = "master";
  for (size_t i = 1; i < a.size(); ++i) {
    if (tool == "export" && a[i] == "--out") out = option_value(a, i, kCkptUsage);
    else if (tool == "export" && a[i] == "--weights") weights = option_value(a, i, kCkptUsage);
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
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  if (tool == "inspect") return ckpt_inspect(path);
  if (tool == "verify") return ckpt_verify(path);
  return ckpt_export(path, out, weights);
}

}  // namespace zero3d
