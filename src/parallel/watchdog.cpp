#include "parallel/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "core/device_collectives.h"
#include "parallel/comm_context.h"

namespace zero3d {

namespace {

constexpr int kAsk = 7301, kAnswer = 7302;
constexpr double kGraceS = 3.0;      // how long the asking rank collects answers
constexpr double kDeferS = 10.0;     // how long a higher asking rank lets the lowest one print first
const char* const kSlotNames[Watchdog::kSlots] = {"training", "checkpoint writer"};

struct Frame {
  std::string what, detail;
  Clock::time_point start, deadline;
};

struct SlotState {
  std::vector<Frame> stack;  // outermost first
  Clock::time_point idle_since = Clock::now();
};

struct State {
  std::mutex m;
  SlotState slots[Watchdog::kSlots];
  std::atomic<bool> running{false}, stop{false};
  std::thread thread;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::string host;
};

State& state() {
  static State s;
  return s;
}

thread_local Watchdog::Slot tl_slot = Watchdog::Slot::training;

// "0, 2-3, 5"
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += '-', out += std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// What this rank's threads are doing: a key (comparable across ranks) and how long for.
struct Report {
  std::string key;
  double seconds = 0;
  std::string host;
};

Report my_report(State& s) {
  std::lock_guard<std::mutex> lock(s.m);
  Report r;
  r.host = s.host;
  for (int i = 0; i < Watchdog::kSlots; ++i) {
    const SlotState& slot = s.slots[i];
    std::string text;
    if (slot.stack.empty()) {
      if (i != static_cast<int>(Watchdog::Slot::training)) continue;  // an idle writer says nothing
      text = "computing, in no collective or I/O,";
      r.seconds = std::max(r.seconds, seconds_since(slot.idle_since));
    } else {
      for (const Frame& f : slot.stack) text += (text.empty() ? "in " : ", in ") + f.what;
      if (!slot.stack.back().detail.empty()) text += " (" + slot.stack.back().detail + ")";
      r.seconds = std::max(r.seconds, seconds_since(slot.stack.back().start));
    }
    r.key += (r.key.empty() ? "" : "; ") + std::string(kSlotNames[i]) + " thread " + text;
  }
  return r;
}

std::string encode(const Report& r) { return strprintf("%.1f\t%s\t%s", r.seconds, r.host.c_str(), r.key.c_str()); }
Report decode(const std::string& text) {
  Report r;
  const size_t a = text.find('\t'), b = text.find('\t', a + 1);
  if (a == std::string::npos || b == std::string::npos) return {text, 0, "?"};
  r.seconds = std::atof(text.substr(0, a).c_str());
  r.host = text.substr(a + 1, b - a - 1);
  r.key = text.substr(b + 1);
  return r;
}

// The watchdog thread: answers other ranks' questions, and asks them when a deadline passes here.
class Worker {
 public:
  explicit Worker(State& s) : s_(s) {}

