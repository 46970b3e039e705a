// How the SIMT backend runs: thread and block order, strictness, the emulated device's size.
// Set from the command line of a SIMT test binary (main.cpp strips the --simt-* options).
#pragma once

#include <cstdint>
#include <string>

namespace gradzip_simt {

struct settings {
  /// 0: threads, blocks and the order warps resume in follow their indices; otherwise a seed
  /// for a shuffled (but reproducible) order at every scheduling round.
  std::uint64_t shuffle_seed = 0;
  /// Strict barriers: every thread of a block must reach the same __syncthreads (same call
  /// site, none exited), and every lane of a warp operation the same call site.
  bool strict = false;
  /// The emulated device: multiprocessors (what grid-stride launches size their grid from)
  /// and the largest grid.x a launch may ask for.
  int sm_count = 4;
  unsigned max_grid_x = 0x7FFFFFFFu;
  /// What cudaOccupancyMaxActiveBlocksPerMultiprocessor answers for every kernel (the backend
  /// knows no registers): with sm_count, the largest cooperative grid.
  int blocks_per_sm = 2;
  /// The most blocks a cooperative launch may have (0: sm_count x blocks_per_sm): fewer, as an MPS
  /// client with an active-thread percentage sees, makes a launch the occupancy allows fail.
  unsigned max_cooperative_blocks = 0;
  /// What cudaDevAttrCooperativeLaunch answers: false models a device (or a virtualized share of
  /// one) without cooperative launches, where every cooperative launch fails with
  /// cudaErrorNotSupported.
  bool cooperative_launch = true;
  /// A fault ends the launch with cudaErrorLaunchFailure (returned by the next synchronizing
  /// call, its message kept for take_fault) instead of aborting: for the backend's own tests.
  bool expect_faults = false;
  /// Print every kernel launched (with its launch count) when the process exits: which kernels
  /// the tests execute, and which they never reach.
  bool list_kernels = false;
  /// When not empty: at exit, write each kernel launched to this file, one line per kernel:
  /// its mangled name, the most threads per block and bytes of dynamic shared memory any launch
  /// asked for, and its cudaFuncAttributeMaxDynamicSharedMemorySize (-1: never set). What the
  /// backend cannot check, tools/check_kernels.py does with it: threads within the kernel's
  /// __launch_bounds__, static plus dynamic shared memory within each architecture's limit.
  std::string record_launches;
};

settings& config();

/// The message of the last fault under expect_faults (empty if none), and clears it.
std::string take_fault();

/// Applies and removes the --simt-* options of argv; returns the new argc. Options:
///   --simt-shuffle=SEED  --simt-strict  --simt-sm-count=N  --simt-max-grid=N  --simt-blocks-per-sm=N
///   --simt-max-cooperative=N  --simt-no-cooperative  --simt-list-kernels  --simt-record-launches=FILE
int parse_options(int argc, char** argv);

/// Cooperative launches the backend has declined (cudaErrorNotSupported or
/// cudaErrorCooperativeLaunchTooLarge) since the process began: whether a caller tried one.
std::uint64_t declined_cooperative_launches();

/// How often the host has waited for device work since the process began: synchronizations of
/// the device, a stream or an event (queries included), blocking copies and cudaFree. Tests
/// count them to show that a path does not wait per rank or per tensor.
std::uint64_t host_waits();

/// Launches the backend accepted (enqueued) since the process began, of every kernel whose
/// demangled name contains `part` (e.g. "validate_kernel<"): tests count them to show that a path
/// runs a pass once.
std::uint64_t launches_of(const std::string& part);

/// Device memory allocated and not yet freed, in bytes (leak checks in tests).
std::size_t live_device_bytes();

}  // namespace gradzip_simt
