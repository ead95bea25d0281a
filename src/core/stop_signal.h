// core/stop_signal.h: what SIGUSR1, SIGTERM and SIGINT do, one mechanism for every subcommand.
// - train (install_stop_handlers): SIGUSR1/SIGTERM ask the run to stop cleanly. The trainer polls
//   the flag at every step boundary, agrees on it over all ranks (one all-reduce), writes a
//   checkpoint and exits with kExitStopped, so a Slurm job can use --signal=B:USR1@120 and
//   --requeue and lose nothing. A second signal changes nothing: the stop is already under way.
//   SIGINT keeps its default effect there (the process ends; the last committed checkpoint stays).
// - every other command that runs long (catch_interrupts: data prepare, ckpt, eval, generate, plan;
//   bench keeps the default effect: its ranks measure collectives in lockstep for seconds):
//   SIGINT/SIGTERM set the flag; the command calls throw_if_interrupted() between units of work,
//   which throws a RunError with kExitInterrupted, so what it was writing is removed as the stack
//   unwinds (AtomicFile, AtomicDir) and the job ends with one line and the documented code. A
//   second one has its default effect (for a command blocked where it cannot look at the flag).
// - before either, and in commands that install neither: a signal has its default effect.
//
// The signals never interrupt a computing thread: block_stop_signals(), first thing in main and
// before any thread exists, blocks them in every thread the process will create (MPI's, OpenMP's)
// and starts one thread that waits for them with sigwait. A signal handler running on a compute
// thread's stack corrupted the heap inside oneDNN's JIT GEMMs (seen under srun, 2 runs in 3).
#pragma once

namespace zero3d {

void block_stop_signals();     // main(), before MPI_Init
void install_stop_handlers();  // train: from here on SIGUSR1/SIGTERM only set the flag
void catch_interrupts();       // other commands: from here on SIGINT/SIGTERM only set the flag
int stop_signal();             // the signal received since install, 0 if none
// A RunError (kExitInterrupted) naming the signal when one was caught; `doing` says what stopped
// ("data prepare"), for the line the job ends with.
void throw_if_interrupted(const char* doing);

}  // namespace zero3d
