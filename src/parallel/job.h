// parallel/job.h: what a run takes from the way it was launched (mpirun, srun, sbatch), in one
// place: the node-local rank (for device selection), the Slurm job it belongs to (its default run
// directory, and its end time as a wall-time budget), and the thread settings it was given.
// Invariant: every field is the same on every rank where it must be (job id, seconds left: rank
// 0's view, broadcast), so decisions taken from it are collective-safe.
#pragma once
#include <limits>
#include <string>

#include "parallel/comm.h"

namespace zero3d {

struct JobInfo {
  int local_rank = 0, local_size = 1;  // among the ranks sharing this node (MPI_COMM_TYPE_SHARED)
  int nodes = 1;                       // world size / ranks per node of rank 0
  std::string slurm_job;               // SLURM_JOB_ID, or ARRAYJOB_TASK for a job array; "" outside Slurm
  // Seconds from now until the Slurm job's end time (SLURM_JOB_END_TIME, else `squeue -o %e`);
  // infinity outside Slurm or without a time limit.
  double seconds_left = std::numeric_limits<double>::infinity();
  std::string omp_threads, blas_threads;  // OMP_NUM_THREADS, OPENBLAS_NUM_THREADS as given ("" = unset)
  // Threads this rank computes with (host kernels and GEMM), and why: see rank_threads in job.cpp.
  // Ranks of a node may differ (their affinity masks), so it is this rank's value.
  int threads = 1;
  std::string threads_source;
  // The cores the whole run computes on (the MFU peak's): per node, its ranks' threads, capped by
  // the CPUs their affinity masks allow together (oversubscribed ranks share them). Same on every rank.
  int compute_cores = 1;
};

// Collective over `world`. Also sets this rank's thread count (cpu::set_threads).
JobInfo job_info(ProcessGroup& world);

// A rank started by a launcher (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_STEP_ID in the
// environment: mpirun, prterun, srun) dies with its parent (PR_SET_PDEATHSIG = SIGKILL): a launcher
// killed, or gone after a second SIGTERM, leaves no rank training on or committing a checkpoint
// into a run dir nobody watches. A run started from a shell (`nohup zero3d train ... &`) is left
// alone. Call first in main, before any thread: the signal follows the thread that forked us.
void die_with_launcher();

// runs/<slurm job> under Slurm, else runs/<date-time> (rank 0's clock; broadcast by the caller).
std::string default_run_dir(const JobInfo& job);

}  // namespace zero3d
