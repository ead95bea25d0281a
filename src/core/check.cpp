#include "core/check.h"

#include <dlfcn.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace zero3d {

std::string strprintf(const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? n : 0, '\0');
  vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "unknown MPI error " + std::to_string(code);
  return std::string(buf, len);
}

std::string host_name() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return host;
}

namespace {
// This rank (-1 before MPI_Init or after MPI_Finalize) and its host, for a last line.
struct Where {
  int rank = -1;
  bool mpi = false;
  std::string host = host_name();
  Where() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    mpi = initialized && !finalized;
    if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  [[noreturn]] void abort(int code) const {
    if (mpi) abort_mpi_job(code);
    fflush(stderr);
    std::exit(code);
  }
};
}  // namespace

void abort_mpi_job(int exit_code) {
  fflush(stderr);
  // OpenMPI 4's MCA parameter orte_execute_quiet ("do not output error and help messages") is
  // read-only through MPI_T, so it is set where it lives; other MPIs lack the symbol.
  if (auto* quiet = static_cast<bool*>(dlsym(RTLD_DEFAULT, "orte_execute_quiet"))) *quiet = true;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

void fatal(const char* library, const std::string& message, const char* statement, const char* file, int line) {
  const Where w;
  fprintf(stderr, "zero3d: fatal %s error on rank %d (%s) at %s:%d\n  %s\n  -> %s\n", library, w.rank, w.host.c_str(), file,
          line, statement, message.c_str());
  w.abort(1);
}

void abort_job(const std::string& message, int exit_code) {
  const Where w;
  // Ranks that find one fault at once (every rank reads the changed token file) would each print
  // and abort, and OpenMPI's reports of the aborts collide (ORTE_ERROR_LOG: Data unpack would read
  // past end of buffer). The lowest goes first; a higher rank waits a moment, in which the first
  // abort has usually ended it: one line for the job.
  if (w.mpi && w.rank > 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  fprintf(stderr, "zero3d: error (rank %d, %s): %s\n", w.rank, w.host.c_str(), message.c_str());
  w.abort(exit_code);
}

}  // namespace zero3d
