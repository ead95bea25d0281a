// core/install_dirs.h: where this binary's own files are, found from the binary's location
// (/proc/self/exe), never from the working directory, so a zero3d on PATH works from anywhere.
// Two layouts, told apart by where the binary runs from (not by which files happen to exist):
// - the build tree (build/bin/zero3d, the folder it was built into): the presets are the source
//   tree's (input/, jobscripts/, ...) and the CUDA module is build/lib/libzero3d_cuda.so;
// - anywhere else (an installed tree, `cmake --install --prefix P`, the .deb's /usr): the paths
//   from the bin dir to <datadir>/zero3d and <libdir>/zero3d, fixed at configure time as relative
//   paths (GNUInstallDirs: P/share/zero3d, P/lib/zero3d or P/lib/x86_64-linux-gnu/zero3d), so the
//   tree works under whatever prefix it is installed or unpacked to.
#pragma once
#include <string>

namespace zero3d {

// The folder of the running executable; "" when /proc/self/exe cannot be read.
std::string exe_dir();
// The tree the presets live in: its input/ (configs, machines/, data/), jobscripts/, postprocess/.
// The source tree from the build tree, <prefix>/share/zero3d installed; "" when unknown.
std::string data_dir();
// The folder the CUDA module (libzero3d_cuda.so) is in: build/lib, or <prefix>/<libdir>/zero3d.
std::string cuda_module_dir();

}  // namespace zero3d
