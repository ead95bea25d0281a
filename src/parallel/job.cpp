#include "parallel/job.h"

#include <mpi.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "core/check.h"
#include "kernels/host/cpu_kernels.h"

namespace zero3d {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The job's end time as a Unix time, or 0 when unknown.
double slurm_end_time() {
  if (const std::string e = env("SLURM_JOB_END_TIME"); !e.empty()) return std::atof(e.c_str());
  const std::string id = env("SLURM_JOB_ID");
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) return 0;
  FILE* p = popen(("squeue -h -j " + id + " -o %e 2>/dev/null").c_str(), "r");
  if (!p) return 0;
  char line[128] = {};
  const bool got = std::fgets(line, sizeof line, p) != nullptr;
  pclose(p);
  std::tm tm = {};
  if (!got || !strptime(line, "%Y-%m-%dT%H:%M:%S", &tm)) return 0;  // "N/A", "Unknown": no limit
  tm.tm_isdst = -1;
  return static_cast<double>(std::mktime(&tm));
}

// Threads per rank: OMP_NUM_THREADS when set (OpenMP reads it itself; srun --cpus-per-task users set
// it, or get an affinity mask), else the CPUs this rank may run on, divided among the node's ranks
// when they all share one mask (mpirun without binding, e.g. oversubscribed): one thread per core.
int rank_threads(int local_size, std::string& source) {
  if (const std::string omp = env("OMP_NUM_THREADS"); !omp.empty() && std::atoi(omp.c_str()) > 0) {
    source = "OMP_NUM_THREADS";
    return std::atoi(omp.c_str());
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int mask = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (mask >= online && local_size > 1) {
    source = strprintf("%d CPUs shared by %d ranks on the node", mask, local_size);
    return std::max(1, mask / local_size);
  }
  source = strprintf("affinity mask of %d CPUs", mask);
  return std::max(1, mask);
}

// This rank's affinity mask as 64-bit words (cpu_set_t's 1024 CPUs), and its thread count last.
std::vector<uint64_t> mask_and_threads(int threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &set);
  std::vector<uint64_t> v(CPU_SETSIZE / 64 + 1, 0);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) v[c / 64] |= uint64_t{1} << (c % 64);
  v.back() = static_cast<uint64_t>(threads);
  return v;
}

}  // namespace

JobInfo job_info(ProcessGroup& world) {
  JobInfo j;
  j.omp_threads = env("OMP_NUM_THREADS");
  j.blas_threads = env("OPENBLAS_NUM_THREADS");
  double node_cores = 0;  // rank 0 of each node: its ranks' threads, capped by the CPUs their masks allow
  {
    const auto node = world.split_node("node");
    j.local_rank = node->rank();
    j.local_size = node->size();
    j.threads = rank_threads(j.local_size, j.threads_source);
    std::vector<uint64_t> all;
    const std::vector<uint64_t> mine = mask_and_threads(j.threads);
    node->all_gather_u64(mine, all);
    std::vector<uint64_t> cpus(mine.size() - 1, 0);
    uint64_t threads = 0;
    for (size_t at = 0; at < all.size(); at += mine.size()) {
      for (size_t w = 0; w < cpus.size(); ++w) cpus[w] |= all[at + w];
      threads += all[at + mine.size() - 1];
    }
    int available = 0;
    for (uint64_t w : cpus) available += std::popcount(w);
    if (j.local_rank == 0) node_cores = static_cast<double>(std::min<uint64_t>(threads, std::max(available, 1)));
  }
  j.compute_cores = static_cast<int>(world.all_reduce_sum(node_cores));
  cpu::set_threads(j.threads);
  j.slurm_job = env("SLURM_ARRAY_JOB_ID").empty() ? env("SLURM_JOB_ID")
                                                   : env("SLURM_ARRAY_JOB_ID") + "_" + env("SLURM_ARRAY_TASK_ID");
  // Rank 0 decides what every rank must agree on.
  double facts[2] = {static_cast<double>(j.local_size), 0};
  if (world.rank() == 0) {
    const double end = slurm_end_time();
    facts[1] = end > 0 ? end - static_cast<double>(std::time(nullptr)) : -1;
  }
  world.broadcast(host_mem(facts), sizeof facts, 0);
  j.nodes = std::max(1, world.size() / static_cast<int>(facts[0]));
  if (facts[1] >= 0) j.seconds_left = facts[1];
  j.slurm_job = world.broadcast_string(j.slurm_job, 0);
  return j;
}

void die_with_launcher() {
  bool launched = false;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_ID"})
    launched = launched || std::getenv(v) != nullptr;
  if (!launched) return;
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher died before the prctl took effect: we were reparented already.
  if (getppid() != parent) raise(SIGKILL);
}

std::string default_run_dir(const JobInfo& job) {
  if (!job.slurm_job.empty()) return "runs/" + job.slurm_job;
  std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "runs/%Y%m%d-%H%M%S", std::localtime(&now));
  return buf;
}

}  // namespace zero3d
