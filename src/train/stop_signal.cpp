#include "train/stop_signal.h"

#include <csignal>

namespace zero3d {

namespace {
volatile std::sig_atomic_t received = 0;
extern "C" void on_stop_signal(int sig) { received = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file calls in progress go on
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return received; }

}  // namespace zero3d
