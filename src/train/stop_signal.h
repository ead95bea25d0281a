// train/stop_signal.h: SIGUSR1 and SIGTERM ask the run to stop cleanly. The handler only sets a
// flag; the trainer polls it at every step boundary, agrees on it over all ranks (one all-reduce),
// writes a checkpoint and exits with kExitStopped, so a Slurm job can use --signal=B:USR1@120 and
// --requeue and lose nothing. A second signal changes nothing: the stop is already under way.
#pragma once

namespace zero3d {

void install_stop_handlers();  // SIGUSR1, SIGTERM
int stop_signal();             // the signal received since install, 0 if none

}  // namespace zero3d
