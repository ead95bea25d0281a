#include "train/stop_signal.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace zero3d {

namespace {
std::atomic<int> received{0};
std::atomic<bool> catching{false};

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGUSR1);
  sigaddset(&s, SIGTERM);
  return s;
}

// A stop signal, on whichever thread took it: the flag while training, else its default effect.
void take(int sig) {
  if (catching.load()) {
    int none = 0;
    received.compare_exchange_strong(none, sig);  // the first one is the reason
    return;
  }
  std::signal(sig, SIG_DFL);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, sig);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  raise(sig);
}
extern "C" void on_stop_signal(int sig) { take(sig); }

// The thread that waits for SIGUSR1/SIGTERM.
void wait_for_signals() {
  const sigset_t s = stop_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&s, &sig) == 0) take(sig);
  }
}
}  // namespace

void block_stop_signals() {
  const sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);  // inherited by every thread created from here on
  // A library thread that unblocks signals for itself (MPI's progress threads may) takes them
  // through this handler; it only touches atomics.
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread(wait_for_signals).detach();
}

void install_stop_handlers() { catching.store(true); }

int stop_signal() { return received.load(); }

}  // namespace zero3d
