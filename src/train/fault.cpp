#include "train/fault.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "storage/checks.h"
#include "zero/engine_faults.h"

namespace zero3d {

FaultInjector::FaultInjector(int world_rank) : rank_(world_rank) {
  const char* e = std::getenv("ZERO3D_FAULT");
  if (!e) return;
  std::stringstream list(e);
  for (std::string s; std::getline(list, s, ',');) {
    const size_t a = s.find(':'), b = s.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    faults_.push_back({s.substr(0, a), std::atoi(s.substr(a + 1, b - a - 1).c_str()), std::atoi(s.substr(b + 1).c_str())});
  }
}

bool FaultInjector::at(const char* kind, int step) const {
  for (const One& o : faults_)
    if (o.kind == kind && o.rank == rank_ && o.step == step) return true;
  return false;
}

void FaultInjector::before_load() const {
  if (at("pause_load", 0)) pause_for_fault_injection("before it loads a checkpoint");
}

void FaultInjector::before_tokenizer_copy(int step) const {
  if (at("pause_tokenizer_copy", step))
    pause_for_fault_injection(strprintf("before it copies the tokenizer beside the checkpoint of step %d", step));
}

SaveFaults FaultInjector::before_save(int step, const std::string& ckpt_dir) const {
  const std::string filler = ckpt_dir + "/.fill";
  if (at("fill_disk", step)) {
    const int64_t left = free_bytes(ckpt_dir) - (512 << 10);
    std::FILE* f = std::fopen(filler.c_str(), "wb");
    if (f && left > 0 && posix_fallocate(fileno(f), 0, left) == 0)
      log_warn("fault injection: filled the checkpoint file system before the save of step %d", step);
    if (f) std::fclose(f);
  }
  if (at("free_disk", step)) std::remove(filler.c_str());
  return {at("stall_save", step), at("pause_save_start", step), at("pause_save_middle", step)};
}

void FaultInjector::before_step(int step, ZeroEngine& engine, const SwapFiles& swap) const {
  if (at("inf", step)) EngineFaults::inject_inf_gradient(engine);
  if (at("truncate_swap", step))
    for (const std::string& f : {swap.optimizer, swap.param})
      if (!f.empty() && ::truncate(f.c_str(), 0) != 0) log_warn("truncate_swap: %s: %s", f.c_str(), strerror(errno));
}

void FaultInjector::before_reduction(int step) const {
  if (at("hang", step))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void FaultInjector::after_step(int step, ZeroEngine& engine) const {
  if (at("perturb", step)) EngineFaults::perturb_replica(engine);
}

}  // namespace zero3d
