// zero3d: GPT training with ZeRO inside a data x tensor x pipeline grid.
// main() is the table of contents: MPI, then one subcommand. A UserError on any rank
// becomes one line on stderr and exit code 2 on every rank (the ranks agree before leaving).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "app/commands.h"
#include "core/check.h"
#include "core/log.h"
#include "kernels/host/cpu_kernels.h"
#include "parallel/job.h"
#include "core/stop_signal.h"

using namespace zero3d;

static std::string usage_main() {
  return "usage: zero3d COMMAND [options]   (zero3d COMMAND --help for each)\n"
         "commands:\n"
         "  train CONFIG.json       train a GPT model\n"
         "  data prepare TEXT...    make an llm.c token file from text\n"
         "  bench gemm|kernels|io|comm|machine  measure the GEMMs, the host kernels per ISA level, the\n"
         "                          file system's write rate, the collectives, or the rates plan prices with\n"
         "  ckpt inspect|verify|export  look into, check or export a checkpoint\n"
         "  generate CKPT --prompt TEXT  continue a prompt with a checkpoint's model\n"
         "  eval CKPT --tokens FILE  the loss and perplexity of a checkpoint's model on a token file\n"
         "  plan CONFIG --ranks N   which layouts fit: every layout's memory per rank, before the job\n"
         "  --version               print the version and the backends built in\n";
}

static int dispatch(const Args& args) {
  if (args.empty()) {
    fprintf(stderr, "%s", usage_main().c_str());
    return kExitUserError;
  }
  const std::string& cmd = args[0];
  Args rest(args.begin() + 1, args.end());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    log_info("%s", usage_main().c_str());
    return 0;
  }
  if (cmd == "--version") {
    log_info("zero3d %s (backends: host%s%s)", ZERO3D_VERSION,
#if defined(ZERO3D_HAVE_CUDA)
             ", cuda",
#else
             "",
#endif
#if defined(ZERO3D_HAVE_KOKKOS)
             ", kokkos"
#else
             ""
#endif
    );
    return 0;
  }
  if (cmd == "train") return cmd_train(rest);
  if (cmd == "data") return cmd_data(rest);
  if (cmd == "bench") return cmd_bench(rest);
  if (cmd == "ckpt") return cmd_ckpt(rest);
  if (cmd == "generate") return cmd_generate(rest);
  if (cmd == "eval") return cmd_eval(rest);
  if (cmd == "plan") return cmd_plan(rest);
  throw UserError(strprintf("unknown command '%s'\n%s", cmd.c_str(), usage_main().c_str()));
}

int main(int argc, char** argv) {
  die_with_launcher();   // a rank whose mpirun/srun is gone must not train on alone
  block_stop_signals();  // before any thread exists: SIGUSR1/SIGTERM go to one waiting thread only
  // Started without a launcher (zero3d plan, ckpt inspect, ...), Open MPI's singleton would start a
  // daemon (orted) first, 0.2 s of every such command; zero3d never spawns ranks, so it needs none.
  // A launcher's ranks never read this; a value the user set wins.
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  int provided = 0;
  // MULTIPLE: the watchdog thread and the checkpoint writer call MPI beside the training thread
  // (without it both are off: parallel/watchdog.h, ckpt/writer.h).
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  set_log_rank(rank);
  int rc = 0;
  {
    std::string error;
    try {
      cpu::use_level("auto", "compute.isa");  // ZERO3D_ISA, before any kernel runs
      rc = dispatch(Args(argv + 1, argv + argc));
    } catch (const UserError& e) {
      error = e.what();
      rc = kExitUserError;
    } catch (const RunError& e) {
      error = e.what();
      rc = e.code;
    } catch (const std::bad_alloc&) {  // a host allocation the memory plan did not foresee
      error = "out of host memory (an allocation failed); zero3d plan CONFIG --ranks N --explain sizes the layout";
      rc = kExitUserError;
    }
    // Agree: the lowest rank that failed reports; every rank exits with the same code.
    int first_failed = error.empty() ? world : rank, reporter = world, code = rc;
    MPI_Allreduce(&first_failed, &reporter, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&rc, &code, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (reporter < world && rank == reporter) fprintf(stderr, "zero3d: error: %s\n", error.c_str());
    rc = code;
  }
  MPI_Finalize();
  return rc;
}
