#include "train/versions.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cblas.h>
#include <hdf5.h>
#include <mpi.h>
#include <pcre2.h>

#include <cctype>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>

#include "core/check.h"
#include "core/library_file.h"
#include "kernels/host/gemm.h"

// The build's facts, from the file CMakeLists.txt writes at build time (target zero3d_build_facts).
namespace zero3d::build {
extern const char* const commit;        // "54503e4ab12c", "-dirty" appended, or "unknown"
extern const char* const commit_date;   // "2026-12-07", or ""
extern const char* const compiler;      // "GNU 12.2.0"
extern const char* const build_type;    // "Release"
extern const char* const cblas_library; // the CBLAS linked: "libopenblas.so"
extern const char* const cuda_toolkit;  // the toolkit the CUDA module was built with, "" without one
}  // namespace zero3d::build

namespace zero3d {

namespace {

// An MPI library's version text, first line only, each run of blanks made one space, cut at the
// first comma: "Open MPI v4.1.4", "MPICH Version: 4.0.2", "Intel(R) MPI Library 2021.6 for Linux* OS".
std::string first_line(const char* text) {
  std::string out;
  for (const char* p = text; *p && *p != '\n' && *p != ','; ++p) {
    const bool blank = std::isspace(static_cast<unsigned char>(*p));
    if (blank && (out.empty() || out.back() == ' ')) continue;
    out += blank ? ' ' : *p;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

LibraryVersion mpi() {
#if defined(OMPI_MAJOR_VERSION)
  std::string built = strprintf("Open MPI %d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(I_MPI_VERSION)
  std::string built = "Intel MPI " I_MPI_VERSION;
#elif defined(MVAPICH2_VERSION)
  std::string built = "MVAPICH2 " MVAPICH2_VERSION;
#elif defined(MPICH_VERSION)
  std::string built = "MPICH " MPICH_VERSION;
#else
  std::string built = "an MPI";
#endif
  built += strprintf(" (MPI %d.%d)", MPI_VERSION, MPI_SUBVERSION);
  // Both callable before MPI_Init and after MPI_Finalize (MPI 3.1, 8.1.1 and 8.7).
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(text, &len);
  MPI_Get_version(&major, &minor);
  return {"MPI", built, first_line(text) + strprintf(" (MPI %d.%d)", major, minor),
          library_file(&MPI_Get_library_version), ""};
}

LibraryVersion hdf5() {
  std::string built = strprintf("%d.%d.%d", H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE);
#if defined(H5_HAVE_PARALLEL)
  built += " (parallel)";
#endif
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return {"HDF5", built, strprintf("%u.%u.%u", major, minor, release),
          library_file(&H5get_libversion), ""};
}

LibraryVersion onednn() {
  const dnnl_version_t* v = dnnl_version();
  return {"oneDNN", strprintf("%d.%d.%d", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH),
          strprintf("%d.%d.%d (%s kernels)", v->major, v->minor, v->patch, onednn_isa().c_str()),
          library_file(&dnnl_version), ""};
}

// The CBLAS: OpenBLAS names its version and the kernels it runs (kernels/host/gemm.h); another
// CBLAS is named by the library it was linked with and the file it came from.
LibraryVersion cblas() {
#if defined(OPENBLAS_VERSION)
  const std::string built = first_line(OPENBLAS_VERSION);  // " OpenBLAS 0.3.21 "
#else
  const std::string built = build::cblas_library;
#endif
  return {"CBLAS", built, cblas_name(), library_file(&cblas_sgemm), ""};
}

LibraryVersion pcre2() {
  char v[64] = "";
  pcre2_config(PCRE2_CONFIG_VERSION, v);  // "10.42 2022-12-11"
  return {"PCRE2", strprintf("%d.%d", PCRE2_MAJOR, PCRE2_MINOR), first_line(v),
          library_file(&pcre2_config_8), ""};
}

Versions ask() {
  Versions v;
  v.version = ZERO3D_VERSION;
  v.commit = build::commit;
  v.commit_date = build::commit_date;
  v.compiler = build::compiler;
  v.build_type = build::build_type;
  v.libraries = {mpi(), hdf5(), onednn(), cblas(), pcre2()};
  v.backends = "host";
#if defined(ZERO3D_HAVE_KOKKOS)
  v.backends += ", kokkos";
  {  // built: the headers' versions; loaded: the core library's file, whose soname carries its version
    const std::string file = kokkos_library_file();
    v.libraries.push_back({"Kokkos", kokkos_version_string(), file.substr(file.rfind('/') + 1), file,
                           "linked statically: no library file"});
  }
#endif
#if defined(ZERO3D_HAVE_CUDA)
  const CudaModuleReport m = cuda_module_report();
  v.backends += m.file.empty() ? strprintf(", cuda (module built with CUDA %s; not loaded: %s)", build::cuda_toolkit,
                                           m.why_not.c_str())
                               : ", cuda (module loaded from " + m.file + ")";
  v.libraries.insert(v.libraries.end(), m.libraries.begin(), m.libraries.end());
#else
  v.backends += " (the CUDA backend is not built in)";
#endif
  return v;
}

}  // namespace

std::vector<std::string> Versions::lines() const {
  std::string head = "zero3d " + version + " (commit " + commit;
  if (!commit_date.empty()) head += " of " + commit_date;
  std::vector<std::string> out{head + "; " + compiler + ", " + build_type + ")", "backends: " + backends};
  for (const LibraryVersion& l : libraries) {
    std::string s = l.name + ":";
    if (!l.built.empty()) s += " built " + l.built + ",";
    if (!l.loaded.empty()) s += " loaded " + l.loaded + (l.from.empty() ? "" : " from " + l.from);
    else s += " not loaded: " + l.why_not;
    out.push_back(s);
  }
  return out;
}

nlohmann::ordered_json Versions::json() const {
  nlohmann::ordered_json libs = nlohmann::ordered_json::object();
  for (const LibraryVersion& l : libraries) {
    nlohmann::ordered_json& e = libs[l.name] = nlohmann::ordered_json::object();
    if (!l.built.empty()) e["built"] = l.built;
    if (!l.loaded.empty()) e["loaded"] = l.loaded;
    if (!l.from.empty()) e["from"] = l.from;
    if (l.loaded.empty()) e["not_loaded"] = l.why_not;
  }
  return {{"zero3d", version},         {"commit", commit},   {"commit_date", commit_date}, {"compiler", compiler},
          {"build_type", build_type}, {"backends", backends}, {"libraries", libs}};
}

const Versions& versions() {
  static const Versions v = ask();
  return v;
}

}  // namespace zero3d
