// train/stop_signal.h: SIGUSR1 and SIGTERM ask the run to stop cleanly. The trainer polls the flag
// at every step boundary, agrees on it over all ranks (one all-reduce), writes a checkpoint and
// exits with kExitStopped, so a Slurm job can use --signal=B:USR1@120 and --requeue and lose
// nothing. A second signal changes nothing: the stop is already under way.
//
// The signals never interrupt a computing thread: block_stop_signals(), first thing in main and
// before any thread exists, blocks them in every thread the process will create (MPI's, OpenMP's)
// and starts one thread that waits for them with sigwait. A signal handler running on a compute
// thread's stack corrupted the heap inside oneDNN's JIT GEMMs (seen under srun, 2 runs in 3).
// Before install_stop_handlers() (and in commands other than train) the waiter gives a signal its
// default effect: the process ends by it.
#pragma once

namespace zero3d {

void block_stop_signals();     // main(), before MPI_Init
void install_stop_handlers();  // from here on SIGUSR1/SIGTERM only set the flag
int stop_signal();             // the signal received since install, 0 if none

}  // namespace zero3d
