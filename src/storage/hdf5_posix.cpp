#include "storage/hdf5_posix.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/posix_io.h"

namespace zero3d {

namespace {

thread_local std::string t_error;       // the first failed read, write or close
thread_local std::string t_open_error;  // the last failed open (HDF5 probes for a file before it creates it)

void record(const char* doing, const char* path, const std::string& what) {
  if (t_error.empty()) t_error = strprintf("%s '%s': %s", doing, path, what.c_str());
}

// A file as the driver sees it. Plain data, HDF5's part first (HDF5 hands back that pointer).
struct PosixFile {
  H5FD_t pub;
  int fd;
  haddr_t eoa, eof;
  dev_t dev;
  ino_t ino;
  bool failed;  // a write failed: the rest are skipped, the file is bad (io_error() says why)
  char* path;
};
PosixFile* of(H5FD_t* f) { return reinterpret_cast<PosixFile*>(f); }
const PosixFile* of(const H5FD_t* f) { return reinterpret_cast<const PosixFile*>(f); }

constexpr haddr_t kMaxAddr = (haddr_t(1) << (8 * sizeof(off_t) - 1)) - 1;

H5FD_t* posix_open(const char* name, unsigned flags, hid_t, haddr_t maxaddr) {
  if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > kMaxAddr) return nullptr;
  int o = O_CLOEXEC | ((flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY);
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  int fd;
  do fd = ::open(name, o, 0666);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    t_open_error = strprintf("opening '%s': %s", name, strerror(errno));
    return nullptr;
  }
  t_open_error.clear();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    record("reading the status of", name, strerror(errno));
    ::close(fd);
    return nullptr;
  }
  auto* f = static_cast<PosixFile*>(std::calloc(1, sizeof(PosixFile)));
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->dev = st.st_dev, f->ino = st.st_ino;
  f->path = strdup(name);
  return &f->pub;
}

herr_t posix_close(H5FD_t* h) {
  PosixFile* f = of(h);
  if (::close(f->fd) != 0 && !f->failed) record("closing", f->path, strerror(errno));
  std::free(f->path);
  std::free(f);
  return 0;
}

int posix_cmp(const H5FD_t* a, const H5FD_t* b) {
  const PosixFile *x = of(a), *y = of(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t posix_query(const H5FD_t*, unsigned long* flags) {  // what sec2 says of itself
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE;
  return 0;
}

haddr_t posix_get_eoa(const H5FD_t* f, H5FD_mem_t) { return of(f)->eoa; }
herr_t posix_set_eoa(H5FD_t* f, H5FD_mem_t, haddr_t addr) {
  of(f)->eoa = addr;
  return 0;
}
haddr_t posix_get_eof(const H5FD_t* f, H5FD_mem_t) { return of(f)->eof; }
herr_t posix_get_handle(H5FD_t* f, hid_t, void** handle) {
  *handle = &of(f)->fd;
  return 0;
}

herr_t posix_read(H5FD_t* h, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  PosixFile* f = of(h);
  if (addr == HADDR_UNDEF || addr > kMaxAddr || size > kMaxAddr - addr) return -1;
  const std::string e = pread_fully(f->fd, buf, size, addr, /*zeros_past_end=*/true);
  if (e.empty()) return 0;
  record("reading", f->path, e);
  return -1;
}

herr_t posix_write(H5FD_t* h, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  PosixFile* f = of(h);
  if (f->failed) return 0;
  if (addr == HADDR_UNDEF || addr > kMaxAddr || size > kMaxAddr - addr) return -1;
  if (const std::string e = pwrite_fully(f->fd, buf, size, addr); !e.empty()) {
    record("writing", f->path, e);
    f->failed = true;
    return 0;  // HDF5 goes on and closes cleanly; the caller reads io_error()
  }
  if (addr + size > f->eof) f->eof = addr + size;
  return 0;
}

herr_t posix_truncate(H5FD_t* h, hid_t, hbool_t) {  // the file's size becomes its end of allocation, as sec2
  PosixFile* f = of(h);
  if (f->failed || f->eoa == f->eof) return 0;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) {
    record("extending", f->path, strerror(errno));
    f->failed = true;
    return 0;
  }
  f->eof = f->eoa;
  return 0;
}

H5FD_class_t make_class() {
  H5FD_class_t c{};
  c.name = "zero3d_posix";
  c.maxaddr = kMaxAddr;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = posix_open;
  c.close = posix_close;
  c.cmp = posix_cmp;
  c.query = posix_query;
  c.get_eoa = posix_get_eoa;
  c.set_eoa = posix_set_eoa;
  c.get_eof = posix_get_eof;
  c.get_handle = posix_get_handle;
  c.read = posix_read;
  c.write = posix_write;
  c.truncate = posix_truncate;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::memcpy(c.fl_map, map, sizeof map);
  return c;
}

hid_t driver_id() {
  static const H5FD_class_t cls = make_class();
  static std::mutex m;
  static hid_t id = H5I_INVALID_HID;
  std::lock_guard<std::mutex> lock(m);
  if (id < 0 || H5Iis_valid(id) <= 0) id = H5FDregister(&cls);
  return id;
}

}  // namespace

Hid posix_file_access() {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  HDF5_CHECK(H5Pset_driver(fapl.get(), driver_id(), nullptr));
  return fapl;
}

std::string io_error() { return t_error.empty() ? t_open_error : t_error; }
void clear_io_error() { t_error.clear(), t_open_error.clear(); }

}  // namespace zero3d
