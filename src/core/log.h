// core/log.h: rank-0 logging. log_info prints on world rank 0 only; log_warn on every rank that
// calls it, prefixed with the rank, because a warning often concerns one rank's view.
#pragma once

namespace zero3d {

void set_log_rank(int rank);
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace zero3d
