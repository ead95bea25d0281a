// train/monitors.h: DeepSpeed's monitors and logs beside metrics.jsonl: csv_monitor (one CSV
// per metric, DeepSpeed's file layout), the comms_logger summary, and memory_breakdown.
// Invariant: all of them report what the trainer measured; none measures anything itself except
// the resident memory read from /proc.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/comm.h"
#include "train/metrics.h"

namespace zero3d {

// csv_monitor: <output_path>/<job_name>/<name with '/' and ' ' as '_'>.csv holding "step,<last part
// of the name>" then one "step,value" row per event, as deepspeed/monitor/csv_monitor.py writes
// them; the step is the number of samples trained (DeepSpeed's global_samples). Rank 0 only.
class CsvMonitor {
 public:
  // Opens the directory; on a resumed run drops the rows past `resume_samples` (a run that died
  // after its checkpoint wrote them), so each step is in each file once.
  CsvMonitor(const MonitorConfig& cfg, const std::string& run_dir, int64_t resume_samples);
  // A row written whole or not at all: a row that fails (disk full) is dropped with one warning
  // for the run, as metrics.jsonl's.
  void write(const std::string& name, double value, int64_t samples);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, AppendFile> files_;
  bool warned_ = false;
};

// comms_logger's table, from this rank's comms log: per group and collective, calls, message size,
// total and mean latency, algorithmic bandwidth (message bytes / latency) and bus bandwidth
// (algorithmic * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 otherwise:
// nccl-tests' convention, which DeepSpeed's comms logger follows). Returns the printed text; one
// "comms" record per row into `metrics` when given.
std::string report_comms(const CommLog& log, MetricsLog* metrics, int steps);

// Resident set size of this process now and its peak (VmRSS, VmHWM), and its proportional share
// (Pss: a page mapped by k processes counts 1/k), bytes. Ranks of a node map each other's
// shared-memory buffers (parallel/shm_collectives), which each one's RSS counts again: the ranks'
// Pss add up to what the node holds, their RSS does not.
struct ResidentMemory {
  int64_t rss = 0, peak = 0, pss = 0;
};
ResidentMemory resident_memory();

}  // namespace zero3d
