#include "train/monitors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/log.h"
#include "core/posix_io.h"

namespace zero3d {

namespace fs = std::filesystem;

namespace {
// The rows of a CSV up to `samples` (and its header), rewritten atomically (as metrics.jsonl is).
void keep_rows_up_to(const std::string& path, int64_t samples) {
  std::ifstream in(path);
  std::string line, kept;
  bool header = true;
  while (std::getline(in, line)) {
    if (header || std::strtoll(line.c_str(), nullptr, 10) <= samples) kept += line + "\n";
    header = false;
  }
  in.close();
  write_file_atomic(path, kept, /*durable=*/false, "csv_monitor file");
}
}  // namespace

CsvMonitor::CsvMonitor(const MonitorConfig& cfg, const std::string& run_dir, int64_t resume_samples)
    : dir_((cfg.output_path.empty() ? run_dir : cfg.output_path) + "/" + cfg.job_name) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw UserError(strprintf("csv_monitor: cannot create '%s': %s", dir_.c_str(), ec.message().c_str()));
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().extension() == ".csv") keep_rows_up_to(e.path().string(), resume_samples);
}

void CsvMonitor::write(const std::string& name, double value, int64_t samples) {
  const auto path = [&] {  // the metric's file: '/' and ' ' as '_'
    std::string file = name;
    for (char& ch : file)
      if (ch == '/' || ch == ' ') ch = '_';
    return dir_ + "/" + file + ".csv";
  };
  auto it = files_.find(name);
  if (it == files_.end()) {
    AppendFile f;
    if (const std::string e = f.open(path()); !e.empty())
      throw UserError(strprintf("csv_monitor: cannot open '%s': %s", path().c_str(), e.c_str()));
    it = files_.emplace(name, std::move(f)).first;
  }
  AppendFile& f = it->second;
  std::string row = strprintf("%lld,%s\n", static_cast<long long>(samples), format_double(value).c_str());
  if (f.size() == 0) row = "step," + name.substr(name.rfind('/') + 1) + "\n" + row;  // a fresh file: its header
  const std::string failed = f.append(row);
  if (failed.empty() || warned_) return;
  warned_ = true;
  log_warn("csv_monitor: a row of '%s' was not written (%s); the run goes on, and this warning is not repeated",
           path().c_str(), failed.c_str());
}

std::string report_comms(const CommLog& log, MetricsLog* metrics, int steps) {
  std::string table = strprintf("%-10s %-15s %8s %14s %12s %12s %12s %12s\n", "group", "collective", "calls",
                                "msg size (B)", "total (ms)", "mean (ms)", "algbw GB/s", "busbw GB/s");
  for (const auto& [key, st] : log.stats) {
    const auto& [group, op] = key;
    const double factor = bus_share(op, st.group_size);
    const double algbw = st.seconds > 0 ? st.msg_bytes / st.seconds : 0;
    const double mean = st.calls ? st.seconds / st.calls : 0;
    table += strprintf("%-10s %-15s %8lld %14llu %12.3f %12.4f %12.3f %12.3f\n", group.c_str(), op.c_str(),
                       static_cast<long long>(st.calls),
                       static_cast<unsigned long long>(st.calls ? st.msg_bytes / st.calls : 0), 1e3 * st.seconds,
                       1e3 * mean, algbw / 1e9, algbw * factor / 1e9);
    if (metrics)
      metrics->write(MetricsRecord("comms")
                         .add("steps", steps)
                         .add("group", group)
                         .add("group_size", st.group_size)
                         .add("op", op)
                         .add("calls", st.calls)
                         .add("msg_bytes", static_cast<int64_t>(st.msg_bytes))
                         .add("sent_bytes", static_cast<int64_t>(st.sent_bytes))
                         .add("total_s", st.seconds)
                         .add("mean_s", mean)
                         .add("algbw_bytes_per_s", algbw)
                         .add("busbw_bytes_per_s", algbw * factor));
  }
  return table;
}

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kb) == 1) m.rss = kb * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kb) == 1) m.peak = kb * 1024;
  }
  std::ifstream rollup("/proc/self/smaps_rollup");
  while (std::getline(rollup, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "Pss: %lld kB", &kb) == 1) m.pss = kb * 1024;
  }
  return m;
}

}  // namespace zero3d
