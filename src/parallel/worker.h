// parallel/worker.h: one thread that runs jobs in the order they were posted. The shared-memory
// collectives run on one per group, and a group's sends on another (send progress, mpi_group.cpp):
// work that must advance while the caller computes, which OpenMPI does not do by itself.
// The thread starts with the first job; the destructor runs every posted job, then joins.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace zero3d {

class OrderedWorker {
 public:
  OrderedWorker() = default;
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;
  void post(std::function<void()> job);

 private:
  void run();
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
};

}  // namespace zero3d
