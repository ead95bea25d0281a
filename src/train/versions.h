// train/versions.h: what this zero3d is and what it runs on, for `zero3d --version` (-V) and the
// run record's "versions" (train/records.cpp). One Versions, two renderings, so they never disagree:
// the version, the commit (asked of git at build time, CMakeLists.txt's zero3d_build_facts), the
// compiler and build type; the backends; and each library as built with and as loaded.
//
// Every "loaded" is asked of the library this process runs, not of its headers: the MPI, HDF5,
// oneDNN and CBLAS that a site's modules or LD_LIBRARY_PATH put in front can differ from the ones
// zero3d was built with, and this is where that shows. The CUDA module is asked only where it
// loads, which is only where an NVIDIA driver is (kernels/cuda_module.cpp): a CPU node never maps
// the CUDA libraries, and says so.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"  // LibraryVersion

namespace zero3d {

struct Versions {
  std::string version;      // "0.1.0"
  std::string commit;       // "54503e4ab12c", "...-dirty" with uncommitted changes, "unknown" outside git
  std::string commit_date;  // the commit's, "2026-12-07"; "" where unknown
  std::string compiler;     // "GNU 12.2.0"
  std::string build_type;   // "Release"
  std::string backends;     // "host, cuda (module built with CUDA 13.0.48; not loaded: no NVIDIA driver ...)"
  std::vector<LibraryVersion> libraries;

  // --version's lines: "zero3d 0.1.0 (commit ..., ...)", "backends: ...", then "NAME: built X, loaded Y
  // from FILE" (or "not loaded: WHY") per library.
  std::vector<std::string> lines() const;
  // The run record's: {"zero3d": ..., "commit": ..., ..., "libraries": {NAME: {"built", "loaded", "from"
  // or "not_loaded"}}}.
  nlohmann::ordered_json json() const;  // in the order of lines()
};

// Asked once per process, then kept. MPI's own answer needs no MPI_Init.
const Versions& versions();

}  // namespace zero3d
