// core/check.h: one sink for every library's failure codes, and the user-error type.
// A failed MPI/HDF5/CUDA/cuBLAS/NCCL call is a bug or a broken machine: fatal() prints the
// statement, rank, host, file and line and calls MPI_Abort, because exit() on one rank leaves the
// others hung in their next collective. A user mistake (config, file, layout) is a UserError:
// main prints one line and exits with kExitUserError on every rank.
#pragma once
#include <stdexcept>
#include <string>

namespace zero3d {

constexpr int kExitUserError = 2;
constexpr int kExitWatchdog = 3;      // a collective did not complete within comm_timeout_s (MPI_Abort)
constexpr int kExitInconsistent = 4;  // replicas of a parameter differ across the dp group
constexpr int kExitLossScale = 5;     // fp16 overflow at fp16.min_loss_scale (DeepSpeed's "cannot decrease scale")
constexpr int kExitStopped = 6;       // stopped early on SIGUSR1/SIGTERM after a committed checkpoint: resume it
constexpr int kExitCheckpointFailed = 7;  // a checkpoint could not be written (disk full, I/O error): the last
                                          // committed one is intact; fix the storage and resume it
constexpr int kExitSwapFailed = 8;    // offloaded state could not be read or written (I/O error, swap file
                                      // truncated): the last committed checkpoint is intact; resume it
constexpr int kExitDiverged = 9;      // max_nonfinite_steps steps in a row with a non-finite loss or gradient
                                      // norm (or the last step's loss): no checkpoint of that state is written
constexpr int kExitReadFailed = 10;   // a checkpoint could not be read: an I/O error (after retries), not a bad
                                      // file; no older one is tried; run again when the storage reads
constexpr int kExitInterrupted = 130;  // a command other than train stopped by SIGINT/SIGTERM (the shell's
                                       // 128 + SIGINT): what it was writing is removed; run it again

[[noreturn]] void fatal(const char* library, const std::string& message, const char* statement,
                        const char* file, int line);

// A failure that one rank finds in the middle of a run (a file changed under it), where the others
// cannot agree on it: one line naming the rank, then MPI_Abort with exit_code.
[[noreturn]] void abort_job(const std::string& message, int exit_code);

// MPI_Abort(MPI_COMM_WORLD, exit_code) for a job whose cause is already printed in zero3d's words:
// without OpenMPI's banner, whose message to mpirun races the abort itself (mpirun then prints
// ORTE_ERROR_LOG: Data unpack would read past end of buffer, in 1 of 5 aborts on this machine).
[[noreturn]] void abort_mpi_job(int exit_code);

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure of the run that every rank detects alike (so no MPI_Abort is needed), with its exit code.
struct RunError : std::runtime_error {
  RunError(const std::string& what, int exit_code) : std::runtime_error(what), code(exit_code) {}
  int code;
};

// printf-style std::string
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace zero3d

// Z3D_CHECK_GEN(library, statement, ok-expression of `status`, message-expression of `status`)
#define Z3D_CHECK_GEN(lib, stmt, ok, msg)                                  \
  do {                                                                     \
    auto status = (stmt);                                                  \
    if (!(ok)) ::zero3d::fatal(lib, (msg), #stmt, __FILE__, __LINE__);     \
  } while (0)

#define MPI_CHECK(stmt) Z3D_CHECK_GEN("MPI", stmt, status == MPI_SUCCESS, ::zero3d::mpi_error_string(status))
#define HDF5_CHECK(stmt) Z3D_CHECK_GEN("HDF5", stmt, status >= 0, "negative status (see the HDF5 error stack above)")
#define Z3D_ASSERT(cond, msg) Z3D_CHECK_GEN("zero3d", static_cast<bool>(cond), status, msg)

namespace zero3d {
std::string mpi_error_string(int code);

// This machine's name, for messages that say where something happened ("?" when unknown).
std::string host_name();
}
