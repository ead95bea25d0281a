#include "core/log.h"

#include <cstdarg>
#include <cstdio>

namespace zero3d {

static int g_log_rank = 0;

void set_log_rank(int rank) { g_log_rank = rank; }

void log_info(const char* fmt, ...) {
  if (g_log_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
  fflush(stdout);
}

void log_warn(const char* fmt, ...) {
  fprintf(stderr, "zero3d: warning (rank %d): ", g_log_rank);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

}  // namespace zero3d
