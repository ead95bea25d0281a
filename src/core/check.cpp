#include "core/check.h"

#include <mpi.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>

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

void fatal(const char* library, const std::string& message, const char* statement, const char* file, int line) {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  fprintf(stderr, "zero3d: fatal %s error on rank %d (%s) at %s:%d\n  %s\n  -> %s\n", library, rank, host, file,
          line, statement, message.c_str());
  fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace zero3d
