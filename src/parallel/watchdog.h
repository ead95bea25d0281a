// parallel/watchdog.h: one thread per process that turns any hang into one line and exit 3.
//
// Every thread that may block on other ranks (the training thread in a collective or a
// checkpoint load, the checkpoint writer) announces what it is doing and by when it must be done:
// a Phase. Phases nest (a collective inside a save); the innermost names the wait, the outer ones
// its context, and the earliest deadline counts. The watchdog thread checks the deadlines. When
// one passes it asks every rank what each of its threads is doing, over a duplicate of the world
// communicator that nothing else uses, so a rank stuck anywhere else still answers (its watchdog
// thread does). After a short grace the lowest rank that asked prints one line for the job, the
// ranks grouped by what they are doing, those that never answered named too (a dead or wholly
// stuck process), and aborts the job with exit code 3.
//
// Needs MPI_THREAD_MULTIPLE (the watchdog thread calls MPI while others are inside MPI). Without
// it start() returns false and PendingOp::wait aborts on its own deadline, one line per rank.
#pragma once
#include <string>

namespace zero3d {

class Watchdog {
 public:
  // The thread a phase belongs to: the training thread (the default of every thread) or the
  // checkpoint writer (the writer thread calls set_thread_slot(Slot::writer) once).
  enum class Slot { training = 0, writer = 1 };
  static constexpr int kSlots = 2;

  // Starts the watchdog thread; false (and nothing started) without MPI_THREAD_MULTIPLE.
  // Collective over the world (it duplicates the world communicator).
  static bool start();
  static void stop();  // collective; joins the thread
  static bool running();
  static void set_thread_slot(Slot s);

  // What this thread does until the Phase ends: `what` ("checkpoint save of step 20", "all-reduce
  // on the dp group (rank 1 of 2)"), at most timeout_s from now. No-op while the watchdog is off.
  class Phase {
   public:
    Phase(std::string what, double timeout_s);
    ~Phase();
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    // Where inside the phase the thread is ("dataset 78 of 156"), shown in the report.
    void progress(const std::string& detail);

   private:
    bool on_ = false;
  };
};

}  // namespace zero3d
