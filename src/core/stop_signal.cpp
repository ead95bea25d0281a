#include "core/stop_signal.h"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <thread>

#include "core/check.h"

namespace zero3d {

namespace {
std::atomic<int> received{0};
std::atomic<bool> stopping{false}, interrupting{false};  // install_stop_handlers, catch_interrupts

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGUSR1);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

// Whether the mode set so far catches `sig`.
bool caught(int sig) {
  if (stopping.load()) return sig == SIGUSR1 || sig == SIGTERM;
  if (interrupting.load()) return sig == SIGINT || sig == SIGTERM;
  return false;
}

// A signal, on whichever thread took it: the flag where the mode catches it, else its default
// effect. A second interrupt ends a command that is blocked where it cannot look at the flag (an
// open of a FIFO nobody writes), as a second Ctrl-C does elsewhere.
void take(int sig) {
  if (caught(sig) && !(interrupting.load() && received.load() != 0)) {
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

// The thread that waits for the signals.
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
  // through this handler; it only touches atomics. A shell starts background jobs with SIGINT
  // ignored: the handler takes it anyway, so Ctrl-C and `kill -INT` mean the same everywhere.
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::thread(wait_for_signals).detach();
}

void install_stop_handlers() { stopping.store(true); }

void catch_interrupts() { interrupting.store(true); }

int stop_signal() { return received.load(); }

void throw_if_interrupted(const char* doing) {
  const int sig = received.load();
  if (sig == 0) return;
  throw RunError(strprintf("%s stopped by %s; nothing half-written is left", doing, sig == SIGINT ? "SIGINT" : "SIGTERM"),
                 kExitInterrupted);
}

}  // namespace zero3d
