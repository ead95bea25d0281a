// tests/support/fiu_shim.cpp: preloaded before libfiu's POSIX preload in the fault tests
// (tests/cli/test_faults.sh). libfiu 1.1 calls strdup inside fiu_fail, holding its own lock; its
// strdup wrapper then looks the real one up with dlsym, which waits for the loader's lock. When
// MPI_Init is dlopen-ing its components on another thread (which waits for libfiu's lock in its
// malloc wrapper), the process deadlocks before main's first line, in about one start of three.
// This strdup, found first, needs neither lock.
#include <cstddef>
#include <cstring>

extern "C" void* __libc_malloc(size_t);

extern "C" char* strdup(const char* s) {
  const size_t n = std::strlen(s) + 1;
  char* p = static_cast<char*>(__libc_malloc(n));
  if (p) std::memcpy(p, s, n);
  return p;
}
