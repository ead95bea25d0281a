# tests/cross/aarch64.cmake: CMake toolchain for Debian's aarch64 cross compiler
# (g++-aarch64-linux-gnu) against an arm64 sysroot that tests/cross/aarch64.sh unpacks.
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=tests/cross/aarch64.cmake -DZERO3D_CUDA=OFF
# The sysroot is ZERO3D_ARM64_SYSROOT (default /opt/arm64-sysroot), in Debian's multiarch layout.
# Programs (pkg-config, mpiexec) are this machine's; headers, libraries and CMake packages come
# only from the sysroot. Built programs run through qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(NOT ZERO3D_ARM64_SYSROOT)
  set(ZERO3D_ARM64_SYSROOT "$ENV{ZERO3D_ARM64_SYSROOT}")
endif()
if(NOT ZERO3D_ARM64_SYSROOT)
  set(ZERO3D_ARM64_SYSROOT /opt/arm64-sysroot)
endif()
set(ZERO3D_ARM64_SYSROOT "${ZERO3D_ARM64_SYSROOT}" CACHE PATH "The arm64 sysroot (tests/cross/aarch64.sh)")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ZERO3D_ARM64_SYSROOT)
set(CMAKE_SYSROOT "${ZERO3D_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# The test binaries run through qemu (ctest and gtest_discover_tests alike).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L "${ZERO3D_ARM64_SYSROOT}")

# pkg-config (FindMPI's way when there is no wrapper) reads the sysroot's .pc files.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${ZERO3D_ARM64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR} "${ZERO3D_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${ZERO3D_ARM64_SYSROOT}/usr/share/pkgconfig")

# MPI and HDF5 are found through their compiler wrappers on a native build: this machine's
# would name its own (x86) libraries, and the sysroot's are arm64 programs. No wrappers: MPI
# through pkg-config, HDF5 under Debian's directory for the Open MPI build.
set(MPI_C_COMPILER "" CACHE FILEPATH "no wrapper: MPI through pkg-config")
set(HDF5_C_COMPILER_EXECUTABLE "" CACHE FILEPATH "no wrapper: HDF5_ROOT below")
set(HDF5_NO_FIND_PACKAGE_CONFIG_FILE ON CACHE BOOL "")
set(HDF5_ROOT /usr/lib/aarch64-linux-gnu/hdf5/openmpi)