  void run() {
    while (!s_.stop.load()) {
      answer();
      if (std::string why = expired(); !why.empty()) diagnose(why);  // does not return
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (auto& [text, req] : sends_) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }

 private:
  // Other ranks' questions, each answered with this rank's report.
  void answer() {
    int flag = 0;
    MPI_Status st;
    while (MPI_Iprobe(MPI_ANY_SOURCE, kAsk, s_.comm, &flag, &st) == MPI_SUCCESS && flag) {
      MPI_Recv(nullptr, 0, MPI_BYTE, st.MPI_SOURCE, kAsk, s_.comm, MPI_STATUS_IGNORE);
      askers_.push_back(st.MPI_SOURCE);
      send(encode(my_report(s_)), st.MPI_SOURCE, kAnswer);
    }
  }
  void send(std::string text, int to, int tag) {
    sends_.emplace_back(std::move(text), MPI_REQUEST_NULL);
    auto& [t, req] = sends_.back();
    MPI_Isend(t.data(), static_cast<int>(t.size()), MPI_CHAR, to, tag, s_.comm, &req);
  }
  void reap() {
    while (!sends_.empty()) {
      int done = 0;
      MPI_Test(&sends_.front().second, &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sends_.pop_front();
    }
  }

  // The first phase past its deadline, described; "" when none.
  std::string expired() {
    std::lock_guard<std::mutex> lock(s_.m);
    const auto now = Clock::now();
    for (int i = 0; i < Watchdog::kSlots; ++i)
      for (const Frame& f : s_.slots[i].stack)
        if (now > f.deadline) {
          const Frame& inner = s_.slots[i].stack.back();
          const double limit = std::chrono::duration<double>(f.deadline - f.start).count();
          return strprintf("rank %d's %s thread passed its limit of %.0f s%s in %s%s", s_.rank, kSlotNames[i], limit,
                           &f == &inner ? "" : (" for " + f.what).c_str(), inner.what.c_str(),
                           inner.detail.empty() ? "" : (" (" + inner.detail + ")").c_str());
        }
    return "";
  }

  [[noreturn]] void diagnose(const std::string& why) {
    for (int r = 0; r < s_.size; ++r)
      if (r != s_.rank) send("", r, kAsk);
    std::map<int, Report> answers;
    answers[s_.rank] = my_report(s_);
    const auto t0 = Clock::now();
    while (seconds_since(t0) < kGraceS && static_cast<int>(answers.size()) < s_.size) {
      answer();
      int flag = 0;
      MPI_Status st;
      while (MPI_Iprobe(MPI_ANY_SOURCE, kAnswer, s_.comm, &flag, &st) == MPI_SUCCESS && flag) {
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        std::string text(static_cast<size_t>(n), '\0');
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kAnswer, s_.comm, MPI_STATUS_IGNORE);
        answers[st.MPI_SOURCE] = decode(text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // One line per job: a lower rank that asked too prints it; give it the time to.
    const auto t1 = Clock::now();
    while (std::any_of(askers_.begin(), askers_.end(), [&](int r) { return r < s_.rank; }) && seconds_since(t1) < kDeferS) {
      answer();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::map<std::string, std::vector<int>> by_key;
    std::map<std::string, double> longest;
    std::map<std::string, std::vector<std::string>> hosts;
    std::vector<int> silent;
    for (int r = 0; r < s_.size; ++r) {
      auto it = answers.find(r);
      if (it == answers.end()) {
        silent.push_back(r);
        continue;
      }
      by_key[it->second.key].push_back(r);
      longest[it->second.key] = std::max(longest[it->second.key], it->second.seconds);
      auto& h = hosts[it->second.key];
      if (std::find(h.begin(), h.end(), it->second.host) == h.end()) h.push_back(it->second.host);
    }
    std::vector<std::pair<std::string, std::vector<int>>> groups(by_key.begin(), by_key.end());
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
    std::string where;
    for (const auto& [key, ranks] : groups) {
      std::string hs;
      for (const std::string& h : hosts[key]) hs += (hs.empty() ? "" : ",") + h;
      where += strprintf("%srank%s %s (%s): %s for %.0f s", where.empty() ? "" : "; ", ranks.size() > 1 ? "s" : "",
                         rank_list(ranks).c_str(), hs.c_str(), key.c_str(), longest[key]);
    }
    if (!silent.empty())
      where += strprintf("; rank%s %s: no answer (the process is dead or wholly stuck)", silent.size() > 1 ? "s" : "",
                         rank_list(silent).c_str());
    fprintf(stderr, "zero3d: watchdog: at step %lld, %s. Where every rank is: %s. Aborting the job (exit code %d).\n",
            static_cast<long long>(comm_context().step), why.c_str(), where.c_str(), kExitWatchdog);
    abort_device_collectives();  // the device's library first, so the GPU is released
    abort_mpi_job(kExitWatchdog);
  }

  State& s_;
  std::deque<std::pair<std::string, MPI_Request>> sends_;
  std::vector<int> askers_;
};

}  // namespace

bool Watchdog::start() {
  State& s = state();
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE || s.running.load()) return s.running.load();
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm));
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  s.host = host_name();
  s.stop = false;
  s.running = true;
  s.thread = std::thread([&s] { Worker(s).run(); });
  return true;
}

void Watchdog::stop() {
  State& s = state();
  if (!s.running.load()) return;
  s.stop = true;
  s.thread.join();
  s.running = false;
  MPI_Comm_free(&s.comm);
}

bool Watchdog::running() { return state().running.load(std::memory_order_relaxed); }

void Watchdog::set_thread_slot(Slot slot) { tl_slot = slot; }

Watchdog::Phase::Phase(std::string what, double timeout_s) {
  State& s = state();
  if (!s.running.load(std::memory_order_relaxed)) return;
  on_ = true;
  const auto now = Clock::now();
  const auto limit = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::lock_guard<std::mutex> lock(s.m);
  s.slots[static_cast<int>(tl_slot)].stack.push_back({std::move(what), "", now, limit});
}

Watchdog::Phase::~Phase() {
  if (!on_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  SlotState& slot = s.slots[static_cast<int>(tl_slot)];
  slot.stack.pop_back();
  if (slot.stack.empty()) slot.idle_since = Clock::now();
}

void Watchdog::Phase::progress(const std::string& detail) {
  if (!on_) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.m);
  s.slots[static_cast<int>(tl_slot)].stack.back().detail = detail;
}

}  // namespace zero3d
